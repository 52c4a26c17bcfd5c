"""Privacy mathematics: accounting modes, capacities, demand curves (pure, no I/O)."""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module that defines it. Imported on first use, so that code that needs
#: only accounting (the ledger's read path, ``privsched list``) never builds the mechanisms'
#: pydantic models or loads the subsampled-Gaussian accountant (issue 16).
_NAMES = {
    "DEFAULT_ALPHAS": "accounting",
    "Accounting": "accounting",
    "leq": "accounting",
    "block_capacity": "capacity",
    "rdp_capacity": "capacity",
    "validate_epsilon_delta": "capacity",
    "analytic_gaussian_sigma": "curves",
    "gaussian_curve": "curves",
    "gaussian_delta": "curves",
    "gaussian_sigma": "curves",
    "laplace_curve": "curves",
    "pure_dp_curve": "curves",
    "rdp_to_epsilon": "curves",
    "discrete_gaussian_delta": "discrete_gaussian",
    "discrete_gaussian_sigma": "discrete_gaussian",
    "Composed": "mechanisms",
    "EpsilonDelta": "mechanisms",
    "Explicit": "mechanisms",
    "Gaussian": "mechanisms",
    "Laplace": "mechanisms",
    "Mechanism": "mechanisms",
    "SubsampledGaussian": "mechanisms",
    "demand_vector": "mechanisms",
    "mechanism_json": "mechanisms",
    "parse_mechanism": "mechanisms",
    "calibrate_noise_multiplier": "sgm",
    "subsampled_gaussian_curve": "sgm",
}


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'privsched.budgets' has no attribute {name!r}")
    return getattr(importlib.import_module(f"privsched.budgets.{module}"), name)


__all__ = [
    "DEFAULT_ALPHAS",
    "Accounting",
    "Composed",
    "EpsilonDelta",
    "Explicit",
    "Gaussian",
    "Laplace",
    "Mechanism",
    "SubsampledGaussian",
    "analytic_gaussian_sigma",
    "block_capacity",
    "calibrate_noise_multiplier",
    "demand_vector",
    "discrete_gaussian_delta",
    "discrete_gaussian_sigma",
    "gaussian_curve",
    "gaussian_delta",
    "gaussian_sigma",
    "laplace_curve",
    "leq",
    "mechanism_json",
    "parse_mechanism",
    "pure_dp_curve",
    "rdp_capacity",
    "rdp_to_epsilon",
    "subsampled_gaussian_curve",
    "validate_epsilon_delta",
]

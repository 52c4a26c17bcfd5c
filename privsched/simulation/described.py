"""Demand vectors of plainly valid mechanism descriptions, computed without the models.

A generated workload's mechanism descriptions are written by its generator from public
parameters, a few hundred of them; importing pydantic and building the mechanism models of
:mod:`privsched.budgets.mechanisms` to read them costs more than generating the workload
(about 0.25 s). :func:`described_vector` reads a description as JSON values, applies to
each field the check its model field applies (:func:`~privsched.budgets.bounds.check_number`
with the bounds of :mod:`privsched.budgets.fields`, the same defaults) and computes the
vector with the curve functions :func:`~privsched.budgets.mechanisms.demand_vector` calls,
in the same operations, so the vector is the same to the bit (tests/test_sim_described.py).
Whatever it does not read as plainly valid (an ``explicit`` or unknown kind, a missing or
extra field, a value a check refuses, a mechanism the accounting has no vector for) gives
``None``, and the caller parses the description with the models, which raise their usual
one-line error.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import (
    MAX_EPSILON,
    MAX_NOISE,
    MAX_PARTS,
    MAX_SENSITIVITY,
    MAX_STEPS,
    MIN_EPSILON,
    MIN_NOISE,
    MIN_SAMPLE_RATE,
    MIN_SENSITIVITY,
    check_delta,
    check_number,
)
from privsched.budgets.curves import gaussian_curve, laplace_curve, pure_dp_curve

#: Each kind read here: its required fields, and its optional ones with their defaults.
_FIELDS: dict[str, tuple[frozenset[str], dict[str, Any]]] = {
    "epsilon_delta": (frozenset({"epsilon"}), {"delta": 0.0}),
    "gaussian": (frozenset({"sigma"}), {"sensitivity": 1.0}),
    "laplace": (frozenset({"scale"}), {"sensitivity": 1.0}),
    "subsampled_gaussian": (frozenset({"sample_rate", "noise_multiplier", "steps"}), {}),
    "composed": (frozenset({"parts"}), {}),
}


class _NotPlain(Exception):
    """The description is not one this module reads: the models decide."""


def described_vector(description: str, accounting: Accounting) -> np.ndarray | None:
    """The vector :func:`~privsched.budgets.mechanisms.demand_vector` gives the mechanism
    described by ``description`` (JSON text), or ``None`` where only the models can tell."""
    try:
        return _vector(json.loads(description), accounting)
    except (_NotPlain, ValueError, TypeError, RecursionError):
        return None


def _fields(data: Any) -> tuple[str, dict[str, Any]]:
    """The description's kind and its fields, defaults filled in; exactly the model's fields."""
    if not isinstance(data, dict) or data.get("kind") not in _FIELDS:
        raise _NotPlain
    required, optional = _FIELDS[data["kind"]]
    given = set(data) - {"kind"}
    if not required <= given or not given <= required | set(optional):
        raise _NotPlain
    return data["kind"], {**optional, **data}


def _vector(data: Any, accounting: Accounting) -> np.ndarray:
    """Check one description's fields as its model does and compute its vector as
    :func:`~privsched.budgets.mechanisms.demand_vector` does, case by case."""
    kind, f = _fields(data)
    if kind == "composed":
        parts = f["parts"]
        if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_PARTS:
            raise _NotPlain
        return np.sum([_vector(part, accounting) for part in parts], axis=0)
    if kind == "epsilon_delta":
        epsilon, delta = check_number(f["epsilon"], "", MIN_EPSILON, MAX_EPSILON), check_delta(f["delta"])
        if not accounting.is_rdp:
            return np.array([epsilon, delta])
        if delta > 0:
            raise _NotPlain  # no RDP curve: the models' error
        return pure_dp_curve(epsilon, accounting.alphas)
    if kind == "laplace":
        scale, sensitivity = _noise(f["scale"]), _sensitivity(f["sensitivity"])
        if not accounting.is_rdp:
            return np.array([sensitivity / scale, 0.0])
        return laplace_curve(scale, accounting.alphas, sensitivity)
    if not accounting.is_rdp:
        raise _NotPlain  # a Gaussian or DP-SGD plan has no basic cost: the models' error
    if kind == "gaussian":
        return gaussian_curve(_noise(f["sigma"]), accounting.alphas, _sensitivity(f["sensitivity"]))
    sample_rate = check_number(f["sample_rate"], "", MIN_SAMPLE_RATE, 1.0)
    noise, steps = _noise(f["noise_multiplier"]), check_number(f["steps"], "", 0, MAX_STEPS, integer=True)
    return subsampled_gaussian_step(sample_rate, noise, accounting.alphas) * steps


def _noise(value: Any) -> float:
    return check_number(value, "", MIN_NOISE, MAX_NOISE)


def _sensitivity(value: Any) -> float:
    return check_number(value, "", MIN_SENSITIVITY, MAX_SENSITIVITY)


@lru_cache(maxsize=1024)
def subsampled_gaussian_step(sample_rate: float, noise_multiplier: float, alphas: tuple[float, ...]) -> np.ndarray:
    """RDP curve of one Poisson-subsampled Gaussian step (Mironov, Talwar & Zhang 2019, §3.3),
    computed once per (q, σ): T steps cost T times one (Mironov 2017, Prop. 1), which is how
    :func:`~privsched.budgets.sgm.subsampled_gaussian_curve` computes T steps, so the product
    is its vector."""
    from privsched.budgets.sgm import subsampled_gaussian_curve

    return subsampled_gaussian_curve(sample_rate, noise_multiplier, 1, alphas)

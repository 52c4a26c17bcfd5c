"""Privacy mathematics: accounting modes, capacities, demand curves (pure, no I/O)."""

from privsched.budgets.accounting import DEFAULT_ALPHAS, Accounting, leq
from privsched.budgets.capacity import block_capacity, rdp_capacity, validate_epsilon_delta
from privsched.budgets.curves import (
    analytic_gaussian_sigma,
    gaussian_curve,
    gaussian_delta,
    gaussian_sigma,
    laplace_curve,
    pure_dp_curve,
    rdp_to_epsilon,
)
from privsched.budgets.mechanisms import (
    Composed,
    EpsilonDelta,
    Explicit,
    Gaussian,
    Laplace,
    Mechanism,
    SubsampledGaussian,
    demand_vector,
    mechanism_json,
    parse_mechanism,
)
from privsched.budgets.sgm import calibrate_noise_multiplier, subsampled_gaussian_curve

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

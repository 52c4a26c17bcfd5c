"""The DP-SGD plan a code job's supervisor charges before the job trains (``ctx.dp_sgd``).

A plan is Poisson sampling at rate q for ``steps = ⌈E/q⌉`` steps (Opacus' 1/q steps per
epoch) with noise multiplier σ: the subsampled Gaussian mechanism (Abadi et al. 2016), whose
RDP is Mironov, Talwar & Zhang 2019 (:func:`privsched.budgets.sgm.subsampled_gaussian_curve`).
σ comes from what is left of the job's grant, in the dataset's accounting:

- an ``epsilon`` given: σ is Opacus' ``make_private_with_epsilon`` calibration for
  (ε, δ) under its RDP accountant (:func:`~privsched.budgets.sgm.calibrate_noise_multiplier`,
  within 1 % of ε, never above); an ε above the pipeline's is refused;
- no ``epsilon`` (the whole grant): under basic accounting the ε that is left;
- under RDP, σ is moreover at least the smallest σ found by bisection whose curve fits
  under what is left at **every** order (the grant is a curve, and a job's spend must stay
  within it at every order).

The charge is the plan's own cost: its curve under RDP, and under basic accounting the
(ε, δ) that Opacus' RDP accountant reports for it (Balle et al. 2020, Thm 21), at most the
ε asked for; that ε at the job's δ is the plan's ``epsilon``, which the job reports as the ε
it used (an elastic grant's too: the plan fits what is left of the grant, whatever its
size). A plan that does not fit what is left is refused with one line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import MAX_STEPS, MIN_SAMPLE_RATE
from privsched.budgets.sgm import (
    MAX_NOISE_MULTIPLIER,
    calibrate_noise_multiplier,
    subsampled_gaussian_curve,
    subsampled_gaussian_epsilon,
)

#: Relative precision of σ found by bisection (Opacus calibrates ε to 1 %).
TOLERANCE = 0.01


@dataclass(frozen=True)
class TrainingPlan:
    """What a DP-SGD training may do, and what it is charged."""

    sample_rate: float  # q, the Poisson sampling rate of every step
    noise_multiplier: float  # σ of every step
    steps: int  # noisy steps
    charge: np.ndarray  # the plan's cost in the dataset's accounting
    epsilon: float  # the ε at the job's δ the plan's steps imply (Opacus' RDP accountant)

    def to_dict(self) -> dict:
        return {
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "steps": self.steps,
            "charge": self.charge.tolist(),
            "epsilon": self.epsilon,
        }


def planned_steps(sample_rate: float, epochs: float) -> int:
    """⌈E/q⌉ noisy steps (at least 1); a rate or a number of steps out of range raises."""
    if not (MIN_SAMPLE_RATE <= sample_rate <= 1.0):
        raise ValueError(f"sample_rate must be in [{MIN_SAMPLE_RATE:g}, 1], got {sample_rate!r}")
    if not (math.isfinite(epochs) and epochs > 0):
        raise ValueError(f"epochs must be positive, got {epochs!r}")
    steps = max(1, math.ceil(epochs / sample_rate - 1e-9))
    if steps > MAX_STEPS:
        raise ValueError(f"{epochs:g} epochs at sample rate {sample_rate:g} is more than {MAX_STEPS} noisy steps")
    return steps


def fit_noise_multiplier(sample_rate: float, steps: int, budget: np.ndarray, alphas: Sequence[float] | np.ndarray) -> float:
    """The smallest σ, to :data:`TOLERANCE` (keeping the end that fits), whose
    ``steps``-step curve is at most ``budget`` at every order of ``alphas``. The curve
    falls at every order as σ grows (MTZ 2019), so a doubling then a bisection finds it."""
    if np.any(budget <= 0):
        raise ValueError("nothing is left of the grant at some order: no DP-SGD plan fits")

    def fits(sigma: float) -> bool:
        return bool(np.all(subsampled_gaussian_curve(sample_rate, sigma, steps, alphas) <= budget))

    high = 0.5
    while not fits(high):
        high *= 2
        if high > MAX_NOISE_MULTIPLIER:
            raise ValueError(f"no noise level fits {steps} steps at sample rate {sample_rate:g} in what is left of the grant")
    low = 0.0
    while high - low > TOLERANCE * high:
        middle = (low + high) / 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high


def plan_training(
    sample_rate: float,
    epochs: float,
    epsilon: float | None,
    delta: float,
    left: np.ndarray,
    accounting: Accounting,
    granted_epsilon: float | None = None,
) -> TrainingPlan:
    """The plan of the module docstring for what is ``left`` of a grant given for
    ``granted_epsilon`` (None: a mechanism was declared). Raises a one-line ``ValueError``
    when the plan would not fit."""
    steps = planned_steps(sample_rate, epochs)
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be positive, got {epsilon!r}")
    if epsilon is not None and granted_epsilon is not None and epsilon > granted_epsilon:
        raise ValueError(f"epsilon {epsilon:g} is above the pipeline's grant of {granted_epsilon:g}")
    if accounting.is_rdp:
        sigma = fit_noise_multiplier(sample_rate, steps, left, accounting.alphas)
        if epsilon is not None:
            sigma = max(sigma, calibrate_noise_multiplier(sample_rate, steps, epsilon, delta, tolerance=TOLERANCE))
        charge = subsampled_gaussian_curve(sample_rate, sigma, steps, accounting.alphas)
        if not np.all(charge <= left):  # the fit keeps it within; checked where it is charged
            raise ValueError("the DP-SGD plan is more than what is left of the grant")
        return TrainingPlan(sample_rate, sigma, steps, charge, subsampled_gaussian_epsilon(sample_rate, sigma, steps, delta))
    epsilon_left, delta_left = float(left[0]), float(left[1])
    target = epsilon_left if epsilon is None else epsilon
    if target > epsilon_left or delta > delta_left or target <= 0:
        raise ValueError(f"epsilon {target:g} at delta {delta:g} is more than what is left of the grant ({epsilon_left:g}, {delta_left:g})")
    sigma = calibrate_noise_multiplier(sample_rate, steps, target, delta, tolerance=TOLERANCE)
    spent = subsampled_gaussian_epsilon(sample_rate, sigma, steps, delta)
    return TrainingPlan(sample_rate, sigma, steps, np.array([spent, delta]), spent)

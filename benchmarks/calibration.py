"""DP-SGD noise calibration: orders skipped by their bounds against the whole curve at every step.

Both run Opacus' ``get_noise_multiplier`` search (double σ from 20, then bisect to 1 % of ε);
the baseline computes the subsampled-Gaussian curve at all 151 of Opacus' orders at each σ
and converts it (what ``privsched.budgets.sgm.calibrate_noise_multiplier`` did before),
the new search computes only the orders that can give the minimum
(``privsched.budgets.sgm._epsilon_and_order``). Both in this process, alternating, caches
cleared before each run; the table gives the median CPU time of ``--repeats`` runs, their
ratio, and checks that the two σ are the same float.

    .venv/bin/python benchmarks/calibration.py
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from privsched.budgets import sgm
from privsched.budgets.curves import rdp_to_epsilon

#: (sample rate q, steps, ε, δ): the benchmark's DP-SGD pipeline (`benchmarks/cli.py`, 90 % of ε = 1 for training), and
#: the calibration cases of tests/test_budgets_sgm.py.
CASES = [(0.05, 40, 0.9, 1e-9), (0.02, 150, 1.0, 1e-6), (0.2, 10, 3.0, 1e-5), (0.1, 300, 8.0, 1e-7), (0.001, 10_000, 5.0, 1e-6)]


def whole_curve_calibration(q: float, steps: int, epsilon: float, delta: float, tolerance: float = 0.01) -> float:
    """The same search, each ε from the curve at every order."""

    def spent(sigma: float) -> float:
        curve = sgm.subsampled_gaussian_curve(q, sigma, steps, sgm.CALIBRATION_ALPHAS)
        return rdp_to_epsilon(curve, sgm.CALIBRATION_ALPHAS, delta)[0]

    low, high, eps_high = 0.0, 10.0, math.inf
    while eps_high > epsilon:
        high = 2 * high
        eps_high = spent(high)
    while epsilon - eps_high > tolerance * epsilon:
        middle = (low + high) / 2
        eps_middle = spent(middle)
        high, eps_high, low = (middle, eps_middle, low) if eps_middle < epsilon else (high, eps_high, middle)
    return high


def cpu_seconds(run, case) -> tuple[float, float]:
    """CPU time of one calibration from empty caches, and its σ."""
    sgm.calibrate_noise_multiplier.cache_clear()
    sgm._binomial_row.cache_clear()
    sgm._log_binomials.cache_clear()
    start = time.process_time()
    sigma = run(*case)
    return time.process_time() - start, sigma


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| q | steps | ε | δ | whole curve CPU ms | skipping orders CPU ms | ratio | same σ |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for case in CASES:
        before, after = [], []
        for _ in range(args.repeats):
            seconds, sigma_before = cpu_seconds(whole_curve_calibration, case)
            before.append(seconds)
            seconds, sigma_after = cpu_seconds(sgm.calibrate_noise_multiplier, case)
            after.append(seconds)
        old, new = statistics.median(before) * 1e3, statistics.median(after) * 1e3
        q, steps, epsilon, delta = case
        print(f"| {q:g} | {steps} | {epsilon:g} | {delta:g} | {old:.1f} | {new:.1f} | {new / old:.2f} | {sigma_before == sigma_after} |")


if __name__ == "__main__":
    main()

"""Built-in job kinds the scheduler can plan and run without user code.

:func:`plan_mechanism` turns a job's parameters into its privacy demand at submit time;
:func:`run_builtin` runs a granted job inside its :class:`~privsched.jobs.context.JobContext`
(reading only granted blocks) and reports the budget it actually spent (docs/design.md §4.4).
Training code (torch, Opacus) is imported only when a job runs.
"""

from __future__ import annotations

from privsched.budgets.accounting import Accounting
from privsched.budgets.capacity import validate_epsilon_delta
from privsched.budgets.mechanisms import Mechanism, mechanism_json
from privsched.jobs.context import JobContext
from privsched.trainers.plans import (
    DPSGDJob,
    accuracy_epsilon,
    calibrate_noise,
    dpsgd_mechanism,
    parse_job,
    split_params,
    statistic_mechanism,
    training_epsilon,
)

BUILTIN_KINDS: tuple[str, ...] = ("dpsgd", "statistic")


def plan_mechanism(job: dict, epsilon: float, delta: float, accounting: Accounting) -> Mechanism:
    """The privacy demand of a built-in job, as a mechanism description.

    dpsgd: ``steps = ceil(E / q)``, σ calibrated as Opacus' ``get_noise_multiplier`` does (RDP) for the
    training's (ε − ε_acc, δ); charged as ``SubsampledGaussian(q, σ, steps)`` under RDP,
    ``EpsilonDelta(ε − ε_acc, δ)`` under basic, composed with the ε_acc-DP held-out accuracy.
    statistic: Laplace or Gaussian noise scaled to the query's sensitivity, a mean composing
    a sum and a count. Bad parameters raise a one-line ``ValueError``.
    """
    validate_epsilon_delta(epsilon, delta)
    spec = parse_job(job)
    if isinstance(spec, DPSGDJob):
        sigma = calibrate_noise(spec.sample_rate, spec.steps, training_epsilon(epsilon), delta)
        return dpsgd_mechanism(spec, sigma, epsilon, delta, accounting)
    return statistic_mechanism(spec, epsilon, delta, accounting)


def run_builtin(ctx: JobContext) -> None:
    """Run the built-in job in ``ctx.params`` and report metrics and the budget spent.

    ``ctx.params`` is the job dict plus ``epsilon``, ``delta`` (None reads as 0) and, when
    the ledger charged it, ``mechanism``; a charged mechanism that differs from the job's plan is an error.
    """
    params = ctx.params
    spec = parse_job(params)
    _, charged = split_params(params)
    if params.get("epsilon") is None:
        raise ValueError("a built-in job needs the epsilon (and delta) it was planned with")
    epsilon, delta = float(params["epsilon"]), float(params.get("delta") or 0.0)
    validate_epsilon_delta(epsilon, delta)
    if isinstance(spec, DPSGDJob):
        sigma = calibrate_noise(spec.sample_rate, spec.steps, training_epsilon(epsilon), delta)
        _check_charged(charged, dpsgd_mechanism(spec, sigma, epsilon, delta, ctx.accounting))
        from privsched.trainers.dpsgd import run_dpsgd

        run_dpsgd(ctx, spec, sigma, delta, accuracy_epsilon(epsilon))
    else:
        mechanism = statistic_mechanism(spec, epsilon, delta, ctx.accounting)
        _check_charged(charged, mechanism)
        from privsched.trainers.statistics import run_statistic

        run_statistic(ctx, spec, mechanism)


def _check_charged(charged: Mechanism | None, planned: Mechanism) -> None:
    if charged is not None and charged != planned:
        raise ValueError(
            f"the charged mechanism {mechanism_json(charged)} is not the job's plan {mechanism_json(planned)}"
        )

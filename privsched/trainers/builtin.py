"""Built-in job kinds the scheduler can plan and run without user code.

:func:`plan_mechanism` turns a job's parameters into its privacy demand at submit time;
:func:`run_builtin` runs a granted job inside its :class:`~privsched.jobs.context.JobContext`
(reading only granted blocks) with the mechanism the ledger charged (``ctx.plan``), and
reports the budget it actually spent (docs/design.md §4.4). The job runner reaches it by
the import path :data:`privsched.jobs.runner.BUILTIN_JOB`. Training code (torch, Opacus) is
imported only when a job runs.
"""

from __future__ import annotations

from privsched.budgets.accounting import Accounting
from privsched.budgets.capacity import validate_epsilon_delta
from privsched.budgets.mechanisms import Mechanism
from privsched.jobs.context import JobContext
from privsched.statistics.queries import statistic_mechanism
from privsched.trainers.layers import LayerModel
from privsched.trainers.plans import (
    DPSGDJob,
    calibrate_noise,
    charged_plan,
    dpsgd_mechanism,
    parse_job,
    training_epsilon,
)

BUILTIN_KINDS: tuple[str, ...] = ("dpsgd", "statistic")


def plan_mechanism(job: dict, epsilon: float, delta: float, accounting: Accounting, max_rows_per_user: int = 1) -> Mechanism:
    """The privacy demand of a built-in job, as a mechanism description.

    dpsgd: ``steps = ceil(E / q)``, σ calibrated as Opacus' ``get_noise_multiplier`` does (RDP) for the
    training's (ε − ε_acc, δ); charged as ``SubsampledGaussian(q, σ, steps)`` under RDP,
    ``EpsilonDelta(ε − ε_acc, δ)`` under basic, composed with the ε_acc-DP held-out accuracy.
    statistic: Laplace or Gaussian noise scaled to the query's sensitivity, a mean composing
    a sum and a count, at the sensitivity of a person's ``max_rows_per_user`` rows (the
    dataset's contribution bound K; 1 at event level). Bad parameters raise a one-line
    ``ValueError``.
    """
    validate_epsilon_delta(epsilon, delta)
    spec = parse_job(job)
    if isinstance(spec, DPSGDJob):
        check_layers(spec)
        sigma = calibrate_noise(spec.sample_rate, spec.steps, training_epsilon(epsilon), delta)
        return dpsgd_mechanism(spec, sigma, epsilon, delta, accounting)
    return statistic_mechanism(spec, epsilon, delta, accounting, max_rows_per_user)


def check_layers(job: DPSGDJob) -> None:
    """Build a layer-list model at submit, where its sizes are known from the job alone, so
    that a model that cannot be built or made private (Opacus' ``ModuleValidator``) is
    refused with one line (torch is imported for layer lists only). A tabular model whose
    features the dataset declares is checked when its job starts."""
    if not isinstance(job.model, LayerModel):
        return
    from privsched.trainers.dpsgd import shape_only

    try:
        data = shape_only(job)
    except ValueError:
        return  # sized by the dataset's declarations: built when the job starts
    from privsched.trainers.dpsgd import initial_model

    initial_model(job, data)


def run_builtin(ctx: JobContext) -> None:
    """Run the built-in job ``ctx.params`` describes (its ``kind`` and parameters) with the
    noise of the mechanism it was charged, ``ctx.plan`` (after an elastic grant of less, of
    :func:`granted_mechanism`), and report metrics (``epsilon_used``, ``delta_used``: the (ε, δ)
    its noise was calibrated to) and the budget spent. The grant holds that mechanism's own
    curve (a demand below it is refused at submit; an elastic one is calibrated to fit), so
    the job takes σ, its steps or its statistic's noise from it as they are."""
    if ctx.plan is None:
        raise ValueError("a built-in job runs only with the mechanism it was charged, and its context has none")
    spec = parse_job(ctx.params)
    epsilon, mechanism = granted_mechanism(ctx)
    if isinstance(spec, DPSGDJob):
        plan = charged_plan(spec, mechanism, ctx.delta)
        from privsched.trainers.dpsgd import run_dpsgd

        if ctx.workers > 1 and ctx.rendezvous is not None:  # one rank of several across nodes
            from privsched.trainers.distributed import GroupRanks, check_parallel

            with GroupRanks(ctx) as group:
                if group.rank == 0:
                    check_parallel(spec, ctx)
                    run_dpsgd(ctx, spec, plan, group)
                else:
                    group.serve()
        elif ctx.workers > 1:  # data-parallel: the other processes are forked before any torch work
            from privsched.trainers.distributed import Ranks, check_parallel

            with Ranks.start(ctx.workers, ctx.device) as ranks:
                check_parallel(spec, ctx)
                run_dpsgd(ctx, spec, plan, ranks)
        else:
            run_dpsgd(ctx, spec, plan)
    else:
        from privsched.trainers.statistics import run_statistic

        run_statistic(ctx, spec, mechanism)
    if epsilon is not None:  # the ε its noise was calibrated to, at the pipeline's δ
        ctx.report_metrics(epsilon_used=epsilon, delta_used=ctx.delta)


def granted_mechanism(ctx: JobContext) -> tuple[float | None, Mechanism]:
    """The ε a built-in job runs at and its mechanism: the charged plan at the pipeline's ε
    when the grant holds its whole curve; after an elastic grant of less, the plan at the
    largest ε of the range whose curve fits the grant at every order
    (:func:`privsched.budgets.elastic.calibrate`; docs/privacy.md, "Elastic demands").
    Raises ``ValueError`` if the grant holds neither."""
    from privsched.budgets.elastic import calibrate
    from privsched.budgets.mechanisms import demand_vector

    assert ctx.plan is not None  # run_builtin checked
    if ctx.epsilon_min is None or ctx.epsilon is None:
        return ctx.epsilon, ctx.plan

    def plan(epsilon: float) -> Mechanism:
        return plan_mechanism(ctx.params, epsilon, ctx.delta, ctx.accounting, ctx.max_rows_per_user)

    return calibrate(plan, lambda m: demand_vector(m, ctx.accounting), ctx.epsilon_min, ctx.epsilon, ctx.budget)

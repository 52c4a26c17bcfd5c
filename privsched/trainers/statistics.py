"""The built-in ``statistic`` job ("mice", docs/design.md §5.2): a count, sum, mean or
histogram of the granted blocks' records, released with the noise of the mechanism the
ledger charged (:mod:`privsched.statistics.release`). Before anything is computed the
charged demand is checked against the grant: a release happens only after it passes.
"""

from __future__ import annotations

import json

import numpy as np

from privsched.budgets.accounting import leq
from privsched.budgets.mechanisms import Mechanism, demand_vector
from privsched.jobs.context import JobContext
from privsched.jobs.records import column, load_blocks
from privsched.statistics.queries import StatisticJob
from privsched.statistics.release import dp_statistic


def rows_per_person(ctx: JobContext) -> int:
    """The sensitivity multiplier of a job's reads: the dataset's contribution bound K for a
    person-unit dataset (every read holds at most K rows of a person), else 1."""
    return 1 if ctx.contribution is None else ctx.max_rows_per_user


def run_statistic(ctx: JobContext, job: StatisticJob, mechanism: Mechanism) -> None:
    """Check the charged demand against the grant, compute the statistic over the granted
    blocks, then save ``metrics.json`` and report the result and the budget spent (the
    whole charged mechanism: a statistic is one release)."""
    spent = demand_vector(mechanism, ctx.accounting)
    if not np.all(leq(spent, ctx.budget)):
        raise ValueError("the statistic's charged mechanism exceeds its grant: nothing was released")
    records = load_blocks(ctx)
    n = len(next(v for k, v in records.items() if v.ndim >= 1))
    values = column(records, job.column) if job.column is not None else None
    result = dp_statistic(job, mechanism, values, n, rows_per_person(ctx))
    metrics = {"query": job.query, "column": job.column, "noise": job.noise, "blocks": len(ctx.blocks), **result}
    ctx.report_spent(spent)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    (ctx.workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    ctx.report_metrics(**metrics)

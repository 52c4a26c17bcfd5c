"""User-code jobs of the fault-injection tests, as ``tests.fault_jobs:<name>``.

This module holds no tests: job processes import it, so it stays light.
"""

from __future__ import annotations

import time
from pathlib import Path

from privsched.jobs.context import JobContext
from tests.support.waiting import wait_for


def counted_sleep_then_spend(ctx: JobContext) -> None:
    """Appends a line to ``runs.txt`` in its work folder (one per start of the job), sleeps
    ``ctx.params['seconds']``, reads its blocks and reports half of its budget spent (not
    believed: a user job is charged its grant)."""
    with open(Path(ctx.workdir, "runs.txt"), "a") as runs:
        runs.write("run\n")
    time.sleep(float(ctx.params.get("seconds", 1.0)))
    for key in ctx.block_keys:
        ctx.open_block(key)
    ctx.report_spent(ctx.budget / 2)


def counted_wait_then_spend(ctx: JobContext) -> None:
    """Like :func:`counted_sleep_then_spend`, but waits until a file named ``go`` appears in
    its work folder (and fails if none does: :func:`~tests.support.waiting.wait_for`)."""
    with open(Path(ctx.workdir, "runs.txt"), "a") as runs:
        runs.write("run\n")
    wait_for(Path(ctx.workdir, "go").exists, f"pipeline {ctx.pipeline_id} was told to go", poll=0.02)
    for key in ctx.block_keys:
        ctx.open_block(key)
    ctx.report_spent(ctx.budget / 2)


def forges_its_pid_file(ctx: JobContext) -> None:
    """Points its run folder's pid file at another live process (``ctx.params['victim']``,
    with its true start time), then sleeps ``ctx.params['seconds']`` and spends half."""
    victim = int(ctx.params["victim"])
    try:
        stat = Path(f"/proc/{victim}/stat").read_text()
    except OSError:
        stat = None  # the victim is outside its PID namespace: it cannot even see it
    if stat is not None:
        ticks = stat[stat.rindex(")") + 2 :].split()[19]
        Path(ctx.workdir, "pid").write_text(f"{victim} {ticks}\n")
    time.sleep(float(ctx.params.get("seconds", 1.0)))
    ctx.report_spent(ctx.budget / 2)

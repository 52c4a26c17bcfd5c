"""User-code jobs the Ray executor tests run on the cluster as ``tests.ray_jobs:<name>``.

This module holds no tests: Ray job processes import it, so it stays light (no torch).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from privsched.jobs.context import JobContext
from tests.support.waiting import wait_for


def _trace(ctx: JobContext, event: str) -> None:
    """With ``ctx.params['trace']``, append ``<pipeline id> <event>`` to ``trace`` in its work
    folder (the only place a confined job may write)."""
    if ctx.params.get("trace"):
        with open(Path(ctx.workdir, "trace"), "a") as trace:
            trace.write(f"{ctx.pipeline_id} {event}\n")


def reports_gpus(ctx: JobContext) -> None:
    """Reads its blocks, says which GPUs it sees, holds them ``seconds`` (with ``hold``: until
    a file named ``release`` appears in its work folder), spends half its grant and records
    the GPUs and its running interval in its metrics."""
    started = time.time()
    _trace(ctx, "started")
    for key in ctx.block_keys:
        ctx.open_block(key)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(f"pipeline {ctx.pipeline_id} sees GPUs {visible!r}", flush=True)
    if ctx.params.get("hold"):
        wait_for(Path(ctx.workdir, "release").exists, f"pipeline {ctx.pipeline_id} was released")
    time.sleep(float(ctx.params.get("seconds", 0)))
    ctx.report_metrics(gpus=visible, started=started, ended=time.time())
    ctx.report_spent(ctx.budget / 2)


def prints_then_hangs(ctx: JobContext) -> None:
    """Reads its first block, writes its process id and PID namespace next to the pipeline
    (a confined job is PID 1 of a namespace of its own), says so, and hangs."""
    ctx.open_block(ctx.block_keys[0]).close()
    Path(ctx.workdir, "job.pid").write_text(f"{os.getpid()} {os.readlink('/proc/self/ns/pid')}")
    print(f"pipeline {ctx.pipeline_id} is reading", flush=True)
    time.sleep(3600)


def reports_secret_variables(ctx: JobContext) -> None:
    """Reports which of Ray's token variables its environment and its /proc/self/environ name."""
    from privsched.service.executors.base import SECRET_VARIABLES

    try:
        initial = Path("/proc/self/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        initial = []
    ctx.report_metrics(
        environ=[name for name in SECRET_VARIABLES if name in os.environ],
        proc=[name for name in SECRET_VARIABLES if any(e.startswith(name + "=") for e in initial)],
        readable=bool(initial),
    )
    ctx.report_spent(ctx.budget)

"""User-code jobs the service tests submit as ``tests.service_jobs:<name>``.

This module holds no tests: it is imported by job processes, so it stays light (no torch).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from privsched.jobs.context import JobContext
from tests.support.waiting import wait_for


def spend_half(ctx: JobContext) -> None:
    """Reads every granted block, then reports half of its budget as spent."""
    for key in ctx.block_keys:
        ctx.open_block(key)
    ctx.report_spent(ctx.budget / 2)
    ctx.report_metrics(blocks=len(ctx.block_keys))


def no_report(ctx: JobContext) -> None:
    """Reads its data and returns without reporting: charged its whole grant."""
    for key in ctx.block_keys:
        ctx.open_block(key)


def sleep_then_spend(ctx: JobContext) -> None:
    """Sleeps ``ctx.params['seconds']`` (a file ``sleeping`` in its work folder says it has
    begun), then spends half its budget."""
    Path(ctx.workdir, "sleeping").touch()
    time.sleep(float(ctx.params.get("seconds", 1.0)))
    spend_half(ctx)


def waits_for_go_then_spends(ctx: JobContext) -> None:
    """Waits until a file named ``go`` appears in its work folder, then spends half its budget."""
    wait_for(Path(ctx.workdir, "go").exists, f"pipeline {ctx.pipeline_id} was told to go")
    spend_half(ctx)


def raises_after_reading(ctx: JobContext) -> None:
    ctx.open_block(ctx.block_keys[0])
    raise RuntimeError("the model diverged")


def raises_before_reading(ctx: JobContext) -> None:
    raise ValueError("bad hyper-parameter")


def hangs(ctx: JobContext) -> None:
    """Opens its first block (a file ``reached`` in its work folder says so), then sleeps an hour."""
    ctx.open_block(ctx.block_keys[0])
    Path(ctx.workdir, "reached").touch()
    time.sleep(3600)


def exits_without_result(ctx: JobContext) -> None:
    ctx.open_block(ctx.block_keys[0])
    os._exit(0)


def reads_foreign_block(ctx: JobContext) -> None:
    ctx.open_block("not-granted")


def writes_environment(ctx: JobContext) -> None:
    """Records what the executor gave the process, then spends nothing."""
    Path(ctx.workdir, "env.txt").write_text(f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r} {ctx.device}\n")
    print(f"hello from pipeline {ctx.pipeline_id}", flush=True)
    ctx.report_spent(ctx.budget * 0)


#: What the marker jobs write into everything they release or say (tests/test_trust_outputs.py).
MARKER = "MARKER-7f3a9c"


def speaks_marker_then_raises(ctx: JobContext) -> None:
    """Reads its data, then puts the marker in its metrics, its log and its exception."""
    ctx.open_block(ctx.block_keys[0]).close()
    ctx.report_metrics(note=MARKER)
    print(MARKER, flush=True)
    raise RuntimeError(MARKER)


def speaks_marker_then_completes(ctx: JobContext) -> None:
    """Reads its data, puts the marker in its metrics and its log, and spends half its grant."""
    print(MARKER, flush=True)
    ctx.report_metrics(note=MARKER)
    spend_half(ctx)

"""User jobs the fork server tests run as ``tests.fork_jobs:<name>``: each records what it
saw in its work folder (``seen.json``), where the test reads it."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from privsched.jobs.context import JobContext


def _record(ctx: JobContext, **seen: object) -> None:
    (ctx.workdir / "seen.json").write_text(json.dumps(seen))


def draws(ctx: JobContext) -> None:
    """Draws from every generator a job might use without seeding it, and its thread pools."""
    import numpy as np
    import torch
    from threadpoolctl import threadpool_info

    _record(
        ctx,
        random=random.random(),
        numpy=float(np.random.random()),
        torch=float(torch.rand(1)),
        torch_threads=torch.get_num_threads(),
        blas_threads=[pool["num_threads"] for pool in threadpool_info()],
        cuda=os.environ.get("CUDA_VISIBLE_DEVICES"),
        pid=os.getpid(),
    )


def escapes(ctx: JobContext) -> None:
    """Tries to read and to write a file outside its work folder."""
    target = Path(ctx.params["path"])
    outcomes = {}
    for what, attempt in (("read", target.read_bytes), ("write", lambda: target.write_text("tampered\n"))):
        try:
            attempt()
            outcomes[what] = "allowed"
        except (PermissionError, FileNotFoundError):  # denied, or not even in its view
            outcomes[what] = "denied"
    _record(ctx, **outcomes)


def lists_descriptors(ctx: JobContext) -> None:
    """Records what each of its open file descriptors is."""
    folder = Path("/proc/self/fd")
    targets = {}
    for entry in os.listdir(folder):
        try:
            targets[entry] = os.readlink(folder / entry)
        except OSError:
            continue
    _record(ctx, fds=targets)

"""Settling a finished job in the ledger (docs/design.md §4.4).

A completed job moves what it spent from allocated to consumed and releases the rest; a
failed job has its whole allocation consumed when it touched data (a partial model may
already have leaked), released when it did not. A job stopped because a user asked to
cancel it fails in that user's name. A job that reports spending more than its
grant is failed, its allocation consumed. A database that is full refuses the settling
(:class:`~privsched.ledger.errors.StorageFull`) and changes nothing, so the caller settles
the same result again later.
"""

from __future__ import annotations

import numpy as np

from privsched.jobs.runner import JobResult
from privsched.ledger import Ledger, LedgerError
from privsched.ledger.errors import StorageFull


def settle(ledger: Ledger, result: JobResult, now: float, *, actor: str | None = None) -> str:
    """Record how a job ended; returns the pipeline's new state. A failure is recorded as
    caused by ``actor`` (a cancelled job's requester), by default the ledger's own (the
    scheduler's while it holds the lease)."""
    pipeline_id = result.pipeline_id
    if result.completed:
        spent = {key: np.asarray(vector, dtype=float) for key, vector in (result.spent or {}).items()}
        try:
            ledger.complete(pipeline_id, spent, now=now)
            return "completed"
        except StorageFull:  # nothing was recorded: settle again once space returns
            raise
        except LedgerError as exc:
            message = f"the job's reported spending was refused: {exc}"
            touched = True
    else:
        message, touched = result.message or "the job failed", result.touched_data
    ledger.fail(pipeline_id, message, touched_data=touched, now=now, actor=actor)
    return "failed"

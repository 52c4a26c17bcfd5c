"""Settling a finished job in the ledger (docs/design.md §4.4).

A completed job moves what it spent from allocated to consumed and releases the rest; a
failed job has its whole allocation consumed when it touched data (a partial model may
already have leaked), released when it did not. A job stopped because a user asked to
cancel it fails in that user's name. A job that reports spending more than its
grant is failed, its allocation consumed. A database that is full refuses the settling
(:class:`~privsched.ledger.errors.StorageFull`) and changes nothing, so the caller settles
the same result again later. Jobs that ended together are settled in one transaction
(:func:`settle_together`), so in one disk sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privsched.jobs.runner import JobResult
from privsched.ledger import Ledger, LedgerError
from privsched.ledger.errors import StorageFull
from privsched.ledger.models import Ending


def ending(result: JobResult, actor: str | None = None) -> Ending:
    """What the ledger records of a job's result: what a completed job spent, or why a
    failed one failed (caused by ``actor``) and whether it touched data."""
    if result.completed:
        spent = {key: np.asarray(vector, dtype=float) for key, vector in (result.spent or {}).items()}
        return Ending(result.pipeline_id, spent=spent)
    return Ending(result.pipeline_id, message=result.message or "the job failed", touched_data=result.touched_data, actor=actor)


def settle(ledger: Ledger, result: JobResult, now: float, *, actor: str | None = None) -> str:
    """Record how a job ended; returns the pipeline's new state. A failure is recorded as
    caused by ``actor`` (a cancelled job's requester), by default the ledger's own (the
    scheduler's while it holds the lease)."""
    pipeline_id = result.pipeline_id
    end = ending(result, actor)
    if end.spent is not None:
        try:
            ledger.complete(pipeline_id, end.spent, now=now)
            return "completed"
        except StorageFull:  # nothing was recorded: settle again once space returns
            raise
        except LedgerError as exc:
            end = Ending(pipeline_id, message=f"the job's reported spending was refused: {exc}", actor=actor)
    ledger.fail(pipeline_id, end.message, touched_data=end.touched_data, now=now, actor=end.actor)
    return "failed"


def settle_together(ledger: Ledger, results: Sequence[JobResult], now: float, actors: Sequence[str | None]) -> list[str] | None:
    """Record how several jobs ended in one transaction (``actors``: who caused each
    failure, as for :func:`settle`); their new states, or None when the ledger refused one
    of them and recorded nothing (the caller then settles each alone with :func:`settle`,
    which gives each its own outcome)."""
    try:
        ledger.settle_many([ending(result, actor) for result, actor in zip(results, actors)], now=now)
    except StorageFull:  # nothing was recorded: settle again once space returns
        raise
    except LedgerError:
        return None
    return ["completed" if result.completed else "failed" for result in results]

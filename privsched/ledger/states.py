"""A pipeline's life cycle (docs/design.md §4.4)::

    pending ──grant──▶ granted ──run──▶ running ──▶ completed | failed
       │                  │
       ├──▶ timed_out     └──▶ cancelled | failed
       └──▶ cancelled | failed

Budget is allocated to a pipeline from its grant until it ends; an ended pipeline's state
never changes again (a failed one may still release an allocation it did not use).
"""

from __future__ import annotations

from enum import Enum


class PipelineState(str, Enum):
    """Where a pipeline is in its life cycle; compares equal to its name as text."""

    PENDING = "pending"  # waiting for a grant
    GRANTED = "granted"  # budget allocated, waiting for compute
    RUNNING = "running"  # its job runs
    COMPLETED = "completed"  # the job ended and reported what it spent
    FAILED = "failed"  # the job (or its start) failed
    TIMED_OUT = "timed_out"  # no grant before its timeout
    CANCELLED = "cancelled"  # stopped by its user

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def is_final(self) -> bool:
        """Whether the pipeline has ended: its state never changes again."""
        return self in _FINAL

    def holds_allocation(self) -> bool:
        """Whether budget is allocated to the pipeline (granted, not yet settled)."""
        return self in _HOLDING


_FINAL = frozenset({PipelineState.COMPLETED, PipelineState.FAILED, PipelineState.TIMED_OUT, PipelineState.CANCELLED})
_HOLDING = frozenset({PipelineState.GRANTED, PipelineState.RUNNING})

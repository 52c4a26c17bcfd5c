"""The SQLite budget ledger: the single source of truth for privacy budget (docs/design.md §6)."""

from privsched.ledger.errors import LedgerError
from privsched.ledger.ledger import Ledger
from privsched.ledger.models import (
    AuditReport,
    BlockInfo,
    BlockSpec,
    DatasetInfo,
    Event,
    PendingView,
    PipelineInfo,
    PipelineRequest,
)
from privsched.ledger.states import PipelineState

__all__ = [
    "AuditReport",
    "BlockInfo",
    "BlockSpec",
    "DatasetInfo",
    "Event",
    "Ledger",
    "LedgerError",
    "PendingView",
    "PipelineInfo",
    "PipelineRequest",
    "PipelineState",
]

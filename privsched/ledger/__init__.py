"""The SQLite budget ledger: the single source of truth for privacy budget (docs/design.md §6).

:class:`Ledger` (SQLite, the audit, the event chain) loads on first use, so that code that
only needs the data classes, such as the remote client, does not load it."""

from __future__ import annotations

import importlib
from typing import Any

from privsched.ledger.errors import LedgerError
from privsched.ledger.models import (
    AuditReport,
    BlockInfo,
    BlockSpec,
    DatasetInfo,
    DatasetSchema,
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
    "DatasetSchema",
    "Event",
    "Ledger",
    "LedgerError",
    "PendingView",
    "PipelineInfo",
    "PipelineRequest",
    "PipelineState",
]


def __getattr__(name: str) -> Any:
    if name == "Ledger":
        return importlib.import_module("privsched.ledger.ledger").Ledger
    raise AttributeError(f"module 'privsched.ledger' has no attribute {name!r}")

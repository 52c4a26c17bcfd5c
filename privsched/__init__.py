"""privsched: privacy-budget-aware job scheduling for differentially private ML.

The public Python API is imported lazily so that ``import privsched`` (and the CLI's
``--help``) stays fast; torch, opacus and ray load only when a job needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public name -> module that defines it.
_API = {
    "Accounting": "privsched.budgets",
    "connect": "privsched.client",
    "Client": "privsched.client",
    "Last": "privsched.spec",
    "Range": "privsched.spec",
    "PipelineSpec": "privsched.spec",
    "JobContext": "privsched.jobs.context",
    "simulate": "privsched.simulation",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'privsched' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

"""privsched: privacy-budget-aware job scheduling for differentially private ML.

The public Python API is imported lazily so that ``import privsched`` (and the CLI's
``--help``) stays fast; torch, opacus and ray load only when a job needs them.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privsched.client import Client
    from privsched.remote import RemoteClient

__version__ = "0.1.0"

#: Public name -> module that defines it.
_API = {
    "Accounting": "privsched.budgets",
    "Client": "privsched.client",
    "Last": "privsched.spec",
    "Range": "privsched.spec",
    "PipelineSpec": "privsched.spec",
    "JobContext": "privsched.jobs.context",
    "simulate": "privsched.simulation",
}

__all__ = ["__version__", "connect", *_API]


def connect(path: str | os.PathLike | None = None, *, create: bool = True, token: str | None = None) -> Client | RemoteClient:
    """A client of a privsched database (created on first use unless ``create=False``):
    ``path``, else ``$PRIVSCHED_DB``, else ``privsched.db`` in the current folder. An
    ``http(s)://`` address instead gives a :class:`privsched.remote.RemoteClient` of that
    server, with the same methods, authenticated by ``token`` (else ``$PRIVSCHED_TOKEN``).

    It sits above both clients, so neither imports the other (docs/design.md §6.1)."""
    if isinstance(path, str) and path.startswith(("http://", "https://")):
        from privsched.remote import RemoteClient

        return RemoteClient(path, token)
    from privsched.client import open_client

    return open_client(path, create=create)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'privsched' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

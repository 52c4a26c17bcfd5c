"""Executors run granted jobs on compute; the scheduler talks to them through
:class:`~privsched.service.executors.base.Executor` only."""

from __future__ import annotations

from privsched.service.executors.base import Executor, Launch

EXECUTOR_NAMES: tuple[str, ...] = ("local",)


def make_executor(name: str) -> Executor:
    """An executor by name; unknown names raise ``ValueError`` with one line."""
    if name == "local":
        from privsched.service.executors.local import LocalExecutor

        return LocalExecutor()
    raise ValueError(f"unknown executor {name!r} (expected one of {', '.join(EXECUTOR_NAMES)})")


__all__ = ["EXECUTOR_NAMES", "Executor", "Launch", "make_executor"]

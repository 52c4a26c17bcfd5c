"""Executors run granted jobs on compute; the scheduler talks to them through
:class:`~privsched.service.executors.base.Executor` only."""

from __future__ import annotations

from privsched.service.executors.base import Executor, Launch

EXECUTOR_NAMES: tuple[str, ...] = ("local", "ray")


def make_executor(name: str, ray_address: str | None = None) -> Executor:
    """An executor by name (``ray_address``: the Ray cluster's dashboard address, for
    ``ray``); unknown names raise ``ValueError`` with one line."""
    if ray_address is not None and name != "ray":
        raise ValueError("a Ray address applies to the ray executor only")
    if name == "local":
        from privsched.service.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from privsched.service.executors.ray import RayExecutor

        return RayExecutor(ray_address)
    raise ValueError(f"unknown executor {name!r} (expected one of {', '.join(EXECUTOR_NAMES)})")


__all__ = ["EXECUTOR_NAMES", "Executor", "Launch", "make_executor"]

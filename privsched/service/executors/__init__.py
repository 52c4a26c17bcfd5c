"""Executors run granted jobs on compute; the scheduler talks to them through
:class:`~privsched.service.executors.base.Executor` only."""

from __future__ import annotations

from privsched.service.executors.base import Executor, Launch

EXECUTOR_NAMES: tuple[str, ...] = ("local", "ray")


def make_executor(
    name: str, ray_address: str | None = None, *, sandbox: str | None = None, allow_network: bool = False, train_across_nodes: bool = False
) -> Executor:
    """An executor by name (``ray_address``: the Ray cluster's dashboard address, and
    ``train_across_nodes``, for ``ray``), confining jobs with ``sandbox`` (default
    ``$PRIVSCHED_SANDBOX``, else ``landlock``); unknown names raise ``ValueError`` with one line."""
    from privsched.jobs.sandbox import sandbox_mode

    mode = sandbox_mode(sandbox)
    if ray_address is not None and name != "ray":
        raise ValueError("a Ray address applies to the ray executor only")
    if train_across_nodes and name != "ray":
        raise ValueError("--train-across-nodes applies to the ray executor only")
    executor: Executor
    if name == "local":
        from privsched.service.executors.local import LocalExecutor

        executor = LocalExecutor()
    elif name == "ray":
        from privsched.service.executors.ray import RayExecutor

        executor = RayExecutor(ray_address, train_across_nodes=train_across_nodes)
    else:
        raise ValueError(f"unknown executor {name!r} (expected one of {', '.join(EXECUTOR_NAMES)})")
    executor.sandbox, executor.allow_network = mode, allow_network
    return executor


__all__ = ["EXECUTOR_NAMES", "Executor", "Launch", "make_executor"]

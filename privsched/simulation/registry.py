"""Named workload generators, filled by the packages that provide them.

The simulator takes traces; it never imports a workload package. A package registers its
generators under the ``privsched.workloads`` entry-point group as a mapping from name to
generator (``generator(seed=..., **params)``, returning a :class:`Trace` or, built column
by column, a :class:`~privsched.simulation.generated.GeneratedTrace`); this project's
``workloads`` package does so in ``pyproject.toml`` (docs/design.md §5, §6.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Callable

from privsched.simulation.params import check_params

if TYPE_CHECKING:
    from privsched.simulation.generated import GeneratedTrace
    from privsched.simulation.trace import Trace

    #: What a generator returns.
    Workload = Trace | GeneratedTrace

#: The entry-point group workload packages register their generators under.
ENTRY_POINT_GROUP = "privsched.workloads"


def workload_generators() -> dict[str, Callable[..., Workload]]:
    """Workload name -> generator, from every registered package."""
    generators: dict[str, Callable[..., Workload]] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        generators.update(entry.load())
    return generators


def generate_workload(generators: Mapping[str, Callable[..., Workload]], name: str, seed: int, params: dict) -> Workload:
    """The workload ``name`` of ``generators`` generated with ``seed`` and ``params``;
    ValueError (one line) for an unknown name or parameter, or a value out of its type or
    range (:func:`~privsched.simulation.params.check_params`, before generating)."""
    if name not in generators:
        raise ValueError(f"unknown workload {name!r} (expected one of: {', '.join(generators)})")
    check_params(name, generators[name], params)
    try:
        return generators[name](seed=seed, **params)
    except TypeError as exc:
        raise ValueError(f"workload {name!r}: {exc}") from None

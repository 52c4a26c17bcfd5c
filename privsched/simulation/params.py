"""Workload parameters checked against the generator that takes them, before it runs.

A generator declares its parameters in its signature: the type (``int``, ``float``, ``str``,
optionally ``| None``) and, for those that size the workload, an inclusive range with
``Annotated[int, Between(1, MAX_BLOCKS)]``. :func:`check_params` refuses, with one line naming
the limit, a parameter the generator does not take, a value of the wrong type (a boolean is
not a number, an integer parameter takes no fraction), NaN, an infinity (unless the default
is one) and a value outside its range, so that no generator starts on a value that would ask
for terabytes or loop for hours. A generator registered lazily (``__wrapped__`` naming the
function on first access, ``fixed`` the arguments it sets itself) is imported here, when it
is resolved, and not before.
"""

from __future__ import annotations

import inspect
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_NUMBERS = {int: "an integer", float: "a number"}
#: Most characters of a refused value that an error message shows.
SHOWN = 40


@dataclass(frozen=True)
class Between:
    """Metadata of ``Annotated[T, Between(low, high)]``: the inclusive range a parameter takes."""

    low: float
    high: float


@dataclass(frozen=True)
class Declared:
    """What a generator's signature says of one parameter."""

    kind: type | None  # int, float or str; None: unchecked
    optional: bool  # whether None is accepted
    bounds: Between | None
    default: Any


def _declared(parameter: inspect.Parameter, namespace: Mapping[str, Any]) -> Declared:
    annotation = parameter.annotation
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, dict(namespace))  # the generator module's own annotation
        except Exception:
            annotation = inspect.Parameter.empty
    bounds = None
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *metadata = typing.get_args(annotation)
        bounds = next((m for m in metadata if isinstance(m, Between)), None)
    options = [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = list(typing.get_args(annotation))
    optional = type(None) in options or parameter.default is None
    kinds = [option for option in options if option in (int, float, str)]
    return Declared(kinds[0] if len(kinds) == 1 else None, optional, bounds, parameter.default)


def declared_params(generator: Callable[..., Any]) -> dict[str, Declared] | None:
    """The keyword parameters ``generator`` takes (its fixed ones and ``seed`` excepted), or
    None when it takes any keyword (``**kwargs``)."""
    target = inspect.unwrap(generator)
    fixed = getattr(generator, "fixed", {})
    namespace = getattr(target, "__globals__", {})
    found: dict[str, Declared] = {}
    for name, parameter in inspect.signature(target).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if (
            name not in fixed
            and name != "seed"
            and parameter.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ):
            found[name] = _declared(parameter, namespace)
    return found


def _shown(value: Any) -> str:
    """``value`` for an error message, at most :data:`SHOWN` characters of it."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**SHOWN else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


def value_problem(value: Any, declared: Declared) -> str | None:
    """Why ``value`` cannot be given for a parameter declared so, or None."""
    if value is None:
        return None if declared.optional else "must be given a value, got null"
    kind = declared.kind
    if kind is str:
        return None if isinstance(value, str) else f"must be a string, got {_shown(value)}"
    if kind not in _NUMBERS:
        return None
    bounds = declared.bounds
    default_infinite = isinstance(declared.default, float) and math.isinf(declared.default)
    wanted = _NUMBERS[kind] + (
        f" in [{bounds.low:g}, {bounds.high:g}]" if bounds is not None else "" if default_infinite or kind is int else " (finite)"
    )
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        return f"must be {wanted}, got {_shown(value)}"
    if kind is float and abs(value) > sys.float_info.max and not (isinstance(value, float) and default_infinite):
        return f"must be {wanted}, got {_shown(value)}"  # beyond a float: an infinity, or an integer too large
    if isinstance(value, float) and math.isnan(value):
        return f"must be {wanted}, got {_shown(value)}"
    if bounds is not None and not bounds.low <= value <= bounds.high:
        return f"must be {wanted}, got {_shown(value)}"
    return None


def check_params(name: str, generator: Callable[..., Any], params: Mapping[str, Any]) -> None:
    """Refuse (ValueError, one line naming the limit) parameters that the generator of
    workload ``name`` does not take, or values its signature does not allow."""
    declared = declared_params(generator)
    if declared is None:
        return
    for key, value in params.items():
        if key not in declared:
            raise ValueError(f"workload {name!r} takes no parameter {key!r} (it takes: {', '.join(sorted(declared))})")
        problem = value_problem(value, declared[key])
        if problem is not None:
            raise ValueError(f"workload {name!r}: {key} {problem}")

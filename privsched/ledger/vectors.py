"""Budget-vector fields of the ledger's data classes, decoded from the stored BLOBs when
first read.

A :class:`~privsched.ledger.models.BlockInfo` read from the database holds its balances as
the float64 BLOBs the ledger stores (:mod:`~privsched.ledger.schema`); each becomes a NumPy
array the first time it is read, and stays one. A command that only lists names and
states (``privsched blocks list``, ``dataset list``, ``list``) so never imports NumPy
(issue 16). A field may equally be given an array, which is kept as given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from privsched.ledger.schema import unpack

C = TypeVar("C", bound=type)


def _vector(value: Any) -> Any:
    """A stored BLOB decoded; any other value (an array, None) as given."""
    return unpack(value) if isinstance(value, bytes) else value


def _vectors(value: Any) -> Any:
    """Stored BLOBs by block key decoded (None as given)."""
    return None if value is None else {key: _vector(blob) for key, blob in value.items()}


class _DecodedOnRead:
    """A data descriptor replacing a dataclass field: ``__init__`` sets the value as given
    (a BLOB), the first read decodes it with ``decode`` and keeps the result. Threads that
    read it first at once all get the one result kept (``dict.setdefault`` is atomic), and
    the value given stays, so that none finds it gone."""

    def __init__(self, name: str, decode: Callable[[Any], Any]) -> None:
        self.name = name
        self.raw = f"_raw_{name}"
        self.decode = decode

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            raise AttributeError(self.name)
        values = instance.__dict__
        try:
            return values[self.name]
        except KeyError:
            return values.setdefault(self.name, self.decode(values[self.raw]))

    def __set__(self, instance: object, value: object) -> None:
        instance.__dict__.pop(self.name, None)
        instance.__dict__[self.raw] = value


def decoded_on_read(*vectors: str, maps: tuple[str, ...] = ()) -> Callable[[C], C]:
    """Class decorator (above ``@dataclass``): the fields ``vectors`` (a budget vector, or
    None) and ``maps`` (block key -> budget vector, or None) accept the stored BLOBs and
    decode them when first read."""

    def decorate(cls: C) -> C:
        for name in vectors:
            setattr(cls, name, _DecodedOnRead(name, _vector))
        for name in maps:
            setattr(cls, name, _DecodedOnRead(name, _vectors))
        return cls

    return decorate

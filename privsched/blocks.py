"""The block arguments both clients accept: a key, a ``(key, location)`` pair, a mapping
with ``key`` (and ``location``), or a :class:`~privsched.ledger.models.BlockSpec`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from privsched.ledger.models import BlockSpec

BlockLike = str | tuple[str, str | None] | BlockSpec | Mapping[str, Any]


def block_spec(block: BlockLike) -> BlockSpec:
    """The :class:`BlockSpec` a block argument stands for."""
    if isinstance(block, BlockSpec):
        return block
    if isinstance(block, str):
        return BlockSpec(block)
    if isinstance(block, Mapping):
        return BlockSpec(str(block["key"]), block.get("location"))
    key, location = block
    return BlockSpec(str(key), None if location is None else str(location))

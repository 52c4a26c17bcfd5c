"""Unlock rules: how a block's locked budget becomes available to the scheduler.

DESIGN §4.1, after Luo et al., OSDI'21 §4.1 ("DPF-N" and "DPF-T"): budget is released
gradually so that early pipelines cannot drain a block before later ones arrive. Each rule
only returns fractions of capacity; callers unlock ``min(locked, fraction × capacity)`` at
every dimension (the same fraction at every RDP order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class UnlockAll:
    """A block is fully unlocked when it is created (FCFS's rule)."""

    name: ClassVar[str] = "all"

    def on_block_created(self) -> float:
        return 1.0

    def on_pipeline_arrival(self) -> float:
        return 0.0

    def on_tick(self, elapsed: float) -> float:
        return 0.0


@dataclass(frozen=True)
class UnlockPerArrival:
    """Each arriving pipeline unlocks ``capacity / n`` on every block it demands.

    The first ``n`` pipelines on a block are each guaranteed a fair share ``capacity / n``.
    """

    n: int
    name: ClassVar[str] = "n"

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be a positive integer, got {self.n!r}")

    def on_block_created(self) -> float:
        return 0.0

    def on_pipeline_arrival(self) -> float:
        return 1.0 / self.n

    def on_tick(self, elapsed: float) -> float:
        return 0.0


@dataclass(frozen=True)
class UnlockPerTime:
    """Every block unlocks ``capacity × elapsed / lifetime`` as the clock advances.

    A block is fully unlocked ``lifetime`` seconds after its creation.
    """

    lifetime: float
    name: ClassVar[str] = "t"

    def __post_init__(self) -> None:
        ok = isinstance(self.lifetime, (int, float)) and not isinstance(self.lifetime, bool)
        if not ok or not math.isfinite(self.lifetime) or self.lifetime <= 0:
            raise ValueError(f"lifetime must be a positive number of seconds, got {self.lifetime!r}")

    def on_block_created(self) -> float:
        return 0.0

    def on_pipeline_arrival(self) -> float:
        return 0.0

    def on_tick(self, elapsed: float) -> float:
        if elapsed < 0:
            raise ValueError(f"elapsed time must be non-negative, got {elapsed!r}")
        return elapsed / self.lifetime

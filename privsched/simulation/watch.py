"""Watch lists: which pending pipelines may fit after some blocks gain budget.

Every pending pipeline that does not fit *watches* one block on which its demand does not
fit (its witness, like a watched literal in a SAT solver). Grants only take budget away, so
the pipeline cannot fit before its witness block gains budget; when a block gains budget
only its watchers are looked at. A per-block lower bound of the watchers' demands rules a
block out in O(K) when none of its watchers can fit there.
"""

from __future__ import annotations

from typing import cast

import numpy as np


def fits_under(rdp: bool, demand: np.ndarray, available: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Whether each demand fits ``available`` under plain ``<=`` (reduces the last axis). The
    simulator passes budgets in exact quanta, held here as float64 (exact below 2⁵³, beyond
    any budget), so this is the exact fit test and a filter that never drops a fitting one."""
    ok = demand <= available
    # Demands come as (n, K) arrays: the reduction over K is an (n,) array.
    return cast(np.ndarray, (ok & live).any(axis=-1) if rdp else ok.all(axis=-1))


class WatchLists:
    """Per block, the pipelines watching it with their demand on it (lazily compacted)."""

    def __init__(self, n_blocks: int, dims: int, rdp: bool, live: np.ndarray, status: np.ndarray, pending: int) -> None:
        self.pipeline = [np.empty(8, dtype=np.int64) for _ in range(n_blocks)]
        self.stamp_of = [np.empty(8, dtype=np.int64) for _ in range(n_blocks)]
        self.demand = [np.empty((8, dims)) for _ in range(n_blocks)]
        self.count = [0] * n_blocks
        self.low = np.full((n_blocks, dims), np.inf)  # lower bound of the watchers' demands
        self.stamp = np.zeros(len(status), dtype=np.int64)  # an entry is current iff its stamp matches
        self.rdp = rdp
        self.live = live
        self.status, self.pending = status, pending  # the simulator's pipeline status codes

    def watch(self, pipelines: np.ndarray, blocks: np.ndarray, demand: np.ndarray) -> None:
        """Each of ``pipelines`` (distinct) now watches the matching block, where it needs ``demand``."""
        if len(blocks) == 1:
            i = int(pipelines[0])
            self.stamp[i] += 1
            self._append(int(blocks[0]), pipelines, self.stamp[i : i + 1], demand)
            return
        self.stamp[pipelines] += 1
        stamps = self.stamp[pipelines]
        by_block = np.argsort(blocks, kind="stable")
        blocks = blocks[by_block]
        cuts = (np.flatnonzero(blocks[1:] != blocks[:-1]) + 1).tolist()
        for first, last in zip([0, *cuts], [*cuts, len(blocks)]):
            rows = by_block[first:last]
            self._append(int(blocks[first]), pipelines[rows], stamps[rows], demand[rows])

    def _append(self, j: int, pipelines: np.ndarray, stamps: np.ndarray, demand: np.ndarray) -> None:
        """Add watchers of block j (growing its arrays by doubling) and lower its bound."""
        n, m = self.count[j], len(pipelines)
        if n + m > len(self.pipeline[j]):
            size = max(2 * len(self.pipeline[j]), n + m)
            self.pipeline[j] = np.resize(self.pipeline[j], size)
            self.stamp_of[j] = np.resize(self.stamp_of[j], size)
            self.demand[j] = np.resize(self.demand[j], (size, demand.shape[1]))
        self.pipeline[j][n : n + m] = pipelines
        self.stamp_of[j][n : n + m] = stamps
        self.demand[j][n : n + m] = demand
        self.count[j] = n + m
        np.minimum(self.low[j], demand.min(axis=0) if m > 1 else demand[0], out=self.low[j])

    def worth_scanning(self, blocks: np.ndarray, unlocked: np.ndarray) -> np.ndarray:
        """The ``blocks`` where the lower bound of the watchers' demands fits (all at once)."""
        ok = fits_under(self.rdp, self.low[blocks], unlocked[blocks], self.live[blocks])
        return blocks[ok]

    def may_fit(self, j: int, unlocked: np.ndarray) -> np.ndarray:
        """Pending watchers of block j whose demand there may fit ``unlocked`` (under plain
        ``<=``, implied by an exact fit)."""
        n = self.count[j]
        if n == 0:
            return self.pipeline[j][:0]
        live = self.live[j]
        pipeline, stamp, demand = self.pipeline[j][:n], self.stamp_of[j][:n], self.demand[j][:n]
        current = (self.status[pipeline] == self.pending) & (stamp == self.stamp[pipeline])
        if not current.all():
            m = int(current.sum())
            pipeline[:m], stamp[:m], demand[:m] = pipeline[current], stamp[current], demand[current]
            pipeline, demand = pipeline[:m], demand[:m]
            self.count[j] = m
        self.low[j] = demand.min(axis=0) if len(pipeline) else np.inf
        return pipeline[fits_under(self.rdp, demand, unlocked, live)]


class BlockMembers:
    """Per block, the pending pipelines that ask for it (lazily compacted): the pipelines a
    water-filling pass can change when the block gains budget."""

    def __init__(self, n_blocks: int, status: np.ndarray, pending: int) -> None:
        self.pipeline = [np.empty(8, dtype=np.int64) for _ in range(n_blocks)]
        self.count = [0] * n_blocks
        self.status, self.pending = status, pending

    def add(self, pipelines: np.ndarray, blocks: np.ndarray) -> None:
        for p, j in zip(pipelines.tolist(), blocks.tolist()):
            n = self.count[j]
            if n == len(self.pipeline[j]):
                self.pipeline[j] = np.resize(self.pipeline[j], 2 * n)
            self.pipeline[j][n] = p
            self.count[j] = n + 1

    def of(self, j: int) -> np.ndarray:
        """The pending pipelines asking for block j."""
        pipeline = self.pipeline[j][: self.count[j]]
        current = self.status[pipeline] == self.pending
        if not current.all():
            m = int(current.sum())
            pipeline[:m] = pipeline[current]
            pipeline = pipeline[:m]
            self.count[j] = m
        return pipeline

"""A min-priority queue of items keyed by ``(key, tie)``, worked in whole NumPy arrays.

Entries live in sorted *runs*, merged like the digits of a binary counter (a log-structured
merge): a pushed batch becomes a new run, and the newest run absorbs older ones that are
less than twice its size, so sizes fall geometrically and there are O(log n) runs.
Pushing n items costs O(n log n) amortised; popping the m smallest looks at the first
m + 1 entries of every run. Both take a fixed number of NumPy calls per run, never a
Python step per item.

Each item has at most one live entry: pushing an item that is already queued replaces its
entry (the old one is recognised as stale by its version and skipped or dropped later).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class _Run:
    """Entries sorted by (key, tie); those before ``head`` are gone."""

    key: np.ndarray
    tie: np.ndarray
    item: np.ndarray
    version: np.ndarray
    head: int = 0

    def __len__(self) -> int:
        return len(self.item) - self.head

    def rest(self) -> tuple[np.ndarray, ...]:
        return self.key[self.head:], self.tie[self.head:], self.item[self.head:], self.version[self.head:]


def _sorted_run(key: np.ndarray, tie: np.ndarray, item: np.ndarray, version: np.ndarray) -> _Run:
    order = np.lexsort((tie, key))
    return _Run(key[order], tie[order], item[order], version[order])


class RunQueue:
    """Items ``0..n-1``, each queued at most once under a float key and an integer tie-break."""

    def __init__(self, n_items: int) -> None:
        self.queued = np.zeros(n_items, dtype=bool)
        #: Key of each queued item's live entry.
        self.key = np.zeros(n_items)
        self._version = np.zeros(n_items, dtype=np.int64)
        self._runs: list[_Run] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, items: np.ndarray, keys: np.ndarray, ties: np.ndarray) -> None:
        """Queue ``items`` (distinct) under ``(keys, ties)``, replacing entries they already have."""
        if not items.size:
            return
        self._size += int(np.count_nonzero(~self.queued[items]))
        self.queued[items] = True
        self.key[items] = keys
        self._version[items] += 1
        run = _sorted_run(np.asarray(keys, dtype=float), np.asarray(ties), items, self._version[items])
        while self._runs and len(self._runs[-1]) <= 2 * len(run):
            older = self._runs.pop().rest()
            parts = [np.concatenate([a, b]) for a, b in zip(older, (run.key, run.tie, run.item, run.version))]
            live = parts[3] == self._version[parts[2]]
            run = _sorted_run(*(part[live] for part in parts))
        self._runs.append(run)

    def pop(self, m: int) -> tuple[np.ndarray, tuple[float, int] | None]:
        """Take the ``m`` queued items with the smallest keys out of the queue (in key order),
        and return them with the smallest key left behind (None if nothing is left)."""
        if not self._runs:
            return np.zeros(0, dtype=np.intp), None
        runs, want = self._runs, m + 1
        take = want
        while True:
            stops = [min(run.head + take, len(run.item)) for run in runs]
            lengths = np.array([stop - run.head for run, stop in zip(runs, stops)])
            key, tie, item, version = (
                np.concatenate([getattr(run, name)[run.head:stop] for run, stop in zip(runs, stops)])
                for name in ("key", "tie", "item", "version")
            )
            owner = np.repeat(np.arange(len(runs)), lengths)
            live = version == self._version[item]
            shown = np.bincount(owner[live], minlength=len(runs))
            # Enough when every run shows all it has or at least ``want`` live entries.
            if all(stop == len(run.item) or count >= want for run, stop, count in zip(runs, stops, shown)):
                break
            take *= 2
        candidates = np.flatnonzero(live)
        candidates = candidates[np.lexsort((tie[candidates], key[candidates]))]
        popped, left = candidates[:m], candidates[m:want]
        # Each run loses the prefix up to its last popped entry (stale entries there go too).
        last = np.full(len(runs), -1)
        np.maximum.at(last, owner[popped], popped - (np.cumsum(lengths) - lengths)[owner[popped]])
        for run, end in zip(runs, last.tolist()):
            run.head += end + 1
        self._runs = [run for run in runs if len(run)]
        items = item[popped]
        self.queued[items] = False
        self._size -= len(items)
        return items, ((float(key[left[0]]), int(tie[left[0]])) if left.size else None)

"""The per-block demand order DPack's packing trees are built on (``_sorted_within_blocks``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.policies.packing import _sorted_within_blocks


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 4), st.booleans(), st.booleans())
def test_edges_come_grouped_by_block_and_ascending_in_demand(seed, n_blocks, width, skewed, some_columns):
    """Either layout (a padded table, or whole columns when one block dwarfs the others)
    yields every edge once per column asked for, blocks ascending, demands ascending
    within a block (−0 and +0 alike)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 6, size=n_blocks)
    if skewed:
        sizes[rng.integers(n_blocks)] = 5000  # forces the whole-column sort
    block = rng.permutation(np.repeat(np.arange(n_blocks), sizes))
    demand = rng.choice([-0.0, 0.0, 0.5, 1.0, 2.0, np.inf], size=(len(block), width)) * rng.uniform(0.5, 1.5)
    columns = np.flatnonzero(rng.random(width) < 0.5) if some_columns else np.arange(width)
    size = np.bincount(block, minlength=n_blocks)
    order = _sorted_within_blocks(block, demand, size, np.cumsum(size) - size, columns if some_columns else None)
    assert order.shape == (len(block), len(columns))
    for position, column in enumerate(columns):
        edges = order[:, position]
        assert np.array_equal(np.sort(edges), np.arange(len(block)))
        assert np.all(np.diff(block[edges]) >= 0)
        values, same_block = demand[edges, column], np.diff(block[edges]) == 0
        assert np.all(values[1:][same_block] >= values[:-1][same_block])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 20), st.integers(1, 300))
def test_demands_differing_only_in_their_last_bits_come_in_exact_order(seed, n_blocks, width):
    """The table sort orders integers with a double's lowest bits replaced by its slot; the
    values that differ only in those bits must still come out in exact ascending order."""
    rng = np.random.default_rng(seed)
    block = rng.permutation(np.repeat(np.arange(n_blocks), width))
    ulps = rng.integers(0, 4 * width, size=(len(block), 2))
    demand = np.ldexp(1.0 + ulps * 2.0**-52, rng.integers(-3, 3, size=(len(block), 1)) * (ulps[:, :1] % 2))
    size = np.bincount(block, minlength=n_blocks)
    order = _sorted_within_blocks(block, demand, size, np.cumsum(size) - size)
    for column in range(2):
        edges = order[:, column]
        assert np.array_equal(np.sort(edges), np.arange(len(block)))
        assert np.array_equal(demand[edges, column], np.concatenate([np.sort(demand[block == b, column]) for b in range(n_blocks)]))

"""The one unlock computation shared by the live scheduler and the simulator
(docs/design.md §4.1): targets, idempotent raises in exact quanta that do not depend on the
steps taken, and the grid of per-time instants."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from privsched.policies import UnlockAll, UnlockPerArrival, UnlockPerTime
from privsched.budgets.exact import minus, units
from privsched.policies.unlock import UnlockGrid, block_unlocked_fraction, unlock_amounts, unlocked_fraction

rules = st.one_of(
    st.just(UnlockAll()),
    st.integers(1, 50).map(UnlockPerArrival),
    st.floats(0.5, 1e4).map(UnlockPerTime),
)
capacities = st.lists(st.floats(1e-6, 100.0), min_size=1, max_size=4).map(np.array)
events = st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 1e4)), min_size=1, max_size=8)


def test_target_adds_creation_arrivals_and_time_and_stops_at_one() -> None:
    assert unlocked_fraction(UnlockPerArrival(4), np.array([0, 1, 3, 9]), np.zeros(4)).tolist() == [0, 0.25, 0.75, 1]
    assert unlocked_fraction(UnlockPerTime(20.0), np.zeros(3), np.array([-5.0, 5.0, 40.0])).tolist() == [0, 0.25, 1]
    assert unlocked_fraction(UnlockAll(), np.zeros(2), np.zeros(2)).tolist() == [1, 1]


@given(rules, capacities, events)
def test_raising_to_each_target_unlocks_the_latest_target_once_and_all_of_it_at_one(rule, capacity, steps) -> None:
    locked = capacity.copy()[None]
    arrivals, elapsed = 0, 0.0
    for more, later in steps:
        arrivals, elapsed = arrivals + more, max(elapsed, later)
        target = unlocked_fraction(rule, np.array([arrivals]), np.array([elapsed]))
        locked = minus(locked, unlock_amounts(capacity[None], locked, target), up=False)
        assert np.all(locked >= 0)
        assert not unlock_amounts(capacity[None], locked, target).any()  # idempotent
        if target[0] >= 1.0:
            assert np.all(locked == 0.0)
        else:  # exactly ⌊target × capacity⌋ quanta unlocked
            unlocked = units(capacity, up=False) - units(locked[0], up=False)
            assert unlocked.tolist() == units(target[0] * capacity, up=False).tolist()


@given(capacities, st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8))
def test_unlocking_tick_by_tick_leaves_the_same_bits_as_unlocking_at_once(capacity, targets) -> None:
    targets = sorted(targets)
    stepwise = capacity.copy()[None]
    for target in targets:
        stepwise = minus(stepwise, unlock_amounts(capacity[None], stepwise, np.array([target])), up=False)
    at_once = minus(capacity[None], unlock_amounts(capacity[None], capacity[None], np.array([targets[-1]])), up=False)
    assert stepwise.tolist() == at_once.tolist()


@given(st.floats(-1e3, 1e3), st.floats(1e-3, 1e3), st.integers(0, 10**6))
def test_grid_instants_are_their_own_floor_and_anything_else_floors_below(origin, period, k) -> None:
    grid = UnlockGrid(origin, period)
    assert grid.floor(grid.instant(k)) == grid.instant(k)
    now = grid.instant(k) + period / 2
    assert grid.floor(now) == grid.instant(k) and grid.floor(now) <= now < grid.instant(k + 1)
    assert grid.floor(origin - period / 2) == -math.inf


fractions = st.floats(0.0, 1.0) | st.sampled_from([0.0, 1.0, 1e-13, 1 - 1e-13, 0.5])


@given(rules, st.integers(0, 400), st.floats(-1e4, 1e4) | st.just(-math.inf))
def test_one_blocks_target_has_the_same_bits_as_the_vector_rule(rule, arrivals, elapsed) -> None:
    expected = unlocked_fraction(rule, np.array([arrivals]), np.array([elapsed]))[0]
    assert block_unlocked_fraction(rule, float(arrivals), elapsed) == expected

"""When a waiting demand will fit under the unlock rule (docs/design.md §4.1): the earliest
time under a per-time rule and the fewest arrivals under a per-arrival rule, exact on the
very unlock computation the scheduler applies."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.budgets.capacity import block_capacity
from privsched.policies import UnlockPerArrival, UnlockPerTime
from privsched.policies.unlock import UnlockGrid, arrivals_to_fit, earliest_fit_time, fits_at_target, unlocked_fraction

RDP = Accounting.rdp()
BASIC = Accounting.basic()


@st.composite
def blocks(draw, accounting: Accounting):
    """One block's balances part-way through its unlocking, and a demand on it."""
    if accounting.is_rdp:
        capacity = block_capacity(accounting, draw(st.floats(0.5, 20.0)), 10.0 ** -draw(st.integers(3, 9)))
        alphas = np.array(accounting.alphas)
        at = int(np.argmax(capacity / alphas))  # a Gaussian's demand α/(2σ²) there is a share of capacity
        variance = alphas[at] / (2 * draw(st.floats(0.01, 1.5)) * capacity[at])
        demand = alphas / (2 * variance)  # Gaussian, Mironov 2017 Table II
    else:
        capacity = np.array([draw(st.floats(0.01, 10.0)), draw(st.floats(1e-9, 1e-3))])
        demand = capacity * np.array([draw(st.floats(0.0, 1.3)), draw(st.floats(0.0, 1.3))])
    done = draw(st.floats(0.0, 1.0))
    granted = draw(st.floats(0.0, 1.0))
    locked = capacity * (1 - done)
    unlocked = capacity * done - granted * demand  # a grant of a similar demand: RDP may go negative
    return capacity, locked, unlocked, demand


def _one(block):
    return tuple(np.asarray(x, dtype=float)[None] for x in block)


def _fits_at_time(rule, accounting, block, created, t, grid=None):
    capacity, locked, unlocked, demand = _one(block)
    counted = t if grid is None else grid.floor(t)
    target = unlocked_fraction(rule, np.zeros(1), np.array([counted - created]))
    return bool(fits_at_target(accounting, demand, unlocked, capacity, locked, target)[0])


accountings = st.sampled_from([RDP, BASIC])


@given(st.data(), accountings, st.floats(1.0, 1e6), st.floats(0.0, 2e9), st.floats(0.0, 1.2))
def test_at_the_estimated_time_the_demand_fits_and_just_before_it_does_not(data, accounting, lifetime, created, waited):
    block = data.draw(blocks(accounting))
    rule, now = UnlockPerTime(lifetime), created + waited * lifetime
    capacity, locked, unlocked, demand = _one(block)
    t = earliest_fit_time(rule, accounting, demand, unlocked, capacity, locked, np.zeros(1), np.array([created]), now)[0]
    if math.isinf(t):
        assert not _fits_at_time(rule, accounting, block, created, created + 2 * lifetime)
    elif t == now:
        assert _fits_at_time(rule, accounting, block, created, now)
    else:
        assert now < t <= created + lifetime * (1 + 1e-9) + 1
        assert _fits_at_time(rule, accounting, block, created, t)
        assert not _fits_at_time(rule, accounting, block, created, math.nextafter(t, -math.inf))


@given(st.data(), accountings, st.floats(10.0, 1e4), st.floats(0.1, 100.0), st.floats(0.0, 1.2))
def test_on_a_grid_the_estimate_is_the_first_instant_the_demand_fits(data, accounting, lifetime, period, waited):
    block = data.draw(blocks(accounting))
    rule, grid, wait = UnlockPerTime(lifetime), UnlockGrid(0.0, period), waited * lifetime
    capacity, locked, unlocked, demand = _one(block)
    t = earliest_fit_time(rule, accounting, demand, unlocked, capacity, locked, np.zeros(1), np.zeros(1), wait, grid)[0]
    if math.isinf(t):
        assert not _fits_at_time(rule, accounting, block, 0.0, 2 * lifetime + period, grid)
    elif t == wait:
        assert _fits_at_time(rule, accounting, block, 0.0, wait, grid)
    else:
        assert grid.floor(t) == t > wait
        assert _fits_at_time(rule, accounting, block, 0.0, t, grid)
        assert not _fits_at_time(rule, accounting, block, 0.0, grid.instant(grid.index(t) - 1), grid)


@given(st.data(), accountings, st.integers(1, 200), st.integers(0, 100))
def test_after_the_estimated_arrivals_the_demand_fits_and_one_fewer_does_not(data, accounting, n, arrivals):
    block = data.draw(blocks(accounting))
    rule = UnlockPerArrival(n)
    capacity, locked, unlocked, demand = _one(block)
    k = arrivals_to_fit(rule, accounting, demand, unlocked, capacity, locked, np.array([arrivals]), np.zeros(1))[0]

    def fits(more: int) -> bool:
        target = unlocked_fraction(rule, np.array([arrivals + more]), np.zeros(1))
        return bool(fits_at_target(accounting, demand, unlocked, capacity, locked, target)[0])

    if k < 0:
        assert not fits(10 * n + 10)
    else:
        assert fits(int(k)) and (k == 0 or not fits(int(k) - 1))


def test_a_quarter_of_a_block_short_waits_a_quarter_of_its_lifetime_or_n_over_four_arrivals():
    capacity, locked, unlocked = np.array([[1.0, 1e-6]]), np.array([[0.5, 5e-7]]), np.array([[0.5, 5e-7]])
    demand = np.array([[0.75, 0.0]])
    t = earliest_fit_time(UnlockPerTime(100.0), BASIC, demand, unlocked, capacity, locked, np.zeros(1), np.array([1000.0]), 1050.0)
    assert t[0] == 1075.0
    k = arrivals_to_fit(UnlockPerArrival(8), BASIC, demand, unlocked, capacity, locked, np.array([4]), np.zeros(1))
    assert k.tolist() == [2]


def test_a_demand_beyond_what_is_locked_never_fits_and_one_that_fits_now_waits_for_nothing():
    capacity, locked, unlocked = np.array([[1.0, 1e-6]] * 2), np.array([[0.2, 2e-7]] * 2), np.array([[0.1, 1e-7]] * 2)
    demand = np.array([[0.5, 0.0], [0.05, 0.0]])
    t = earliest_fit_time(UnlockPerTime(10.0), BASIC, demand, unlocked, capacity, locked, np.zeros(2), np.zeros(2), 5.0)
    assert t.tolist() == [math.inf, 5.0]
    k = arrivals_to_fit(UnlockPerArrival(4), BASIC, demand, unlocked, capacity, locked, np.ones(2), np.zeros(2))
    assert k.tolist() == [-1, 0]

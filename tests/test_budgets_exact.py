"""Exact admission arithmetic (privsched.budgets.exact, docs/design.md §3.3): decimal demands
add up exactly, rounding only ever refuses, and the ledger, the quota check and the
policies' fit test agree to the quantum."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets import Accounting
from privsched.budgets.exact import BUDGET, DIGITS, EXACT, LIMIT, minus, on_grid, plus, raised_of, raised_units, share_of, units, units_of
from privsched.ledger import Ledger
from privsched.ledger.identities import Identities, User
from privsched.ledger.models import PipelineRequest
from privsched.policies import Snapshot, admit_in_order

BASIC = Accounting.basic()
QUANTUM = Fraction(1, 10**DIGITS)
few = settings(max_examples=25, deadline=None)


def decimal(n: int, digits: int) -> float:
    """The float of the decimal n · 10^-digits."""
    return float(Decimal(n).scaleb(-digits))


@given(st.integers(-EXACT, EXACT))
def test_a_decimal_of_at_most_twelve_digits_is_taken_exactly_both_ways(n):
    x = decimal(n, DIGITS)
    assert int(units(x, up=True)) == n == int(units(x, up=False))


@given(st.floats(-1e3, 1e3, allow_nan=False))
def test_any_other_float_rounds_up_as_a_demand_and_down_as_a_budget(x):
    exact = Fraction(x) / QUANTUM
    nearest = round(exact)
    if decimal(nearest, DIGITS) == x:  # the float of a decimal: taken as that decimal
        assert int(units(x, up=False)) == nearest == int(units(x, up=True))
    else:
        assert int(units(x, up=False)) <= exact <= int(units(x, up=True))


def test_nan_and_huge_values_saturate_towards_refusal():
    assert units(np.nan, up=True) == LIMIT and units(np.nan, up=False) == -LIMIT
    assert units(1e300, up=True) == LIMIT and units(1e300, up=False) == BUDGET
    assert not BASIC.fits(np.array([1e300, 0.0]), np.array([1e300, 1.0]), np.ones(2, dtype=bool))


def test_one_hundred_demands_of_one_hundredth_fill_a_capacity_of_one_exactly():
    assert sum([0.01] * 100) > 1.0  # in floats the last one would not fit
    left = np.array([1.0, 1e-6])
    for _ in range(99):
        left = minus(left, np.array([0.01, 0.0]), up=False)
    assert BASIC.fits(np.array([0.01, 0.0]), left, np.ones(2, dtype=bool))
    assert minus(left, np.array([0.01, 0.0]), up=False).tolist() == [0.0, 1e-6]


@given(st.integers(0, 3 * 10**6), st.integers(0, 3 * 10**6), st.integers(3, 12), st.integers(3, 12))
def test_plus_and_minus_of_decimals_are_the_decimals_of_the_sum_and_difference(a, b, da, db):
    x, y = decimal(a, da), decimal(b, db)
    exact_sum = Decimal(a).scaleb(-da) + Decimal(b).scaleb(-db)
    assert plus(x, y, up=True).item() == float(exact_sum)
    assert minus(x, y, up=False).item() == float(Decimal(a).scaleb(-da) - Decimal(b).scaleb(-db))


@given(st.integers(0, 1000), st.integers(-(4 * 10**9), 4 * 10**9), st.integers(6, 12))
def test_a_share_of_a_capacity_is_its_exact_product_rounded_down(per_mille, quanta, digits):
    share, capacity = decimal(per_mille, 3), decimal(quanta, digits)
    exact = Fraction(per_mille, 1000) * Fraction(quanta, 10**digits) / QUANTUM
    assert int(share_of(share, np.array([capacity]))[0]) == exact.__floor__()


#: Up to 40 decimal demands of 2 to 6 digits after the point, summing to at most 1,000.
decimal_demands = (
    st.lists(st.integers(1, 10**6), min_size=1, max_size=40)
    .flatmap(lambda ns: st.tuples(st.just(ns), st.integers(2, 6)))
    .filter(lambda drawn: sum(drawn[0]) <= 10 ** (drawn[1] + 3))
)


def one_block_snapshot(demands: list[float], capacity: float) -> Snapshot:
    n = len(demands)
    return Snapshot(
        accounting=BASIC,
        capacity=np.array([[capacity, 1e-6]]),
        unlocked=np.array([[capacity, 1e-6]]),
        pipeline_ids=np.arange(n),
        arrival=np.arange(n, dtype=float),
        weight=np.ones(n),
        edge_pipeline=np.arange(n),
        edge_block=np.zeros(n, dtype=np.intp),
        edge_demand=np.array([[d, 0.0] for d in demands]).reshape(n, 2),
    )


@given(decimal_demands)
def test_decimal_demands_summing_to_the_capacity_all_fit_in_a_policy_pass_and_one_more_quantum_never(drawn):
    ns, digits = drawn
    demands = [decimal(n, digits) for n in ns]
    capacity = decimal(sum(ns), digits)
    assert len(admit_in_order(one_block_snapshot(demands, capacity), np.arange(len(ns)))) == len(ns)
    more = one_block_snapshot([*demands, float(QUANTUM)], capacity)
    assert admit_in_order(more, np.arange(len(ns) + 1)).tolist() == list(range(len(ns)))


def request(name: str, epsilon: float) -> PipelineRequest:
    return PipelineRequest(name, "d", ["b0"], demand=np.array([epsilon, 0.0]))


@few
@given(decimal_demands)
def test_the_ledger_grants_decimal_demands_summing_to_the_capacity_and_refuses_one_more_quantum(tmp_path_factory, drawn):
    ns, digits = drawn
    with Ledger.init(tmp_path_factory.mktemp("exact") / "l.db") as ledger:
        ledger.create_dataset("d", decimal(sum(ns), digits), 1e-6, accounting="basic")
        ledger.add_blocks("d", ["b0"], unlocked_fraction=1.0)
        ids = ledger.submit_many([request(f"p{i}", decimal(n, digits)) for i, n in enumerate(ns)])
        assert ledger.grant(ids) == ids
        extra = ledger.submit(request("extra", float(QUANTUM)))
        assert ledger.grant([extra]) == []
        block = ledger.get_block("d", "b0")
        assert block.unlocked[0] == 0.0 and block.allocated[0] == block.capacity[0]
        assert BASIC.is_safe([block.allocated, block.consumed], block.capacity)
        assert ledger.audit().ok


@pytest.fixture
def team_ledger(tmp_path: Path):
    def make(share: float) -> tuple[Ledger, callable]:
        path = tmp_path / f"quota-{share}.db"
        ledger = Ledger.init(path)
        dataset = ledger.create_dataset("d", 1.0, 1e-6, accounting="basic")
        ledger.add_blocks("d", ["b0"], unlocked_fraction=1.0)
        with Identities(path) as identities:
            identities.set_quota(dataset.id, "blue", share)

        def submit(epsilon: float) -> int:
            claim = Identities.claim(ledger.db, [(User("member", "user", "blue", 0.0), None)])
            return ledger.submit_many([request("p", epsilon)], claim=claim)[0]

        return ledger, submit

    return make


def test_a_quota_of_three_tenths_admits_three_steps_of_one_tenth(team_ledger):
    ledger, submit = team_ledger(0.3)
    granted = [ledger.grant([submit(0.1)]) for _ in range(4)]
    assert [len(g) for g in granted] == [1, 1, 1, 0]
    ledger.close()


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 100), st.integers(1, 40))
def test_a_quota_admits_exactly_the_whole_steps_it_holds(tmp_path_factory, hundredths, step_thousandths):
    share, step = decimal(hundredths, 2), decimal(step_thousandths, 3)
    steps = (Fraction(hundredths, 100) / Fraction(step_thousandths, 1000)).__floor__()
    path = tmp_path_factory.mktemp("quota") / "q.db"
    with Ledger.init(path) as ledger:
        dataset = ledger.create_dataset("d", 1.0, 1e-6, accounting="basic")
        ledger.add_blocks("d", ["b0"], unlocked_fraction=1.0)
        with Identities(path) as identities:
            identities.set_quota(dataset.id, "blue", share)
        claim = Identities.claim(ledger.db, [(User("member", "user", "blue", 0.0), None)] * (steps + 1))
        ids = ledger.submit_many([request(f"p{i}", step) for i in range(steps + 1)], claim=claim)
        assert ledger.grant(ids) == ids[:steps]


def test_the_safety_invariant_adds_what_was_given_out_exactly():
    live = np.ones(2, dtype=bool)
    assert 0.1 + 0.2 > 0.3  # a float sum would call this unsafe
    assert BASIC.is_safe([np.array([0.1, 0.0]), np.array([0.2, 0.0])], np.array([0.3, 1e-6]))
    assert not BASIC.is_safe([np.array([0.1, 0.0]), np.array([0.2 + 1e-12, 0.0])], np.array([0.3, 1e-6]))
    assert BASIC.fits(np.array([0.3, 0.0]), plus(np.array([0.1, 0.0]), np.array([0.2, 1e-6]), up=False), live)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-EXACT, EXACT).map(lambda n: decimal(n, DIGITS)), st.booleans())
def test_one_float_in_python_numbers_gives_the_quanta_of_the_vector_rule(x, up):
    assert units_of(x, up) == int(units(x, up))


@given(
    st.lists(st.tuples(st.floats(-10.0, 100.0), st.floats(0.0, 1.0)), min_size=1, max_size=12),
    st.floats(0.0, 1.0) | st.just(1.0),
)
def test_raising_one_block_in_python_numbers_moves_what_the_vector_rule_moves(dims, target):
    capacity = np.array([[c for c, _ in dims]])
    capacity_units = units(capacity, up=False)
    locked_units = (capacity_units * np.array([[f for _, f in dims]])).astype(np.int64)
    expected = raised_units(capacity, capacity_units, locked_units, np.array([target]))[0]
    assert raised_of(capacity[0].tolist(), capacity_units[0].tolist(), locked_units[0].tolist(), target) == expected.tolist()


def test_off_the_grid_values_are_not_on_it_and_decimals_are():
    assert on_grid(np.array([0.1, 1e-9, 0.0, -2.5]))
    assert not on_grid(np.array([0.1, 1 / 3]))

"""The macrobenchmark's units of privacy: each unit's block layout and what a pipeline asks."""

from __future__ import annotations

import numpy as np
import pytest

import workloads
from privsched.simulation.api import resolve_policy, run
from tests.test_sim_generated import assert_generated_equals_validated


def _asked(instance) -> list[set[str]]:
    """The block ids each pipeline of a compiled instance asks for."""
    start, ids = instance.edge_start, instance.block_ids[instance.edge_block]
    return [set(ids[start[i] : start[i + 1]]) for i in range(instance.n_pipelines)]


def test_user_unit_pipelines_ask_for_every_user_block():
    w = workloads.generate("macro-rdp", seed=1, days=6, pipelines_per_day=30, unit="user", partitions=3)
    assert w.block_ids == ["u0", "u1", "u2"]
    assert all(asked == {"u0", "u1", "u2"} for asked in _asked(w.instance))


def test_user_time_pipelines_ask_for_every_partition_of_the_days_an_event_pipeline_asks():
    event = workloads.generate("macro-rdp", seed=2, days=6, pipelines_per_day=30)
    user_time = workloads.generate("macro-rdp", seed=2, days=6, pipelines_per_day=30, unit="user-time", partitions=3)
    assert len(user_time.block_ids) == 18
    for days, asked in zip(_asked(event.instance), _asked(user_time.instance), strict=True):
        assert asked == {f"u{p}-{day}" for day in days for p in range(3)}


def test_user_time_blocks_arrive_with_their_day():
    w = workloads.generate("macro-rdp", seed=0, days=3, pipelines_per_day=5, unit="user-time", partitions=2, block_period=10.0)
    assert dict(zip(w.block_ids, w.block_arrival.tolist())) == {
        "u0-day0": 0,
        "u1-day0": 0,
        "u0-day1": 10,
        "u1-day1": 10,
        "u0-day2": 20,
        "u1-day2": 20,
    }


def test_a_contribution_bound_of_k_makes_statistics_read_k_times_the_days():
    one = workloads.generate("macro-rdp", seed=4, days=40, pipelines_per_day=20, unit="user-time", partitions=1)
    two = workloads.generate("macro-rdp", seed=4, days=40, pipelines_per_day=20, unit="user-time", partitions=1, rows_per_user=2)
    mice = one.klass == 0
    days_one = np.diff(one.block_lists[0])[mice]
    days_two = np.diff(two.block_lists[0])[mice]
    assert np.all(days_two >= days_one) and np.any(days_two > days_one)
    assert np.array_equal(np.diff(one.block_lists[0])[~mice], np.diff(two.block_lists[0])[~mice])


def test_user_time_with_one_row_a_day_grants_what_event_grants_and_user_grants_fewer():
    granted = {}
    for unit in ("event", "user-time", "user"):
        w = workloads.generate("macro-rdp", seed=5, days=5, pipelines_per_day=100, unit=unit)
        granted[unit] = run(unit, w.instance, resolve_policy("dpf-n", n=100)).granted
    assert granted["user-time"] == granted["event"] > granted["user"]


@pytest.mark.parametrize(
    ("params", "message"),
    [({"unit": "person"}, "unit must be one of"), ({"partitions": 3}, "apply to the user and user-time units only")],
)
def test_bad_unit_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=message):
        workloads.generate("macro-rdp", days=2, pipelines_per_day=5, **params)


@pytest.mark.parametrize("unit", ["user", "user-time"])
def test_grants_do_not_depend_on_the_number_of_user_partitions(unit):
    granted = set()
    for partitions in (1, 3):
        w = workloads.generate("macro-rdp", seed=6, days=4, pipelines_per_day=60, unit=unit, partitions=partitions)
        granted.add(run(unit, w.instance, resolve_policy("dpf-n", n=50)).granted)
    assert len(granted) == 1


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
@pytest.mark.parametrize("unit", ["user", "user-time"])
def test_a_unit_layout_compiles_to_the_arrays_of_its_validated_trace(unit):
    assert_generated_equals_validated(
        workloads.generate("macro-rdp", seed=4, days=5, pipelines_per_day=60, unit=unit, partitions=2, rows_per_user=2)
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"unit": "user-time", "days": 1000, "partitions": 1000}, "user-time blocks, more than the limit"),
        ({"unit": "user", "days": 100, "pipelines_per_day": 9000, "partitions": 1000}, "blocks in all, more than the limit"),
        ({"unit": "user", "partitions": 1001}, "partitions"),
        ({"unit": "user-time", "rows_per_user": 0}, "rows_per_user"),
        ({"partitions": 4}, "apply to the user and user-time units only"),
    ],
)
def test_a_unit_layout_too_large_or_out_of_range_is_refused_before_it_is_built(params, message):
    with pytest.raises(ValueError, match=message):
        workloads.generate("macro-rdp", **{"days": 2, "pipelines_per_day": 5, **params})


def one_block_bound(instance):
    """``benchmarks/units.py``'s bound (the benchmarks folder is scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("units_benchmark", Path(__file__).resolve().parents[1] / "benchmarks" / "units.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.one_block_bound(instance)


@pytest.mark.parametrize("policy", ["dpf-n", "dpack-n"])
def test_no_policy_grants_more_under_user_than_one_user_blocks_smallest_first_bound(policy):
    w = workloads.generate("macro-rdp", seed=3, days=4, pipelines_per_day=120, unit="user", partitions=2)
    bound = one_block_bound(w.instance)
    granted = run("macro", w.instance, resolve_policy(policy, n=w.instance.n_pipelines)).granted
    assert bound is not None and bound < w.instance.n_pipelines  # the user block is oversubscribed
    assert bound - 5 <= granted <= bound


def test_the_one_block_bound_applies_only_where_every_pipeline_asks_the_first_block():
    assert one_block_bound(workloads.generate("macro-rdp", seed=3, days=4, pipelines_per_day=30).instance) is None

"""The heterogeneous workload (DPack, EuroSys'25 microbenchmarks): its curve zoo, best-order
and block-count distributions, and the paper artifact's controlled task sizes, curve ranges
and random block selection."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import truncnorm
from typer.testing import CliRunner

import workloads
from privsched.budgets.accounting import DEFAULT_ALPHAS
from privsched.budgets.mechanisms import mechanism_json, parse_mechanism
from privsched.cli import app
from privsched.policies import make_policy
from privsched.simulation.offline import compare_offline
from privsched.simulation.trace import LastBlocks, load_trace
from workloads.heterogeneous import (
    FAMILIES,
    SIZE_RANGE,
    block_count_probabilities,
    curve_range,
    truncated_normal,
    zoo,
)


def _shares(instance) -> np.ndarray:
    """Each edge's demand as a share of its block's capacity (dead orders: inf)."""
    capacity = instance.capacity[instance.edge_block]
    return np.where(capacity > 0, instance.edge_demand / np.where(capacity > 0, capacity, 1), np.inf)


def _best_orders(instance) -> np.ndarray:
    """Each edge's best order: where its demand is the smallest share of the block's capacity."""
    return np.asarray(instance.accounting.alphas)[np.argmin(_shares(instance), axis=1)]


def test_zoo_holds_the_papers_mechanisms_at_sizes_between_one_and_hundred_percent():
    curves = zoo()
    families, best, size = curves.families, curves.best, curves.size
    assert set(families) == set(FAMILIES)
    assert np.all((size > 0.01) & (size < 1.0))
    alphas = np.asarray(DEFAULT_ALPHAS)
    dp_sgd = np.array([f == "dp-sgd" for f in families])
    laplace = np.array([f == "laplace" for f in families])
    assert set(alphas[best[dp_sgd]]) & {3.0, 4.0}  # steep DP-SGD curves are cheapest at small orders
    assert 64.0 in set(alphas[best[laplace]])  # flat Laplace curves at the largest


def test_alpha_std_zero_puts_every_best_order_at_five_and_larger_spreads_them():
    homogeneous = workloads.generate("heterogeneous", seed=4, duration=20.0, alpha_std=0.0).instance
    assert set(_best_orders(homogeneous)) == {5.0}
    spread = workloads.generate("heterogeneous", seed=4, duration=20.0).instance
    orders = _best_orders(spread)
    assert len(set(orders)) >= 5
    assert (orders == 5.0).mean() < 0.4  # bins drawn uniformly: α = 5 is one of eight


def test_tasks_ask_for_the_latest_blocks_with_a_normal_count_and_arrive_in_batches():
    instance = workloads.generate("heterogeneous", seed=5, duration=100.0, blocks_mean=3.0, blocks_std=0.0).instance
    assert set(np.diff(instance.edge_start)) == {3}
    assert set(np.unique(instance.arrival)) <= {10.0 * k for k in range(1, 11)}
    assert 1000 * 0.9 < instance.n_pipelines < 1000 * 1.1  # 100 tasks per 10 s block period
    assert np.all(np.isinf(instance.timeout))  # tasks wait until the end, as in the paper
    p = block_count_probabilities(1.0, 5.0, 10)
    assert p.argmax() == 0 and np.all(np.diff(p) < 0) and p.sum() == pytest.approx(1.0)


def test_rejects_impossible_distributions():
    with pytest.raises(ValueError, match="alpha_std"):
        workloads.generate("heterogeneous", duration=10.0, alpha_std=-1.0)
    with pytest.raises(ValueError, match="blocks_mean"):
        workloads.generate("heterogeneous", duration=10.0, blocks_mean=12.0)


def test_controlled_sizes_follow_the_requested_normal_inside_the_zoos_range():
    instance = workloads.generate("heterogeneous", seed=3, size_mean=0.05, size_std=0.01).instance
    size = _shares(instance).min(axis=1)
    assert len(size) > 2500
    assert np.all((size >= SIZE_RANGE[0]) & (size <= SIZE_RANGE[1]))
    assert size.mean() == pytest.approx(0.05, abs=0.002)  # ~10 standard errors
    assert size.std() == pytest.approx(0.01, rel=0.1)


def test_a_wide_size_spread_is_truncated_to_the_zoos_range():
    low, high = SIZE_RANGE
    draws = truncated_normal(np.random.default_rng(0), 0.02, 0.05, 20000)
    assert np.all((draws >= low) & (draws <= high))
    expected = truncnorm.mean((low - 0.02) / 0.05, (high - 0.02) / 0.05, loc=0.02, scale=0.05)
    assert draws.mean() == pytest.approx(expected, abs=0.002)


def test_every_task_of_one_size_has_exactly_that_size_without_spread():
    instance = workloads.generate("heterogeneous", seed=2, duration=30.0, size_mean=0.1).instance
    np.testing.assert_allclose(_shares(instance).min(axis=1), 0.1, rtol=1e-12)


def test_scaling_keeps_each_tasks_mechanism_shape_best_order_blocks_and_family():
    own = workloads.generate("heterogeneous", seed=4, duration=40.0)
    scaled = workloads.generate("heterogeneous", seed=4, duration=40.0, size_mean=0.05, size_std=0.01)
    a, b = own.instance, scaled.instance
    assert a.arrival.tolist() == b.arrival.tolist() and a.edge_block.tolist() == b.edge_block.tolist()
    assert a.klass.tolist() == b.klass.tolist()
    np.testing.assert_array_equal(np.argmin(_shares(a), axis=1), np.argmin(_shares(b), axis=1))
    factor = b.edge_demand / a.edge_demand  # one constant per task, at every order
    np.testing.assert_allclose(factor, factor[:, :1] * np.ones_like(factor), rtol=1e-9)
    assert all(p.curve is not None and p.mechanism is None for p in scaled.pipelines)


def test_without_sizes_tasks_keep_their_mechanisms_and_the_same_draws():
    default = workloads.generate("heterogeneous", seed=5, duration=30.0)
    assert default.to_dict() == workloads.generate("heterogeneous", seed=5, duration=30.0, size_mean=None).to_dict()
    families, mechanisms, _, _, _ = zoo()
    known = {mechanism_json(parse_mechanism(m)) for m in mechanisms}
    assert all(p.curve is None and mechanism_json(p.mechanism) in known for p in default.pipelines)
    assert {p.klass for p in default.pipelines} <= set(families)


@pytest.mark.parametrize(
    "params,message",
    [
        ({"size_mean": 1.5}, "size_mean must be a number in (0.01, 1), got 1.5"),
        ({"size_mean": 0.01}, "size_mean must be a number in (0.01, 1), got 0.01"),
        ({"size_mean": "big"}, "size_mean must be a number (finite), got 'big'"),
        ({"size_mean": 0.05, "size_std": -0.1}, "size_std must be a finite non-negative number, got -0.1"),
        ({"size_mean": 0.05, "size_std": float("nan")}, "size_std must be a number (finite), got nan"),
        ({"size_std": 0.01}, "size_std applies only with size_mean, got size_std=0.01 without it"),
        ({"range_mean": 0}, "range_mean must be a finite positive number, got 0"),
        ({"range_mean": -0.05}, "range_mean must be a finite positive number, got -0.05"),
        ({"range_mean": "wide"}, "range_mean must be a number (finite), got 'wide'"),
        ({"range_mean": float("inf")}, "range_mean must be a number (finite), got inf"),
        ({"range_mean": 0.05, "range_std": -1}, "range_std must be a finite non-negative number, got -1"),
        ({"range_std": 0.03}, "range_std applies only with range_mean, got range_std=0.03 without it"),
        ({"block_selection": "oldest"}, "block_selection must be 'latest' or 'random', got 'oldest'"),
    ],
)
def test_bad_size_range_and_selection_parameters_are_one_line_errors(params, message):
    with pytest.raises(ValueError) as error:
        workloads.generate("heterogeneous", duration=10.0, **params)
    assert str(error.value).endswith(message)  # the generator's own check, or its signature's


def test_the_cli_passes_sizes_ranges_and_selection_through_and_rejects_bad_ones_writing_nothing(tmp_path):
    runner = CliRunner()
    out = tmp_path / "trace.json"
    ok = runner.invoke(
        app,
        [
            "trace",
            "heterogeneous",
            "--duration",
            "20",
            "--out",
            str(out),
            "--param",
            "size_mean=0.1",
            "--param",
            "size_std=0",
            "--param",
            "range_mean=0.04",
            "--param",
            "block_selection=random",
        ],
    )
    assert ok.exit_code == 0, ok.output
    trace = load_trace(out)
    np.testing.assert_allclose(_shares(trace.instance).min(axis=1), 0.1, rtol=1e-12)
    np.testing.assert_allclose(curve_range(_shares(trace.instance)), 0.04, rtol=1e-9)
    assert all(isinstance(p.blocks, list) for p in trace.pipelines)
    for param, message in (
        ("size_mean=2", "size_mean must be a number in (0.01, 1), got 2"),
        ("block_selection=oldest", "block_selection must be 'latest' or 'random', got 'oldest'"),
    ):
        bad = runner.invoke(app, ["simulate", "heterogeneous", "--policy", "fcfs", "--out", str(tmp_path / "run"), "--param", param])
        assert bad.exit_code != 0
        assert bad.output.strip() == f"error: {message}"
        assert not (tmp_path / "run").exists()


def test_offline_with_the_papers_sizes_dpack_packs_the_optimum_and_a_third_more_than_dpf():
    # One block, every best order at α = 5, sizes 0.05 ± 0.01 (the paper artifact's): DPF's
    # dominant share (the worst order) is unrelated to the cost at α = 5. Per seed the ratio
    # ranges 1.23–1.50 over seeds 0–9, so the claim is on the total over seeds 0–2.
    granted = {"dpf": 0.0, "dpack": 0.0}
    for seed in (0, 1, 2):
        instance = workloads.generate(
            "heterogeneous",
            seed=seed,
            duration=1.0,
            rate=200.0,
            batch=None,
            initial_blocks=1,
            max_blocks=1,
            blocks_mean=1.0,
            blocks_std=0.0,
            alpha_std=0.0,
            size_mean=0.05,
            size_std=0.01,
        ).instance
        policies = {"dpf": make_policy("dpf-n", n=1).policy, "dpack": make_policy("dpack", k=1).policy}
        result = compare_offline(instance, policies, time_limit=30.0)
        assert result.proven_optimal and result.gap("dpack") <= 0.05
        for name in granted:
            granted[name] += result.granted[name]
    assert granted["dpack"] >= 1.3 * granted["dpf"]


def _bent(seed: int, duration: float = 30.0, **params):
    """A trace with the artifact's sizes 0.05 ± 0.01 (and whatever range ``params`` ask for)."""
    return workloads.generate("heterogeneous", seed=seed, duration=duration, size_mean=0.05, size_std=0.01, **params)


def test_bending_keeps_each_tasks_best_order_and_size_and_sets_the_requested_range():
    sized = _bent(6).instance
    bent = _bent(6, range_mean=0.07).instance
    before, after = _shares(sized), _shares(bent)
    np.testing.assert_array_equal(np.argmin(after, axis=1), np.argmin(before, axis=1))
    np.testing.assert_allclose(after.min(axis=1), before.min(axis=1), rtol=1e-12)
    np.testing.assert_allclose(curve_range(after), 0.07, rtol=1e-9)
    assert not np.allclose(curve_range(before), 0.07, rtol=0.01)  # the mechanisms' own ranges differ


def test_bent_curves_are_finite_non_negative_demands_with_ranges_from_the_truncated_normal():
    trace = _bent(7, range_mean=0.05, range_std=0.03, duration=100.0)
    curves = np.array([p.curve for p in trace.pipelines])
    assert np.all(np.isfinite(curves)) and np.all(curves >= 0)
    share = _shares(trace.instance)
    live = np.isfinite(share[0])
    assert live.sum() == 8 and np.all(share[:, live] >= share.min(axis=1, keepdims=True))
    ranges = curve_range(share)
    assert len(ranges) > 900 and np.all(ranges > 0)
    expected = truncnorm.mean(-0.05 / 0.03, np.inf, loc=0.05, scale=0.03)
    assert ranges.mean() == pytest.approx(expected, abs=0.003)  # ~3 standard errors
    assert ranges.std() == pytest.approx(truncnorm.std(-0.05 / 0.03, np.inf, loc=0.05, scale=0.03), rel=0.1)


def test_bending_applies_to_the_mechanisms_own_sizes_too():
    own = workloads.generate("heterogeneous", seed=8, duration=20.0).instance
    bent = workloads.generate("heterogeneous", seed=8, duration=20.0, range_mean=0.02).instance
    np.testing.assert_allclose(_shares(bent).min(axis=1), _shares(own).min(axis=1), rtol=1e-12)
    np.testing.assert_allclose(curve_range(_shares(bent)), 0.02, rtol=1e-9)


def test_random_selection_picks_distinct_existing_blocks_not_only_the_latest():
    trace = workloads.generate(
        "heterogeneous", seed=9, duration=60.0, blocks_mean=3.0, blocks_std=0.0, initial_blocks=2, block_selection="random"
    )
    arrival = {b.id: b.arrival for b in trace.blocks}
    older = 0
    for p in trace.pipelines:
        existing = sorted((j for j, b in enumerate(trace.blocks) if b.arrival <= p.arrival))
        assert isinstance(p.blocks, list) and len(set(p.blocks)) == len(p.blocks) == min(3, len(existing))
        assert all(arrival[b] <= p.arrival for b in p.blocks)
        latest = {trace.blocks[j].id for j in existing[-3:]}
        older += set(p.blocks) != latest
    assert older > len(trace.pipelines) / 2
    counts = np.bincount(trace.instance.edge_block.ravel(), minlength=len(trace.blocks))
    assert counts[0] > counts[-1]  # the first blocks are drawn from longest


def test_the_default_block_selection_and_no_range_change_nothing():
    default = workloads.generate("heterogeneous", seed=5, duration=30.0, size_mean=0.05, size_std=0.01)
    explicit = workloads.generate(
        "heterogeneous", seed=5, duration=30.0, size_mean=0.05, size_std=0.01, range_mean=None, range_std=0.0, block_selection="latest"
    )
    assert default.to_dict() == explicit.to_dict()
    assert all(isinstance(p.blocks, LastBlocks) for p in default.pipelines)


def test_offline_on_the_artifacts_one_block_construction_dpack_reaches_the_optimum_and_beats_dpf_by_a_third():
    # One block, best orders at α = 5, sizes 0.05 ± 0.01 bent to ranges 0.05 ± 0.03: DPack
    # (K = 1) grants 30, 28, 27 on seeds 0-2, the proven optimum, and DPF 21, 19, 19.
    for seed in (0, 1, 2):
        instance = workloads.generate(
            "heterogeneous",
            seed=seed,
            duration=1.0,
            rate=200.0,
            batch=None,
            initial_blocks=1,
            max_blocks=1,
            blocks_mean=1.0,
            blocks_std=0.0,
            alpha_std=0.0,
            size_mean=0.05,
            size_std=0.01,
            range_mean=0.05,
            range_std=0.03,
        ).instance
        policies = {"dpf": make_policy("dpf-n", n=1).policy, "dpack": make_policy("dpack", k=1).policy}
        result = compare_offline(instance, policies, time_limit=30.0)
        assert result.proven_optimal and result.gap("dpack") <= 0.05
        assert result.granted["dpack"] >= 1.3 * result.granted["dpf"]


def test_the_zoos_laplace_noise_is_the_mechanism_the_scheduler_plans_for_a_laplace_count():
    from privsched.statistics.queries import StatisticJob, statistic_mechanism
    from workloads.heterogeneous import RDP, laplace

    count = StatisticJob(query="count", noise="laplace")
    for scale in np.geomspace(0.01, 10, 100).tolist():
        assert laplace(scale) == statistic_mechanism(count, 1.0 / scale, 0.0, RDP).model_dump()

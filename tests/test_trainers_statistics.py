"""DP statistics: unbiased releases, clipped contributions, reported spend."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privsched.budgets import Accounting, demand_vector, mechanism_json
from privsched.jobs.builtin import plan_mechanism, run_builtin
from privsched.jobs.context import BlockGrant, JobContext
from privsched.trainers.data import read_block_files
from privsched.trainers.plans import parse_job
from privsched.trainers.statistics import dp_statistic
from workloads.reviews import write_blocks

VALUES = np.array([-4.0, 0.5, 1.0, 2.0, 2.5, 3.0, 9.0, 4.0])


def releases(job: dict, epsilon: float, draws: int, delta: float = 1e-6) -> list:
    spec = parse_job(job)
    mechanism = plan_mechanism(job, epsilon, delta, Accounting.rdp())
    rng = np.random.default_rng(0)
    return [dp_statistic(spec, mechanism, VALUES, len(VALUES), rng)["value"] for _ in range(draws)]


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_count_sum_and_histogram_are_unbiased(noise):
    bounds = [0.0, 4.0]
    clipped = np.clip(VALUES, *bounds)
    count = releases({"kind": "statistic", "query": "count", "mechanism": noise}, 1.0, 4000)
    assert np.mean(count) == pytest.approx(len(VALUES), abs=0.3)
    total = releases({"kind": "statistic", "query": "sum", "column": "v", "bounds": bounds, "mechanism": noise}, 1.0, 4000)
    assert np.mean(total) == pytest.approx(clipped.sum(), abs=1.0)
    job = {"kind": "statistic", "query": "histogram", "column": "v", "bounds": bounds, "bins": 4, "mechanism": noise}
    histogram = np.mean(releases(job, 1.0, 4000), axis=0)
    exact, _ = np.histogram(clipped, bins=4, range=bounds)
    assert histogram == pytest.approx(exact, abs=0.3)


def test_contributions_are_clipped_to_the_bounds():
    job = {"kind": "statistic", "query": "sum", "column": "v", "bounds": [0.0, 4.0]}
    # with a huge ε the noise is negligible: the release is the clipped sum, not the raw one
    (value,) = releases(job, 1e6, 1)
    assert value == pytest.approx(np.clip(VALUES, 0, 4).sum(), abs=1e-3)
    assert abs(value - VALUES.sum()) > 0.5  # raw sum 18, clipped 17


def test_a_mean_stays_within_its_bounds_even_when_noise_is_large():
    job = {"kind": "statistic", "query": "mean", "column": "v", "bounds": [1.0, 3.0]}
    means = np.array(releases(job, 0.01, 500))
    assert np.all((means >= 1.0) & (means <= 3.0))
    accurate = releases(job, 1e6, 1)[0]
    assert accurate == pytest.approx(np.clip(VALUES, 1, 3).mean(), abs=1e-3)


def test_noise_scale_follows_epsilon():
    job = {"kind": "statistic", "query": "count"}
    spread = np.std(releases(job, 0.5, 3000))
    assert spread == pytest.approx(np.sqrt(2) * 2.0, rel=0.1)  # Laplace(b = 1/ε) has std √2·b


@pytest.mark.parametrize("accounting", [Accounting.basic(), Accounting.rdp()], ids=["basic", "rdp"])
def test_a_statistic_job_reports_its_release_and_spends_its_whole_demand(tmp_path, accounting):
    paths = write_blocks(tmp_path / "blocks", days=2, per_day=300, seed=5)
    job = {"kind": "statistic", "query": "mean", "column": "rating", "bounds": [1, 5], "mechanism": "gaussian"}
    mechanism = plan_mechanism(job, 1.0, 1e-6, accounting)
    demand = demand_vector(mechanism, accounting)
    params = {**job, "mechanism": json.loads(mechanism_json(mechanism)), "epsilon": 1.0, "delta": 1e-6}
    ctx = JobContext(
        7, "mean-rating", "reviews", accounting, 1e-6,
        {p.stem: BlockGrant(p.stem, str(p), demand) for p in paths}, workdir=tmp_path / "run", params=params,
    )
    run_builtin(ctx)
    assert ctx.spent == pytest.approx(demand)
    exact = read_block_files(paths)["rating"].mean()
    assert ctx.metrics["value"] == pytest.approx(exact, abs=0.5)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["value"] == ctx.metrics["value"]


def test_an_unknown_column_fails_with_the_columns_there_are(tmp_path):
    paths = write_blocks(tmp_path / "blocks", days=1, per_day=20, seed=5)
    job = {"kind": "statistic", "query": "sum", "column": "price", "bounds": [0, 1]}
    mechanism = plan_mechanism(job, 1.0, 0.0, Accounting.basic())
    params = {**job, "epsilon": 1.0, "delta": 0.0}
    ctx = JobContext(
        8, "sum", "reviews", Accounting.basic(), 1e-6,
        {p.stem: BlockGrant(p.stem, str(p), demand_vector(mechanism, Accounting.basic())) for p in paths},
        workdir=tmp_path / "run", params=params,
    )
    with pytest.raises(ValueError, match="unknown column 'price'.*rating"):
        run_builtin(ctx)
    assert ctx.spent is None

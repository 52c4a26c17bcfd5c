"""DP statistics: unbiased releases, clipped contributions, reported spend."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from privsched.budgets import Accounting, Laplace, Mechanism, demand_vector
from privsched.trainers.builtin import plan_mechanism, run_builtin
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.records import read_block_files
from privsched.trainers.plans import parse_job
from privsched.statistics.release import dp_statistic, noise_of
from workloads.reviews import write_blocks

VALUES = np.array([-4.0, 0.5, 1.0, 2.0, 2.5, 3.0, 9.0, 4.0])


def granted_statistic(
    paths: list[Path], job: dict, accounting: Accounting, grant: np.ndarray, plan: Mechanism | None, workdir: Path
) -> JobContext:
    """A statistic job as the scheduler hands it over: ``grant`` on every block, ``plan`` charged."""
    blocks = {p.stem: BlockGrant(p.stem, str(p), grant) for p in paths}
    return JobContext(7, "statistic", "reviews", accounting, 1e-6, blocks, workdir=workdir, params=job, plan=plan)


def releases(job: dict, epsilon: float, draws: int, delta: float = 1e-6) -> list:
    spec = parse_job(job)
    mechanism = plan_mechanism(job, epsilon, delta, Accounting.rdp())
    return [dp_statistic(spec, mechanism, VALUES, len(VALUES))["value"] for _ in range(draws)]


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_count_sum_and_histogram_are_unbiased(noise):
    bounds = [0.0, 4.0]
    clipped = np.clip(VALUES, *bounds)
    draws = 1500

    def within(job: dict, expected) -> None:
        spec = parse_job(job)
        ((_, sensitivity),) = spec.parts()
        kind, scale = noise_of(plan_mechanism(job, 1.0, 1e-6, Accounting.rdp()), sensitivity)
        spread = scale * np.sqrt(2) if kind == "laplace" else scale  # standard deviation
        mean = np.mean(releases(job, 1.0, draws), axis=0)
        assert mean == pytest.approx(expected, abs=4.5 * spread / np.sqrt(draws))  # 4.5 standard errors

    within({"kind": "statistic", "query": "count", "noise": noise}, len(VALUES))
    within({"kind": "statistic", "query": "sum", "column": "v", "bounds": bounds, "noise": noise}, clipped.sum())
    job = {"kind": "statistic", "query": "histogram", "column": "v", "bounds": bounds, "bins": 4, "noise": noise}
    within(job, np.histogram(clipped, bins=4, range=bounds)[0])


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
    spread = np.std(releases(job, 0.5, 1500))
    assert spread == pytest.approx(np.sqrt(2) * 2.0, rel=0.1)  # Laplace(b = 1/ε) has std √2·b


@pytest.mark.parametrize("accounting", [Accounting.basic(), Accounting.rdp()], ids=["basic", "rdp"])
def test_a_statistic_job_reports_its_release_and_spends_its_whole_demand(tmp_path, accounting):
    paths = write_blocks(tmp_path / "blocks", days=2, per_day=300, seed=5)
    job = {"kind": "statistic", "query": "mean", "column": "rating", "bounds": [1, 5], "noise": "gaussian"}
    mechanism = plan_mechanism(job, 1.0, 1e-6, accounting)
    demand = demand_vector(mechanism, accounting)
    ctx = granted_statistic(paths, job, accounting, demand, mechanism, tmp_path / "run")
    run_builtin(ctx)
    assert ctx.spent == pytest.approx(demand)
    exact = read_block_files(paths)["rating"].mean()
    assert ctx.metrics["value"] == pytest.approx(exact, abs=0.5)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["value"] == ctx.metrics["value"]


def test_an_unknown_column_fails_with_the_columns_there_are(tmp_path):
    paths = write_blocks(tmp_path / "blocks", days=1, per_day=20, seed=5)
    job = {"kind": "statistic", "query": "sum", "column": "price", "bounds": [0, 1]}
    mechanism = plan_mechanism(job, 1.0, 0.0, Accounting.basic())
    grant = demand_vector(mechanism, Accounting.basic())
    ctx = granted_statistic(paths, job, Accounting.basic(), grant, mechanism, tmp_path / "run")
    with pytest.raises(ValueError, match="unknown column 'price'.*rating"):
        run_builtin(ctx)
    assert ctx.spent is None


def reachable_from(output: float, exact: float) -> bool:
    """Whether some float noise y gives ``exact + y == output`` in floating point: outputs
    that fail this are provably not from ``exact`` (Mironov, CCS 2012)."""
    guess = output - exact
    for y in (guess, np.nextafter(guess, -np.inf), np.nextafter(guess, np.inf)):
        if exact + y == output:
            return True
    return False


def unreachable_fraction(outputs: list[float]) -> float:
    return float(np.mean([not reachable_from(o, 1.0) for o in outputs]))


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_a_released_count_of_zero_is_not_separable_from_one_by_reachable_outputs(noise):
    spec = parse_job({"kind": "statistic", "query": "count", "noise": noise})
    mechanism = plan_mechanism({"kind": "statistic", "query": "count", "noise": noise}, 0.1, 1e-6, Accounting.rdp())
    outputs = [dp_statistic(spec, mechanism, None, 0)["value"] for _ in range(1000)]
    assert unreachable_fraction(outputs) == 0.0  # the attacker is left at chance level


def test_the_reachability_attack_separates_float_laplace_noise():
    # the test above can fail: numpy's float Laplace added to 0 gives outputs 1 cannot reach
    outputs = list(0.0 + np.random.default_rng().laplace(0.0, 10.0, 1000))
    assert unreachable_fraction(outputs) > 0.05


def test_two_runs_of_a_statistic_release_different_values():
    job = {"kind": "statistic", "query": "count"}
    assert len(set(releases(job, 1.0, 20))) > 1


def test_a_statistic_names_its_noise_in_noise_and_refuses_mechanism_with_one_line():
    assert parse_job({"kind": "statistic", "query": "count", "noise": "gaussian"}).noise == "gaussian"
    with pytest.raises(ValueError, match="'noise'") as info:
        parse_job({"kind": "statistic", "query": "count", "mechanism": "gaussian"})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("accounting", [Accounting.basic(), Accounting.rdp()], ids=["basic", "rdp"])
def test_a_statistic_job_releases_with_the_noise_of_its_charged_mechanism(tmp_path, accounting):
    paths = write_blocks(tmp_path / "blocks", days=1, per_day=50, seed=5)
    job = {"kind": "statistic", "query": "count"}
    charged = Laplace(scale=1e-3)  # far less noise than the job's own plan (ε = 0.01) would add
    grant = demand_vector(charged, accounting)
    ctx = granted_statistic(paths, job, accounting, grant, charged, tmp_path / "run")
    run_builtin(ctx)
    assert ctx.metrics["value"] == 50 and ctx.spent == pytest.approx(grant)


def test_a_built_in_job_without_a_charged_mechanism_is_refused_before_reading(tmp_path):
    paths = write_blocks(tmp_path / "blocks", days=1, per_day=20, seed=5)
    job = {"kind": "statistic", "query": "count"}
    grant = demand_vector(plan_mechanism(job, 1.0, 0.0, Accounting.basic()), Accounting.basic())
    ctx = granted_statistic(paths, job, Accounting.basic(), grant, None, tmp_path / "run")
    with pytest.raises(ValueError, match="mechanism it was charged"):
        run_builtin(ctx)
    assert ctx.spent is None and not ctx.touched_data


def test_a_statistic_refuses_a_seed_with_one_line():
    with pytest.raises(ValueError, match="seed") as info:
        parse_job({"kind": "statistic", "query": "count", "seed": 3})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("query", ["sum", "mean", "histogram"])
def test_a_nan_or_infinite_record_never_makes_a_release_nan(query):
    values = np.array([1.0, np.nan, 2.0, np.inf, -np.inf, 3.0])
    job = {"kind": "statistic", "query": query, "column": "v", "bounds": [0.5, 4.0]}
    if query == "histogram":
        job["bins"] = 2
    spec = parse_job(job)
    mechanism = plan_mechanism(job, 1e6, 0.0, Accounting.basic())
    value = np.asarray(dp_statistic(spec, mechanism, values, len(values))["value"])
    assert np.all(np.isfinite(value))
    if query == "sum":  # NaN and ±inf count as the lower bound 0.5
        assert value == pytest.approx(1.0 + 0.5 + 2.0 + 0.5 + 0.5 + 3.0, abs=1e-3)


def test_a_statistic_whose_charge_exceeds_its_grant_releases_nothing(tmp_path):
    paths = write_blocks(tmp_path / "blocks", days=1, per_day=20, seed=5)
    job = {"kind": "statistic", "query": "count"}
    accounting = Accounting.basic()
    small = demand_vector(plan_mechanism(job, 0.1, 0.0, accounting), accounting)
    ctx = granted_statistic(paths, job, accounting, small, plan_mechanism(job, 1.0, 0.0, accounting), tmp_path / "run")
    with pytest.raises(ValueError, match="exceeds its grant"):
        run_builtin(ctx)
    assert ctx.metrics == {} and ctx.spent is None and not (tmp_path / "run" / "metrics.json").exists()

"""Answers from a cached noisy histogram: a count or histogram that asks for an accuracy is
answered at no charge from the releases of its blocks when their noise proves it, and
otherwise runs at the ε the accuracy needs, pays, and joins the cache."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import privsched as ps
from privsched.ledger import LedgerError
from privsched.ledger.identities import Identities
from privsched.ledger.models import PipelineRequest
from privsched.remote import RemoteClient, RemoteError
from privsched.server.runner import Listen, http_api
from privsched.service.cache import update_epsilon
from privsched.statistics.accuracy import SCALE_SLACK, Source, best_estimate, laplace_epsilon
from privsched.statistics.noise import laplace_scale
from privsched.statistics.queries import StatisticJob
from tests.test_reuse import make_reviews, outsider_and_reader

BOUNDS = [1.0, 5.0]
#: Each answer below misses its accuracy with probability at most 1e-6 (its beta): a test
#: comparing it with the truth fails by chance at most that often.
BETA = 1e-6


def histogram(bins: int) -> dict:
    return {"kind": "statistic", "params": {"query": "histogram", "column": "rating", "bounds": BOUNDS, "bins": bins}}


COUNT = {"kind": "statistic", "params": {"query": "count"}}


def spec(name: str, job: dict, alpha: float, **changes) -> dict:
    """A statistic of blocks b0 and b1 within ±alpha with probability ≥ 1 − BETA."""
    return {"name": name, "dataset": "reviews", "blocks": ["b0", "b1"], "accuracy": {"alpha": alpha, "beta": BETA}, "job": job} | changes


@dataclass
class Cached:
    db: Path
    data: list[Path]
    source: int  # the histogram of 4 bins that ran, within ±30


@pytest.fixture(scope="module")
def cached(tmp_path_factory) -> Cached:
    """A database where a histogram of 4 bins asking ±30 ran and released."""
    db, paths = make_reviews(tmp_path_factory.mktemp("cache"))
    with ps.connect(db) as client:
        source = client.submit(spec("first", histogram(4), 30.0)).id
        client.run_until_idle()
        assert client.status(source).state == "completed", client.status(source).message
    return Cached(db, paths, source)


def truth(paths: list[Path], bins: int) -> np.ndarray:
    """The exact histogram of the ratings of blocks b0 and b1."""
    ratings = np.concatenate([np.load(p)["rating"] for p in paths[:2]]).astype(float)
    return np.histogram(np.clip(ratings, *BOUNDS), bins=bins, range=tuple(BOUNDS))[0]


def consumed(client: ps.Client) -> list[float]:
    return [float(b.consumed[0]) for b in client.blocks("reviews")]


def test_a_histogram_asking_an_accuracy_pays_the_epsilon_it_needs_and_is_within_it(cached: Cached):
    with ps.connect(cached.db) as client:
        result = client.result(cached.source)
    assert result.epsilon == pytest.approx(laplace_epsilon(30.0, BETA, 4), rel=1e-9)
    assert np.max(np.abs(np.array(result.metrics["value"]) - truth(cached.data, 4))) <= 30.0


@pytest.mark.parametrize(("job", "alpha", "bins"), [(histogram(2), 80.0, 2), (COUNT, 120.0, 1)], ids=["coarser histogram", "count"])
def test_a_cache_hit_is_charged_0_and_within_its_accuracy_of_the_truth(cached: Cached, job: dict, alpha: float, bins: int):
    with ps.connect(cached.db) as client:
        before = consumed(client)
        run = client.submit(spec("hit", job, alpha, blocks=["b1", "b0"]))
        result, after = client.result(run.id), consumed(client)
        assert client.audit().ok
    assert result.state == "completed" and result.epsilon == 0.0 and after == before
    assert result.answered_from_cache == [cached.source] and result.metrics["answered_from_cache"] is True
    assert result.metrics["failure_bound"] <= BETA
    exact = truth(cached.data, 2).tolist() if bins == 2 else [200]
    value = result.metrics["value"] if bins == 2 else [result.metrics["value"]]
    assert np.max(np.abs(np.array(value) - exact)) <= alpha


def test_status_and_result_say_an_answer_came_from_the_cache(cached: Cached, run_cli):
    with ps.connect(cached.db) as client:
        answered = client.submit(spec("shown", COUNT, 120.0)).id
    env = {"PRIVSCHED_DB": str(cached.db)}
    status, result = run_cli("status", answered, env=env), run_cli("result", answered, "-o", "json", env=env)
    assert status.returncode == 0 and re.search(rf"answered_from_cache\W+pipelines {cached.source} \(their releases", status.stdout)
    shown = json.loads(result.stdout)
    assert result.returncode == 0 and shown["answered_from_cache"] == [cached.source]
    assert shown["metrics"]["reused_from"] == [cached.source]


def test_a_query_the_cache_cannot_prove_runs_and_pays(cached: Cached):
    with ps.connect(cached.db) as client:
        info = client.status(client.submit(spec("tighter", histogram(4), 10.0)).id)
        client.cancel(info.id)
    assert info.state == "pending" and "answered_from_cache" not in info.job


def test_a_miss_runs_pays_and_then_answers_from_the_cache(tmp_path: Path):
    db, paths = make_reviews(tmp_path)
    with ps.connect(db) as client:
        miss = client.submit(spec("miss", COUNT, 20.0)).id
        assert client.status(miss).state == "pending"
        client.run_until_idle()
        paid = consumed(client)
        hit = client.result(client.submit(spec("hit", COUNT, 25.0)).id)
    assert paid[:2] == pytest.approx([laplace_epsilon(20.0, BETA, 1)] * 2, rel=1e-9)
    assert hit.answered_from_cache == [miss] and hit.epsilon == 0.0 and abs(hit.metrics["value"] - 200) <= 25.0


def test_a_miss_the_cache_half_answers_pays_less_and_answers_its_release_combined_with_the_cache(tmp_path: Path, run_cli):
    db, paths = make_reviews(tmp_path)
    with ps.connect(db) as client:
        source = client.submit(spec("first", histogram(4), 30.0)).id
        client.run_until_idle()
        update = client.submit(spec("tighter", histogram(4), 20.0)).id
        planned = client.status(update).job["cache_update"]
        client.run_until_idle()
        status = run_cli("status", update, env={"PRIVSCHED_DB": str(db)})
        result, first = client.result(update), client.result(source)
        assert client.audit().ok
    assert planned["sources"] == [source] and planned["epsilon"] < laplace_epsilon(20.0, BETA, 4)
    assert re.search(rf"cache_update\W+its release combined with those of pipelines {source}\b", status.stdout), status.stdout
    assert result.epsilon == pytest.approx(planned["epsilon"], rel=1e-9)
    assert result.metrics["combined_with"] == [source, update] and result.metrics["failure_bound"] <= BETA
    weights = [1 / Source(np.zeros(4), 1, "laplace", laplace_scale(1, e) * SCALE_SLACK).variance() for e in (first.epsilon, result.epsilon)]
    mean = (weights[0] * np.array(first.metrics["value"]) + weights[1] * np.array(result.metrics["release"])) / sum(weights)
    assert result.metrics["value"] == pytest.approx(mean.tolist(), rel=1e-12)
    assert np.max(np.abs(np.array(result.metrics["value"]) - truth(paths, 4))) <= 20.0


def test_reuse_false_runs_and_pays(cached: Cached):
    with ps.connect(cached.db) as client:
        info = client.status(client.submit(spec("paid", COUNT, 120.0, reuse=False)).id)
        client.cancel(info.id)
    assert info.state == "pending" and "answered_from_cache" not in info.job


def test_a_block_whose_data_changed_answers_nothing_from_the_cache(tmp_path: Path):
    db, paths = make_reviews(tmp_path)
    with ps.connect(db) as client:
        client.submit(spec("first", histogram(4), 30.0))
        client.run_until_idle()
        assert "answered_from_cache" in client.status(client.submit(spec("hit", COUNT, 120.0)).id).job
        paths[1].write_bytes(paths[1].read_bytes() + b"\n")
        info = client.status(client.submit(spec("changed", COUNT, 120.0)).id)
    assert info.state == "pending" and "answered_from_cache" not in info.job


def test_the_ledger_refuses_a_cache_answer_from_a_release_on_other_blocks(cached: Cached):
    with ps.connect(cached.db) as client:
        count = len(client.list())
        request = client.requests([spec("forged", COUNT, 120.0, blocks=["b0", "b2"])])[0]
        answer = {"value": 200.0, "sources": [cached.source], "failure_bound": 0.0}
        forged = PipelineRequest(**{**request.__dict__, "job": {**request.job, "answered_from_cache": answer}})
        with pytest.raises(LedgerError, match="other blocks"):
            client.ledger.submit(forged)
        assert len(client.list()) == count


def test_an_accuracy_above_the_epsilon_cap_is_refused_in_one_line(cached: Cached):
    with ps.connect(cached.db) as client:
        count = len(client.list())
        with pytest.raises(LedgerError, match=r"needs ε = [0-9.]+, above the cap 'epsilon' 0\.1$"):
            client.submit(spec("capped", histogram(4), 1.0, epsilon=0.1, reuse=False))
        assert len(client.list()) == count


def test_an_accuracy_for_a_sum_is_refused(cached: Cached):
    job = {"kind": "statistic", "params": {"query": "sum", "column": "rating", "bounds": BOUNDS}}
    with ps.connect(cached.db) as client, pytest.raises(LedgerError, match="for a count or a histogram, not a sum"):
        client.submit(spec("sum", job, 10.0))


def test_a_submitter_of_another_team_gets_no_answer_from_the_cache(tmp_path: Path):
    db, _ = make_reviews(tmp_path)
    with ps.connect(db) as client:
        source = client.submit(spec("first", histogram(4), 30.0)).id
        client.run_until_idle()
    carol, alice = outsider_and_reader(db)
    with http_api(db, Listen("127.0.0.1", 0)) as bound:
        with RemoteClient(bound.url, carol) as remote, pytest.raises(RemoteError) as refused:
            remote.submit(spec("copy", COUNT, 120.0))
        with RemoteClient(bound.url, alice) as remote:
            answered = remote.result(remote.submit(spec("reader", COUNT, 120.0)).id)
    assert refused.value.status == 403
    assert answered.answered_from_cache == [source] and answered.epsilon == 0.0
    with ps.connect(db) as client:
        assert [p.owner for p in client.list()] == [client.status(source).owner, "alice"]


@pytest.mark.parametrize(
    ("accuracy", "job", "message"),
    [
        ({"alpha": 10, "beta": 0.7}, COUNT, "beta"),
        ({"alpha": 0, "beta": 0.01}, COUNT, "alpha"),
        ({"alpha": 10, "beta": 0.01}, {"kind": "dpsgd", "params": {}}, "'accuracy' is for a built-in statistic"),
    ],
    ids=["beta", "alpha", "dpsgd"],
)
def test_a_bad_accuracy_is_refused_in_one_line_and_nothing_is_written(cached: Cached, run_cli, tmp_path: Path, accuracy, job, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec("bad", job, 1.0) | {"accuracy": accuracy}))
    with ps.connect(cached.db) as client:
        count = len(client.list())
    refused = run_cli("submit", path, env={"PRIVSCHED_DB": str(cached.db)})
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    with ps.connect(cached.db) as client:
        assert len(client.list()) == count


def test_an_accuracy_with_an_epsilon_range_is_refused_in_one_line(cached: Cached):
    with ps.connect(cached.db) as client, pytest.raises(ValueError, match="a single cap, not a range"):
        client.submit(spec("ranged", COUNT, 1.0) | {"epsilon": [0.5, 1.0], "accuracy": {"alpha": 10, "beta": 0.01}})


def test_a_dry_run_names_the_releases_that_would_answer_and_a_charge_of_0(cached: Cached):
    with ps.connect(cached.db) as client:
        count = len(client.list())
        plan = client.dry_run(spec("planned", COUNT, 120.0))
        assert len(client.list()) == count
    assert plan.answered_from_cache == [cached.source] and plan.verdict == "fits now"
    assert f"answered from the cached releases of pipelines {cached.source}: charged 0" in plan.lines()


def test_the_dashboard_shows_a_cache_update_its_combined_answer(tmp_path: Path):
    db, _ = make_reviews(tmp_path)
    with ps.connect(db) as client:
        client.submit(spec("first", histogram(4), 30.0))
        client.run_until_idle()
        update = client.submit(spec("tighter", histogram(4), 20.0)).id
        client.run_until_idle()
        expected = client.result(update).metrics
    with Identities(db) as identities:
        viewer = identities.add_user("vera", "viewer")
    with http_api(db, Listen("127.0.0.1", 0)) as bound, RemoteClient(bound.url, viewer) as remote:
        page = remote.request("GET", "/v1/dashboard/pipelines?per_page=100")
    row = next(r for r in page["rows"] if r["id"] == update)
    assert row["result"].startswith("value = " + ", ".join(f"{v:.6g}" for v in expected["value"]) + ", query = histogram"), row["result"]


@settings(max_examples=30, deadline=None)
@given(
    scales=st.lists(st.floats(0.5, 10.0), min_size=1, max_size=3),
    alpha=st.floats(2.0, 50.0),
    beta=st.floats(1e-8, 0.2),
    bins=st.sampled_from([1, 4]),
)
def test_a_cache_update_is_charged_no_more_than_alone_and_proves_its_accuracy(scales: list[float], alpha: float, beta: float, bins: int):
    query = StatisticJob(query="histogram", column="rating", bounds=(1.0, 5.0), bins=bins)
    cached = [Source(np.zeros(bins), 1, "laplace", b) for b in scales]
    full = laplace_epsilon(alpha, beta, bins)
    epsilon = update_epsilon(cached, query, alpha, beta, full, 1.0)
    fresh = Source(np.zeros(bins), 1, "laplace", laplace_scale(1.0, epsilon) * SCALE_SLACK)
    assert epsilon <= full and best_estimate([*cached, fresh], alpha).failure <= beta  # type: ignore[union-attr]

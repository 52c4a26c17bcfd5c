"""Exact reuse of a released statistic: the same statistic on the same unchanged blocks is
answered with the stored release, at no charge, marked as reused; anything else runs and pays."""

from __future__ import annotations

import json
import re
import tempfile
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
from workloads.reviews import write_blocks

SUM = {"kind": "statistic", "params": {"query": "sum", "column": "rating", "bounds": [1, 5]}}


def spec(name: str, **changes) -> dict:
    """A DP sum of the ratings on blocks b0 and b1 at ε = 0.5, with ``changes``."""
    return {"name": name, "dataset": "reviews", "blocks": ["b0", "b1"], "epsilon": 0.5, "job": SUM} | changes


@dataclass
class Released:
    db: Path
    data: list[Path]
    source: int  # the pipeline whose sum was released


def make_reviews(folder: Path) -> tuple[Path, list[Path]]:
    """Three blocks of synthetic reviews (basic accounting, ε_G = 10, δ_G = 1e-6), unlocked."""
    db = folder / "p.db"
    paths = write_blocks(folder / "data", days=3, per_day=100, seed=7)
    with ps.connect(db) as client:
        client.create_dataset("reviews", epsilon=10.0, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", [(f"b{i}", str(p)) for i, p in enumerate(paths)], unlocked=1.0)
    return db, paths


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Released:
    """A database where one DP sum ran to its end and released its value."""
    db, paths = make_reviews(tmp_path_factory.mktemp("reuse"))
    with ps.connect(db) as client:
        source = client.submit(spec("first")).id
        client.run_until_idle()
        assert client.status(source).state == "completed", client.status(source).message
    return Released(db, paths, source)


def consumed(client, key: str) -> np.ndarray:
    return next(b.consumed for b in client.blocks("reviews") if b.key == key)


def test_the_same_statistic_again_returns_the_stored_release_byte_identical_at_no_charge(released: Released, tmp_path: Path):
    with ps.connect(released.db) as client:
        before = consumed(client, "b0")
        run = client.submit(spec("again"))
        again, first = client.result(run.id), client.result(released.source)
        assert client.status(run.id).state == "completed" and client.audit().ok
        assert np.array_equal(consumed(client, "b0"), before)
        (copy,), (original,) = client.download(run.id, tmp_path / "again"), client.download(released.source, tmp_path / "first")
    assert copy.read_bytes() == original.read_bytes()
    assert json.dumps(again.releases) == json.dumps(first.releases)
    assert json.dumps(again.metrics["value"]) == json.dumps(first.metrics["value"])
    assert again.reused_from == released.source and again.metrics["reused_from"] == released.source
    assert again.charged == {"b0": 0.0, "b1": 0.0} and again.epsilon == 0.0


def test_status_and_result_say_a_pipeline_was_reused(released: Released, run_cli):
    with ps.connect(released.db) as client:
        reused = client.submit(spec("shown")).id
    env = {"PRIVSCHED_DB": str(released.db)}
    status, result = run_cli("status", reused, env=env), run_cli("result", reused, "-o", "json", env=env)
    assert status.returncode == 0 and re.search(rf"reused_from\W+{released.source} \(its release", status.stdout)
    assert result.returncode == 0 and json.loads(result.stdout)["reused_from"] == released.source


@pytest.mark.parametrize(
    "changes",
    [
        {"epsilon": 0.6},
        {"job": {**SUM, "params": {**SUM["params"], "bounds": [0, 5]}}},
        {"blocks": ["b0", "b2"]},
        {"job": {**SUM, "params": {**SUM["params"], "query": "mean"}}},
    ],
    ids=["epsilon", "bounds", "blocks", "query"],
)
def test_a_different_statistic_is_not_reused_and_waits_to_pay(released: Released, changes: dict):
    with ps.connect(released.db) as client:
        info = client.status(client.submit(spec("other", **changes)).id)
        client.cancel(info.id)
    assert info.state == "pending" and "reused_from" not in info.job


def test_an_elastic_statistic_is_never_served_again(tmp_path: Path):
    """Its noise followed its grant, not the mechanism recorded at submit."""
    db, _ = make_reviews(tmp_path)
    with ps.connect(db) as client:
        first = client.submit(spec("elastic", epsilon=[0.25, 0.5])).id
        client.run_until_idle()
        assert client.status(first).state == "completed", client.status(first).message
        again = client.status(client.submit(spec("elastic-again", epsilon=[0.25, 0.5])).id)
    assert again.state == "pending" and "reused_from" not in again.job


def test_reuse_false_runs_the_statistic_again_and_pays(released: Released):
    with ps.connect(released.db) as client:
        info = client.status(client.submit(spec("paid", reuse=False)).id)
        client.cancel(info.id)
    assert info.state == "pending" and "reused_from" not in info.job


def test_the_ledger_refuses_a_reuse_of_a_different_statistic(released: Released):
    with ps.connect(released.db) as client:
        count = len(client.list())
        request = client.requests([spec("forged", epsilon=0.6)])[0]
        forged = PipelineRequest(**{**request.__dict__, "job": {**request.job, "reused_from": released.source}})
        with pytest.raises(LedgerError, match="different statistic"):
            client.ledger.submit(forged)
        assert len(client.list()) == count


def settled_sum(client: ps.Client, **changes) -> int:
    """A DP sum (with ``changes``) granted and completed through the ledger, its whole grant consumed."""
    source = client.submit(spec("first", **changes)).id
    client.ledger.grant([source])
    client.ledger.complete(source, np.array([changes.get("epsilon", 0.5), 0.0]))
    return source


def test_a_block_whose_data_changed_invalidates_its_releases(tmp_path: Path):
    db, paths = make_reviews(tmp_path)
    with ps.connect(db) as client:
        source = settled_sum(client)
        assert client.status(client.submit(spec("reused")).id).job["reused_from"] == source
        paths[1].write_bytes(paths[1].read_bytes() + b"\n")
        info = client.status(client.submit(spec("changed")).id)
    assert info.state == "pending" and "reused_from" not in info.job


def test_a_retired_block_ends_the_reuse_of_its_releases(tmp_path: Path):
    db, _ = make_reviews(tmp_path)
    with ps.connect(db) as client:
        settled_sum(client, epsilon=4.0)
        rest = np.array([6.0, 1e-6])  # the rest of blocks b0 and b1, in ε and δ
        paid = client.ledger.submit(PipelineRequest("the rest", "reviews", ["b0", "b1"], demand=rest))
        client.ledger.grant([paid])
        client.ledger.complete(paid, rest)
        client.ledger.retire_exhausted()
        assert [b.state for b in client.blocks("reviews")] == ["retired", "retired", "active"]
        count = len(client.list())
        with pytest.raises(LedgerError, match="retired"):
            client.submit(spec("again", epsilon=4.0))
        assert len(client.list()) == count


def outsider_and_reader(db: Path) -> tuple[str, str]:
    """The tokens of carol (team red) and alice (team blue), once only blue may read the
    dataset ``reviews`` of ``db``."""
    with ps.connect(db) as client:
        dataset_id = client.dataset("reviews").id
    with Identities(db) as identities:
        carol = identities.add_user("carol", "submitter", "red")
        alice = identities.add_user("alice", "submitter", "blue")
        identities.restrict(dataset_id, ["blue"])
    return carol, alice


def test_a_submitter_of_another_team_cannot_get_a_release_through_reuse(tmp_path: Path):
    db, _ = make_reviews(tmp_path)
    with ps.connect(db) as client:
        source = settled_sum(client)
    carol, alice = outsider_and_reader(db)
    with http_api(db, Listen("127.0.0.1", 0)) as bound:
        with RemoteClient(bound.url, carol) as remote, pytest.raises(RemoteError) as refused:
            remote.submit(spec("copy"))
        with RemoteClient(bound.url, alice) as remote:
            reused = remote.result(remote.submit(spec("reader")).id)
    assert refused.value.status == 403 and reused.reused_from == source and reused.epsilon == 0.0
    with ps.connect(db) as client:
        assert [p.owner for p in client.list()] == [client.status(source).owner, "alice"]


STATISTICS = st.fixed_dictionaries(
    {
        "epsilon": st.sampled_from([0.5, 0.6]),
        "blocks": st.sampled_from([["b0", "b1"], ["b0", "b2"], ["b1", "b0"]]),
        "job": st.builds(
            lambda query, low: {"kind": "statistic", "params": {"query": query, "column": "rating", "bounds": [low, 5]}},
            st.sampled_from(["sum", "mean"]),
            st.sampled_from([0, 1]),
        ),
    }
)


@settings(max_examples=25, deadline=None)
@given(first=STATISTICS, second=STATISTICS, reuse=st.booleans())
def test_a_statistic_is_reused_exactly_when_it_repeats_a_release_and_reuse_is_on(first: dict, second: dict, reuse: bool):
    with tempfile.TemporaryDirectory() as folder, ps.connect(Path(folder) / "p.db") as client:
        client.create_dataset("reviews", epsilon=10.0, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", ["b0", "b1", "b2"], unlocked=1.0)
        source = settled_sum(client, **first)
        info = client.status(client.submit(spec("second", reuse=reuse, **second)).id)
        assert client.audit().ok
    repeated = reuse and first == second
    assert (info.state, info.job.get("reused_from")) == (("completed", source) if repeated else ("pending", None))


def test_the_dashboard_shows_a_reused_pipeline_the_value_its_source_released(released: Released):
    with ps.connect(released.db) as client:
        reused = client.submit(spec("on the dashboard")).id
        value = client.result(released.source).metrics["value"]
    with Identities(released.db) as identities:
        viewer = identities.add_user("vera", "viewer", "blue")
    with http_api(released.db, Listen("127.0.0.1", 0)) as bound, RemoteClient(bound.url, viewer) as remote:
        page = remote.request("GET", "/v1/dashboard/pipelines?per_page=100")
    row = next(r for r in page["rows"] if r["id"] == reused)
    assert row["result"].startswith(f"value = {value:.6g}, query = sum"), row["result"]


def test_a_dry_run_names_the_release_a_statistic_would_reuse_and_a_charge_of_0(released: Released, run_cli, tmp_path: Path):
    path = tmp_path / "again.json"
    path.write_text(json.dumps(spec("planned")))
    env = {"PRIVSCHED_DB": str(released.db)}
    with ps.connect(released.db) as client:
        count = len(client.list())
        assert client.dry_run(spec("planned")).reuses == released.source
        assert client.dry_run(spec("planned", reuse=False)).reuses is None
    shown = run_cli("submit", path, "--dry-run", env=env)
    assert shown.returncode == 0 and f"reuses the release of pipeline {released.source}: charged 0" in shown.stdout
    with ps.connect(released.db) as client:
        assert len(client.list()) == count

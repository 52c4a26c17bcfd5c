"""Elastic demands, live: a real SQLite ledger and the local executor run an elastic
statistic granted less than its maximum, which calibrates to its grant and says which ε it
used (docs/design.md §10, docs/privacy.md "Elastic demands")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from privsched.budgets.accounting import leq
from privsched.client import Client
from privsched.ledger import LedgerError
from tests.cli_inprocess import invoke
from tests.conftest import dump_database
from tests.server_fixtures import Server, server, spec  # noqa: F401  (server: a fixture)
from workloads.reviews import write_blocks

REPO = Path(__file__).resolve().parent.parent
COUNT = {"kind": "statistic", "params": {"query": "count"}}


def pipeline(name: str, epsilon: object) -> dict:
    return {"name": name, "dataset": "reviews", "blocks": ["b0"], "epsilon": epsilon, "job": COUNT}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A basic-accounting dataset of one block (ε_G = 1), all of it unlocked, on which a fixed
    pipeline of ε = 0.7 has already completed: 0.3 is left."""
    paths = write_blocks(tmp_path / "data", days=1, per_day=50, seed=2)
    with Client(tmp_path / "p.db") as client:
        client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", [("b0", str(paths[0]))], unlocked=1.0)
        fixed = client.submit(pipeline("fixed", 0.7))
        client.run_until_idle()
        assert client.status(fixed.id).state == "completed", client.status(fixed.id).message
    return tmp_path / "p.db"


def test_an_elastic_pipeline_records_the_least_fraction_its_range_accepts(db: Path):
    with Client(db) as client:
        run = client.submit(pipeline("elastic", [0.1, 0.5]))
        info = client.status(run.id)
    assert info.elastic_min == pytest.approx(0.2) and info.elastic_min >= 0.2  # 0.1 of 0.5, never less
    assert (info.job["epsilon_min"], info.job["epsilon"]) == (0.1, 0.5)


def test_an_elastic_pipeline_granted_what_a_fixed_one_left_calibrates_to_it_and_reports_the_epsilon_it_used(db: Path):
    with Client(db) as client:
        run = client.submit(pipeline("elastic", [0.1, 0.5]))
        assert client.ledger.grant([run.id], fractions={run.id: 0.6}) == [run.id]  # 0.3 of 0.5: what is left
        client.run_until_idle()
        info = client.status(run.id)
        result = client.result(run.id)
        assert info.state == "completed", info.message
        assert result.metrics["epsilon_used"] == pytest.approx(0.3, rel=1e-6) and result.metrics["epsilon_used"] <= 0.3
        assert np.all(leq(info.consumed["b0"], info.granted["b0"]))
        assert info.granted["b0"][0] == pytest.approx(0.3) and info.demands["b0"][0] == 0.5
        assert client.audit().ok


def test_a_restarted_scheduler_runs_an_elastic_grant_at_its_fraction(db: Path):
    with Client(db) as client:
        run = client.submit(pipeline("elastic", [0.1, 0.5]))
        client.ledger.grant([run.id], fractions={run.id: 0.4})
    with Client(db) as client:  # another process's scheduler, after the first one stopped
        client.run_until_idle()
        info = client.status(run.id)
        assert info.state == "completed" and info.fraction == 0.4, info.message
        assert client.result(run.id).metrics["epsilon_used"] == pytest.approx(0.2, rel=1e-6)
        assert client.audit().ok


def test_status_and_dry_run_show_an_elastic_range(db: Path, tmp_path: Path):
    spec = tmp_path / "elastic.yaml"
    spec.write_text("name: e\ndataset: reviews\nblocks: [b0]\nepsilon: [0.1, 0.5]\njob: {kind: statistic, params: {query: count}}\n")
    dry = invoke("submit", spec, "--dry-run", db=db)
    assert "elastic: epsilon in [0.1, 0.5]" in dry.stdout, dry.stdout + dry.stderr
    with Client(db) as client:
        run = client.submit(spec)
        client.ledger.grant([run.id], fractions={run.id: 0.6})
    shown = invoke("status", run.id, db=db)
    assert "range [0.1, 0.5], accepts 0.2 of its demand or more" in shown.stdout and "0.6 of its demand" in shown.stdout


def test_an_elastic_range_above_what_the_block_could_ever_hold_is_refused_in_one_line(db: Path):
    with Client(db) as client:
        before = len(client.ledger.list_pipelines())
        with pytest.raises(LedgerError, match="can never be granted") as caught:
            client.submit(pipeline("too-much", [0.1, 2.0]))
        assert "\n" not in str(caught.value) and len(client.ledger.list_pipelines()) == before


@pytest.mark.parametrize("accounting", ["basic", "rdp"])
def test_under_dpf_an_elastic_pipeline_is_granted_what_a_fixed_one_leaves_and_runs_at_that_epsilon(tmp_path: Path, accounting: str):
    paths = write_blocks(tmp_path / "data", days=1, per_day=50, seed=3)
    with Client(tmp_path / "p.db") as client:
        client.create_dataset("reviews", epsilon=1.0 if accounting == "basic" else 10.0, delta=1e-6, accounting=accounting)
        client.add_blocks("reviews", [("b0", str(paths[0]))])
        wide = client.submit(pipeline("fixed", 0.7 if accounting == "basic" else 7.0))
        elastic = client.submit(pipeline("elastic", [0.1, 0.5] if accounting == "basic" else [1.0, 5.0]))
        client.run_until_idle(policy="dpf-n", n=1)
        fixed, info = client.status(wide.id), client.status(elastic.id)
        assert fixed.state == info.state == "completed", (fixed.message, info.message)
        assert info.elastic_min is not None and info.elastic_min <= info.fraction < 1
        used = client.result(elastic.id).metrics["epsilon_used"]
        assert info.job["epsilon_min"] <= used < info.job["epsilon"]
        if accounting == "basic":  # all that the fixed 0.7 left of ε_G = 1
            assert info.fraction == pytest.approx(0.6) and used == pytest.approx(0.3, rel=1e-6)
        assert np.all(leq(info.consumed["b0"], info.granted["b0"]))
        block = client.ledger.get_block("reviews", "b0")
        live = client.ledger.get_dataset("reviews").accounting.live(block.capacity)
        assert client.audit().ok and np.any(leq(block.consumed, block.capacity) & live)  # the safety invariant


def test_a_code_job_granted_part_of_its_range_spends_the_largest_epsilon_its_grant_holds(db: Path):
    job = {"function": "tests.sandbox_jobs:counts_at_its_epsilon", "pythonpath": [str(REPO)]}
    with Client(db) as client:
        run = client.submit({**pipeline("code", [0.1, 0.5]), "job": job})
        client.ledger.grant([run.id], fractions={run.id: 0.6})  # 0.3 of 0.5: what the fixed 0.7 left
        client.run_until_idle()
        info, result = client.status(run.id), client.result(run.id)
        assert info.state == "completed", info.message
        (release,) = result.releases
        assert release["epsilon"] == result.metrics["epsilon"] == pytest.approx(0.3, rel=1e-6) and release["epsilon"] <= 0.3
        assert np.all(leq(info.consumed["b0"], info.granted["b0"])) and client.audit().ok


def test_the_http_api_takes_an_epsilon_range_and_answers_it_in_the_pipeline_and_the_dry_run(server: Server):
    elastic = {**spec(), "epsilon": [0.1, 0.5]}
    status, planned = server.call("POST", "/v1/pipelines/dry-run", {"spec": elastic}, user="alice")
    assert status == 200 and planned["epsilon_range"] == [0.1, 0.5] and planned["elastic_min"] == pytest.approx(0.2), planned
    status, submitted = server.call("POST", "/v1/pipelines", {"spec": elastic}, user="alice")
    assert status == 201, submitted
    shown = server.call("GET", f"/v1/pipelines/{submitted['id']}", user="alice")[1]
    assert shown["elastic_min"] == pytest.approx(0.2) and shown["job"]["epsilon_min"] == 0.1 and shown["fraction"] is None


def test_the_http_api_refuses_an_empty_epsilon_range_in_one_line(server: Server):
    before = dump_database(server.db)
    status, answer = server.call("POST", "/v1/pipelines", {"spec": {**spec(), "epsilon": [0.5, 0.1]}}, user="alice")
    assert status == 400 and "is empty" in answer["error"] and "\n" not in answer["error"]
    assert dump_database(server.db) == before


def test_an_elastic_pipeline_whose_max_no_longer_fits_but_whose_min_does_waits_and_is_granted_the_rest(db: Path):
    with Client(db) as client:
        run = client.submit(pipeline("elastic", [0.1, 0.5]))  # 0.3 of ε_G = 1 is left after the fixed 0.7
        client.run_until_idle(policy="dpf-n", n=1)
        info = client.status(run.id)
        assert info.state == "completed" and info.fraction == pytest.approx(0.6), info.message
        assert client.result(run.id).metrics["epsilon_used"] == pytest.approx(0.3, rel=1e-6)
        shown = invoke("result", run.id, db=db)
        assert "epsilon_used" in shown.stdout, shown.stdout


def test_an_elastic_pipeline_whose_min_can_never_fit_ends_saying_so(db: Path):
    with Client(db) as client:
        run = client.submit(pipeline("elastic", [0.4, 0.5]))  # even 0.4 is more than the 0.3 left
        client.run_until_idle(policy="dpf-n", n=1)
        info = client.status(run.id)
    assert info.state != "completed" and "can never be granted" in (info.message or ""), info

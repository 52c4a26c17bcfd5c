"""The Python API: connecting, decorated pipelines, run handles, batches, concurrent
submitters, and refusal of bad submissions without any change to the database."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

import privsched as ps
from privsched.budgets import EpsilonDelta, parse_mechanism
from privsched.client import Client, function_reference
from privsched.ledger import LedgerError
from privsched.service.resources import Pool
from privsched.spec import SpecError
from tests import service_jobs as jobs
from tests.conftest import dump_database
from tests.support.blockdata import block_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def client(tmp_db: Path) -> Client:
    client = ps.connect(tmp_db)
    client.create_dataset("reviews", epsilon=10, delta=1e-7, accounting="rdp")
    client.add_blocks("reviews", [(f"2026-01-{d:02d}", block_file(tmp_db.parent, str(d))) for d in range(1, 11)])
    client.runs.record_pool(Pool(("0",), cpus=4.0, memory=2**30))
    yield client
    client.close()


def spec(**changes) -> dict:
    return {
        "name": "p",
        "dataset": "reviews",
        "blocks": {"last": 2},
        "epsilon": 1.0,
        "delta": 0.0,
        "job": {"function": "tests.service_jobs:spend_half"},
        **changes,
    }


def test_connect_reads_the_database_from_the_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PRIVSCHED_DB", str(tmp_path / "env.db"))
    with ps.connect() as client:
        assert client.path == tmp_path / "env.db" and client.datasets() == []
    assert (tmp_path / "env.db").exists()


def test_a_decorated_function_runs_as_a_pipeline_and_reports_back(client: Client):
    train = client.pipeline(dataset="reviews", blocks=ps.Last(3), epsilon=1.0, delta=0.0, cpus=1)(jobs.spend_half)
    assert (train.function, train.pythonpath) == ("tests.service_jobs:spend_half", [str(REPO)])
    run = train.submit(lr=0.1)
    assert run.status == "pending" and run.info.job["params"] == {"lr": 0.1}
    client.run_until_idle("fcfs", tick=0.1, cpus=4, gpus=1)
    run.wait()
    assert run.status == "completed" and run.metrics == {"blocks": 3}
    assert sorted(run.consumed) == ["2026-01-08", "2026-01-09", "2026-01-10"]
    for key, spent in run.consumed.items():
        np.testing.assert_allclose(spent, run.grant[key])  # a user job's report is not believed


def test_functions_that_a_job_process_cannot_import_are_refused():
    def local(ctx):
        return None

    with pytest.raises(ValueError, match="must be defined at module level"):
        function_reference(local)
    with pytest.raises(ValueError, match="module level"):
        function_reference(lambda ctx: None)


def test_decorator_arguments_are_validated_when_decorating(client: Client):
    with pytest.raises(SpecError, match="epsilon"):
        client.pipeline(dataset="reviews", blocks=ps.Last(1), epsilon=-1)(jobs.spend_half)


def test_a_builtin_job_is_charged_its_own_plan(client: Client):
    run = client.submit(spec(job={"kind": "statistic", "params": {"query": "count"}}, delta=None))
    info = run.info
    assert parse_mechanism(info.mechanism) == EpsilonDelta(epsilon=1.0, delta=0.0)
    np.testing.assert_allclose(info.demands["2026-01-10"], np.minimum(1.0, np.asarray(info_acc(client).alphas) / 2))


def test_a_plain_epsilon_delta_function_pipeline_under_rdp_is_refused_with_one_line(client: Client, dump_db):
    before = dump_db(client.path)
    with pytest.raises(LedgerError, match="names its mechanism") as info:
        client.submit(spec(delta=1e-9))
    assert "\n" not in str(info.value)
    assert dump_db(client.path) == before


def info_acc(client: Client):
    return client.ledger.get_dataset("reviews").accounting


def test_an_explicit_mechanism_sets_the_demand(client: Client):
    run = client.submit(spec(epsilon=None, delta=None, mechanism={"kind": "gaussian", "sigma": 4.0}))
    np.testing.assert_allclose(run.grant["2026-01-09"], np.asarray(info_acc(client).alphas) / 32)


def test_a_builtin_job_given_a_mechanism_instead_of_epsilon_is_refused_with_one_line(client: Client, dump_db):
    before = dump_db(client.path)
    with pytest.raises(LedgerError, match="plans the mechanism it is charged") as info:
        client.submit(
            spec(
                epsilon=None,
                delta=None,
                mechanism={"kind": "laplace", "scale": 10.0},
                job={"kind": "statistic", "params": {"query": "count"}},
            )
        )
    assert "\n" not in str(info.value)
    assert dump_db(client.path) == before


def test_a_statistic_naming_its_noise_mechanism_is_refused_naming_noise(client: Client, dump_db):
    before = dump_db(client.path)
    with pytest.raises(LedgerError, match="'noise'") as info:
        client.submit(spec(job={"kind": "statistic", "params": {"query": "count", "mechanism": "laplace"}}, delta=None))
    assert "\n" not in str(info.value)
    assert dump_db(client.path) == before


def test_the_owner_defaults_to_the_submitting_user(client: Client):
    import getpass

    assert client.submit(spec()).info.owner == getpass.getuser()
    assert client.submit(spec(owner="ana")).info.owner == "ana"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dataset": "clicks"}, "clicks"),
        ({"blocks": {"from": "2027-01-01"}}, "no block of the dataset matches"),
        ({"blocks": ["2026-01-01", "1999-01-01"]}, "1999-01-01"),
        ({"blocks": {"last": 11}}, "has 10 active blocks"),
        ({"epsilon": 50.0}, ""),
        ({"resources": {"gpus": 2}}, "the job asks for 2 GPU(s) but the pool has 1"),
        ({"resources": {"memory": "2GiB"}}, "memory"),
        ({"job": {"kind": "dpsgd", "params": {"model": "resnet"}}}, "model"),
    ],
)
def test_bad_submissions_raise_one_line_and_change_nothing(client: Client, changes, message):
    before = dump_database(client.path)
    with pytest.raises(ValueError) as caught:
        client.submit(spec(**changes))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert dump_database(client.path) == before


def test_a_batch_with_one_bad_pipeline_records_none(client: Client):
    with pytest.raises(LedgerError):
        client.submit_many([spec(name="good"), spec(name="bad", blocks=["nope"])])
    assert client.list() == []
    assert [r.status for r in client.submit_many([spec(name="a"), spec(name="b")])] == ["pending", "pending"]


def _submit_many(path: str, worker: int, count: int) -> list[int]:
    with ps.connect(path) as client:
        return [client.submit(spec(name=f"w{worker}-{i}")).id for i in range(count)]


def test_concurrent_submitters_each_record_every_pipeline_once(client: Client):
    workers, count = 8, 100
    context = multiprocessing.get_context("fork")  # fresh connections are opened in each child
    with context.Pool(workers) as pool:
        ids = pool.starmap(_submit_many, [(str(client.path), w, count) for w in range(workers)])
    flat = [i for chunk in ids for i in chunk]
    assert len(flat) == len(set(flat)) == workers * count
    names = sorted(p.name for p in client.list())
    assert names == sorted(f"w{w}-{i}" for w in range(workers) for i in range(count))
    assert client.audit().ok


def test_one_database_serves_a_basic_and_an_rdp_dataset_together(tmp_db: Path):
    """Block budgets of basic (ε, δ) and RDP (one entry per order) datasets differ in length:
    unlocking and granting work per dataset, so both are served by one scheduler."""
    with ps.connect(tmp_db) as client:
        client.create_dataset("daily", epsilon=10, delta=1e-7, accounting="basic")
        client.create_dataset("reviews", epsilon=10, delta=1e-7, accounting="rdp")
        for dataset in ("daily", "reviews"):
            client.add_blocks(dataset, [(f"{dataset}-{d}", block_file(tmp_db.parent, f"{dataset}-{d}")) for d in range(3)])
        client.runs.record_pool(Pool(("0",), cpus=4.0, memory=2**30))
        runs = [client.submit(spec(name=dataset, dataset=dataset)) for dataset in ("daily", "reviews")]
        client.run_until_idle("dpf-n", n=1, tick=0.05, cpus=4, gpus=0)
        assert [run.wait().status for run in runs] == ["completed", "completed"]

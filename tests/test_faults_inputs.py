"""Budget is never burnt on a built-in job that could not read its data: a block whose data
is missing, or a statistic of a column the blocks lack, fails before the job starts, and its
grant is released."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from privsched import connect
from privsched.budgets import EpsilonDelta, mechanism_json
from privsched.client import Client
from privsched.ledger.models import PipelineRequest
from privsched.service.preflight import record_columns


@pytest.fixture
def client(tmp_path: Path) -> Client:
    np.savez(tmp_path / "b0.npz", rating=np.array([1.0, 4.0, 5.0, 3.0]), tokens=np.ones((4, 3), dtype=np.int64), vocab_size=np.array(7))
    (tmp_path / "gone.npz").touch()
    client = connect(tmp_path / "privsched.db")
    client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
    client.add_blocks("reviews", [("b0", str(tmp_path / "b0.npz")), ("gone", str(tmp_path / "gone.npz"))])
    (tmp_path / "gone.npz").unlink()  # its data disappears after the block was added
    yield client
    client.close()


def mean_of(client: Client, column: str, block: str) -> int:
    job = {"kind": "statistic", "params": {"query": "mean", "column": column, "bounds": [1, 5]}}
    return client.submit({"name": f"mean-{column}", "dataset": "reviews", "blocks": [block], "epsilon": 0.2, "job": job}).id


def run(client: Client) -> None:
    client.run_until_idle("fcfs", tick=0.05, cpus=4, gpus=0)
    assert client.ledger.audit().ok


def test_a_statistic_of_a_column_the_block_holds_runs_and_is_charged(client: Client):
    pipeline_id = mean_of(client, "rating", "b0")
    run(client)
    assert client.ledger.get_pipeline(pipeline_id).state == "completed"
    assert client.ledger.get_block("reviews", "b0").consumed[0] == pytest.approx(0.2)


def test_a_statistic_of_a_missing_column_fails_before_it_starts_and_costs_nothing(client: Client):
    pipeline_id = mean_of(client, "stars", "b0")
    run(client)
    info = client.ledger.get_pipeline(pipeline_id)
    assert info.state == "failed"
    assert info.message == "the job cannot read its data: block 'b0' has no column 'stars' (it holds rating, tokens)"
    assert client.ledger.get_block("reviews", "b0").consumed[0] == 0.0
    assert info.started_at is None  # no job process was started


def test_a_built_in_job_on_a_block_whose_data_is_missing_costs_nothing(client: Client, tmp_path: Path):
    pipeline_id = mean_of(client, "rating", "gone")
    run(client)
    info = client.ledger.get_pipeline(pipeline_id)
    assert info.state == "failed"
    assert info.message == f"the job cannot read its data: the data of block 'gone' is missing ({tmp_path / 'gone.npz'})"
    assert client.ledger.get_block("reviews", "gone").consumed[0] == 0.0


def test_a_stored_statistic_naming_its_noise_mechanism_fails_before_it_starts_and_costs_nothing(client: Client):
    job = {"kind": "statistic", "params": {"query": "count", "mechanism": "laplace"}, "epsilon": 0.2, "delta": None}
    pipeline_id = client.ledger.submit(
        PipelineRequest(  # as an older privsched stored it
            "count", "reviews", ["b0"], mechanism=mechanism_json(EpsilonDelta(epsilon=0.2)), job=job
        )
    )
    run(client)
    info = client.ledger.get_pipeline(pipeline_id)
    assert info.state == "failed" and info.started_at is None
    assert "'noise'" in info.message and "\n" not in info.message
    assert client.ledger.get_block("reviews", "b0").consumed[0] == 0.0


def test_columns_are_read_from_array_headers_only(tmp_path: Path):
    np.savez(tmp_path / "x.npz", a=np.zeros(3), b=np.zeros((3, 2)), vocab_size=np.array(3), s=np.array(1.0))
    assert record_columns(tmp_path / "x.npz") == {"a", "b"}

"""A one-block ledger and the counting job shared by the fault-injection tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from privsched import connect
from privsched.client import Client
from privsched.service.rundirs import RunDirs
from tests.support.blockdata import block_files

HELPER = Path(__file__).resolve().parents[1] / "fault_scheduler.py"
EPSILON = 0.4


@pytest.fixture
def client(tmp_db: Path) -> Iterator[Client]:
    client = connect(tmp_db)
    client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
    client.add_blocks("reviews", block_files(tmp_db.parent, ["b0"]))
    yield client
    client.close()


def submit(client: Client, seconds: float = 1.0) -> int:
    job = {"function": "tests.fault_jobs:counted_sleep_then_spend", "params": {"seconds": seconds}}
    return client.submit({"name": "p", "dataset": "reviews", "blocks": ["b0"], "epsilon": EPSILON, "job": job}).id


def job_runs(client: Client, pipeline_id: int) -> int:
    runs = RunDirs(client.path).workdir(pipeline_id) / "runs.txt"
    return len(runs.read_text().splitlines()) if runs.exists() else 0

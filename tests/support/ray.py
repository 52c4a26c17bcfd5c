"""Shared pieces of the Ray executor tests: a review database, a user job's spec, a
scheduler serving a database on a cluster in a thread, and waiting for pipelines to end."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from privsched import connect
from privsched.client import Client
from privsched.service.executors.base import Launch
from privsched.service.resources import Placement
from tests.conftest import REPO
from tests.support.waiting import wait_for
from workloads.reviews import write_blocks


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database whose RDP dataset ``reviews`` (ε_G = 10, δ_G = 1e-7, orders whose capacity is
    positive) has two review blocks."""
    paths = write_blocks(tmp_path / "blocks", days=2, per_day=60)
    with connect(tmp_path / "p.db") as client:
        client.create_dataset("reviews", epsilon=10.0, delta=1e-7, accounting="rdp", alphas=[3, 4, 5, 8, 16, 32, 64])
        client.add_blocks("reviews", [(p.stem, str(p)) for p in paths])
    return tmp_path / "p.db"


def user_job(name: str, function: str, *, gpus: int = 0, blocks: int = 2, **params: object) -> dict:
    return {
        "name": name,
        "dataset": "reviews",
        "blocks": {"last": blocks},
        "epsilon": 0.5,
        "delta": 0.0,
        "resources": {"gpus": gpus, "cpus": 0.5},
        "job": {"function": function, "pythonpath": [str(REPO)], "params": params},
    }


def launch_in(runs_root: Path, pipeline_id: int, started_at: float) -> Launch:
    """The launch of a pipeline whose run folders live under ``runs_root`` (no GPU)."""
    folder = runs_root / str(pipeline_id)
    return Launch(pipeline_id, folder / "context.json", folder / "result.json", folder / "job.log", Placement((), 1.0, 0), started_at)


@contextmanager
def serving(db: Path, address: str, policy: str = "fcfs", **options: object) -> Iterator[Callable[[], None]]:
    """A scheduler serving ``db`` on the cluster in a thread. Yields ``check()``, which raises
    if the scheduler stopped; on exit the scheduler is stopped and any error of its re-raised."""
    stop, failed = threading.Event(), []

    def run() -> None:
        try:
            with connect(db) as client:
                client.serve(policy, executor="ray", ray_address=address, tick=0.2, stop=stop, **options)
        except BaseException as exc:  # re-raised in the test
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def check() -> None:
        if failed:
            raise failed[0]
        assert thread.is_alive(), "the scheduler stopped"

    with connect(db) as client:
        wait_for(lambda: client.runs.recorded_pool() is not None, "the scheduler has looked at the cluster", check)
    try:
        yield check
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]


def wait_until(condition: Callable[[], bool], check: Callable[[], None] = lambda: None) -> None:
    """Wait until ``condition()`` holds, calling ``check()`` between polls; fails after
    :data:`~tests.support.waiting.PATIENCE` seconds."""
    wait_for(condition, "the condition the Ray test waits for", check, poll=0.1)


def running(process: subprocess.Popen) -> Callable[[], None]:
    def check() -> None:
        assert process.poll() is None, "the scheduler exited"

    return check


def ended(client: Client, *ids: int) -> Callable[[], bool]:
    return lambda: all(client.run(i).done for i in ids)

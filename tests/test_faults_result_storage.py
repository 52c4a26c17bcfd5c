"""A job whose result file cannot be written because the disk is full (or the folder is on a
read-only mount) keeps its result: it
reaches the executor through the result pipe at once, and the supervisor writes the file
once space returns (issue 12, item 4).

The full disk is real: the job's supervisor runs in a user and mount namespace
(``unshare --user --map-root-user --mount``) where a tmpfs of two pages, filled up, is
mounted over its result folder; the test makes room by letting the wrapper delete the
filler (or unmounting the read-only bind). Skipped where unprivileged namespaces are not
allowed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from privsched.budgets import Accounting
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.runner import JobResult
from privsched.service.executors.base import Launch
from privsched.service.executors.local import LocalExecutor
from privsched.service.resources import Placement
from privsched.trainers.builtin import plan_mechanism
from tests.support.namespaces import namespaces_allowed

GRANT = [0.5, 0.0]
JOB = {"kind": "statistic", "query": "count"}


pytestmark = pytest.mark.skipif(not namespaces_allowed(), reason="unprivileged user namespaces are not allowed")


def full_disk_python(folder: Path, full: Path, room: Path, landed: Path) -> Path:
    """A stand-in for the interpreter that runs it with ``full`` on a full tmpfs, waits for
    ``room`` to exist, deletes the filler, and copies the result file to ``landed`` once the
    supervisor exits."""
    setup = f'mount -t tmpfs -o size=8k tmpfs "{full}" || exit 90; head -c 8192 /dev/zero > "{full}/filler" 2>/dev/null'
    return _wrapped_python(folder, setup, f'rm -f "{full}/filler"', full, room, landed)


def read_only_python(folder: Path, results: Path, room: Path, landed: Path) -> Path:
    """The same with ``results`` bound read-only over itself until ``room`` exists."""
    setup = f'mount --bind "{results}" "{results}" && mount -o remount,bind,ro "{results}" || exit 90'
    return _wrapped_python(folder, setup, f'umount "{results}"', results, room, landed)


def _wrapped_python(folder: Path, setup: str, release: str, results: Path, room: Path, landed: Path) -> Path:
    script = folder / "python-wrapped"
    script.write_text(f"""#!/bin/sh
exec unshare --user --map-root-user --mount sh -c '
  {setup}
  "$@" & job=$!
  while [ ! -e "{room}" ]; do sleep 0.05; done
  {release}
  wait $job; code=$?
  cp "{results}/result.json" "{landed}"
  exit $code' sh "{sys.executable}" "$@"
""")
    script.chmod(0o755)
    return script


def statistic_launch(folder: Path, result: Path) -> Launch:
    data = folder / "data"
    data.mkdir()
    np.savez(data / "d1.npz", rating=np.linspace(0, 5, 40))
    ctx = JobContext(
        1,
        "count",
        "reviews",
        Accounting.basic(),
        0.0,
        {"d1": BlockGrant("d1", str(data / "d1.npz"), np.array(GRANT))},
        workdir=folder / "run" / "work",
        params=JOB,
        plan=plan_mechanism(JOB, 0.2, 0.0, Accounting.basic()),
        epsilon=0.2,
    )
    (folder / "run").mkdir()
    context = folder / "run" / "context.json"
    context.write_text(json.dumps({**json.loads(ctx.to_json()), "job": JOB}))
    return Launch(1, context, result, folder / "run" / "job.log", Placement((), 1.0, 0), time.time())


@pytest.mark.parametrize("storage", ["full", "read-only"])
def test_a_job_whose_result_folder_cannot_be_written_keeps_its_result_and_writes_it_once_it_can(tmp_path: Path, storage: str):
    full, room, landed = tmp_path / "results", tmp_path / "room", tmp_path / "landed.json"
    full.mkdir()
    wrapper = full_disk_python if storage == "full" else read_only_python
    executor = LocalExecutor(python=str(wrapper(tmp_path, full, room, landed)), warm=False)
    executor.start(statistic_launch(tmp_path, full / "result.json"))
    deadline = time.monotonic() + 120
    results: list[JobResult] = []
    while not results:
        assert time.monotonic() < deadline, (tmp_path / "run" / "job.log").read_text()
        results = executor.poll(time.time())
        time.sleep(0.05)
    (result,) = results
    assert result.completed, result.message
    assert result.spent == {"d1": [0.2, 0.0]}  # what it measured, not its whole grant
    room.touch()
    while not landed.exists():
        assert time.monotonic() < deadline, "the result file was never written"
        time.sleep(0.05)
    assert JobResult.from_json(landed.read_text()) == result

"""The scheduler through the command line, end to end: a mix of pipelines served until
idle, a scheduler killed with SIGKILL and restarted, concurrent submitters, and bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from privsched import connect
from privsched.ledger import Ledger
from privsched.service.rundirs import RunDirs
from tests.conftest import REPO, dump_database
from tests.support.blockdata import block_files
from tests.support.waiting import wait_for


def write_pipeline(folder: Path, name: str, function: str, blocks: str, epsilon: float, extra: str = "", params: str = "{}") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ndataset: reviews\nblocks: {blocks}\nepsilon: {epsilon}\n"
        f"job: {{function: 'tests.service_jobs:{function}', params: {params}}}\n{extra}"
    )
    return path


DATASET_COMMANDS = (
    ["init"],
    ["dataset", "create", "reviews", "--epsilon", "1", "--delta", "1e-6", "--accounting", "basic"],
    ["blocks", "add", "reviews", "b0", "b1", "b2", "b3", "--location-template", "data/{key}"],  # from tmp_path
)


@pytest.fixture
def cli(run_cli, tmp_path: Path):
    """``run_cli`` on ``tmp_path/p.db``, which holds a basic-accounting dataset of blocks
    b0..b3 (ε_G = 1) created through the Python API (the end-to-end test uses the CLI)."""
    env = {"PRIVSCHED_DB": str(tmp_path / "p.db")}

    def run(*args: object) -> subprocess.CompletedProcess:
        return run_cli(*args, env=env)

    return run


@pytest.fixture
def db(tmp_path: Path) -> Path:
    with connect(tmp_path / "p.db") as client:
        client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", block_files(tmp_path, [f"b{i}" for i in range(4)]))
    return tmp_path / "p.db"


def consumed(path: Path, key: str) -> float:
    with Ledger(path) as ledger:
        return float(ledger.get_block("reviews", key).consumed[0])


def states(path: Path) -> dict[str, str]:
    with Ledger(path) as ledger:
        return {p.name: p.state for p in ledger.list_pipelines()}


def test_a_mix_of_pipelines_ends_as_policy_and_budget_imply(cli, tmp_path: Path):
    block_files(tmp_path, ["b0", "b1", "b2", "b3"])
    for command in DATASET_COMMANDS:
        assert cli(*command).returncode == 0
    specs = [
        write_pipeline(tmp_path, "half", "spend_half", "[b0]", 0.4),
        write_pipeline(tmp_path, "whole", "no_report", "{from: b0, to: b1}", 0.4),
        write_pipeline(tmp_path, "crash", "raises_after_reading", "[b1]", 0.3),
        write_pipeline(tmp_path, "toolate", "spend_half", "[b0]", 0.5),  # 0.2 left on b0 after the others
        write_pipeline(tmp_path, "holder", "sleep_then_spend", "[b2]", 0.5, params="{seconds: 3}"),
        # could fit b2 once "holder" ends, but waits behind its allocation past its timeout
        write_pipeline(tmp_path, "expires", "spend_half", "[b2]", 0.6, "timeout: 1s\n"),
    ]
    ids = [cli("submit", s).stdout.strip() for s in specs]
    assert ids == ["1", "2", "3", "4", "5", "6"]
    served = cli("serve", "--policy", "fcfs", "--until-idle", "--tick", "200ms", "--cpus", "4", "--gpus", "0")
    assert served.returncode == 0, served.stderr
    assert states(tmp_path / "p.db") == {
        "half": "completed",
        "whole": "completed",
        "crash": "failed",
        "toolate": "failed",
        "holder": "completed",
        "expires": "timed_out",
    }  # toolate can never fit
    assert consumed(tmp_path / "p.db", "b0") == pytest.approx(0.4 + 0.4)  # user jobs are charged their grants
    assert consumed(tmp_path / "p.db", "b1") == pytest.approx(0.4 + 0.3)  # the crash touched data
    assert cli("audit").returncode == 0
    status = cli("status", "3")
    assert "failed (the job raised RuntimeError: the model diverged)" in status.stdout and "placement" in status.stdout
    assert "Traceback" in cli("logs", "3").stdout
    listed = cli("list", "--state", "completed").stdout
    assert "half" in listed and "whole" in listed and "crash" not in listed
    finished = cli("cancel", "1")
    assert finished.returncode != 0 and finished.stderr.strip() == "error: pipeline 1 has already ended (completed)"


def test_submit_wait_prints_the_outcome(cli, db: Path, tmp_path: Path):
    env = {**os.environ, "PRIVSCHED_DB": str(tmp_path / "p.db"), "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [sys.executable, "-m", "privsched", "serve", "--policy", "fcfs", "--tick", "200ms", "--cpus", "2", "-q"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        waited = cli("submit", write_pipeline(tmp_path, "w", "writes_environment", "[b2]", 0.1), "--wait")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()
    assert waited.returncode == 0 and waited.stdout == "pipeline 1 completed\nartifact env.txt (7 bytes)\n"  # and what it left
    assert cli("logs", "1", "--follow").stdout == "hello from pipeline 1\n"  # ended: follow stops at once
    with Ledger(tmp_path / "p.db") as ledger:
        assert ledger.lease_holder() is None  # a stopped scheduler hands its lease back


def test_a_killed_scheduler_restarts_without_losing_or_regranting_anything(cli, db: Path, tmp_path: Path):
    env = {**os.environ, "PRIVSCHED_DB": str(db), "PYTHONPATH": str(REPO)}
    for i in range(3):
        submitted = cli("submit", write_pipeline(tmp_path, f"slow{i}", "waits_for_go_then_spends", f"[b{i}]", 0.2).resolve())
        assert submitted.returncode == 0, submitted.stderr
    first = subprocess.Popen(
        [sys.executable, "-m", "privsched", "serve", "--policy", "fcfs", "--tick", "200ms", "--cpus", "4"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: list(states(db).values()) == ["running"] * 3, "the first scheduler runs all three jobs")
    second = cli("serve", "--policy", "fcfs", "--until-idle")
    assert second.returncode != 0 and "another scheduler is already serving" in second.stderr
    first.send_signal(signal.SIGKILL)
    first.wait()
    for pipeline_id in (1, 2, 3):  # the jobs outlive their scheduler: let them end
        (RunDirs(db).workdir(pipeline_id) / "go").touch()
    cli("submit", write_pipeline(tmp_path, "later", "spend_half", "[b3]", 0.2))  # arrives while no scheduler runs
    restarted = cli("serve", "--policy", "fcfs", "--until-idle", "--tick", "200ms", "--cpus", "4")
    assert restarted.returncode == 0, restarted.stderr
    assert states(db) == {"slow0": "completed", "slow1": "completed", "slow2": "completed", "later": "completed"}
    with Ledger(db) as ledger:
        grants = [e.pipeline_id for e in ledger.events() if e.kind == "grant" and e.target == "granted"]
    assert sorted(grants) == [1, 2, 3, 4]
    assert [consumed(db, f"b{i}") for i in range(4)] == pytest.approx([0.2] * 4)
    assert cli("audit").returncode == 0


def test_concurrent_cli_submissions_are_each_recorded_once(cli, db: Path, tmp_path: Path):
    env = {**os.environ, "PRIVSCHED_DB": str(tmp_path / "p.db"), "PYTHONPATH": str(REPO)}
    spec = write_pipeline(tmp_path, "c", "spend_half", "[b0]", 0.01)
    procs = [
        subprocess.Popen([sys.executable, "-m", "privsched", "submit", str(spec)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    ids = sorted(int(p.communicate()[0]) for p in procs)
    with Ledger(tmp_path / "p.db") as ledger:
        assert ids == [1, 2, 3, 4] == sorted(p.id for p in ledger.list_pipelines())


def test_bad_input_is_one_line_a_failure_and_no_change(cli, db: Path, tmp_path: Path):
    (tmp_path / "malformed.yaml").write_text("name: [unclosed\n")
    unknown = write_pipeline(tmp_path, "nodata", "spend_half", "[b0]", 0.1)
    unknown.write_text(unknown.read_text().replace("reviews", "clicks"))
    cases = [
        (["submit", tmp_path / "malformed.yaml"], "invalid YAML at line"),
        (["submit", unknown], "clicks"),
        (["submit", write_pipeline(tmp_path, "noblock", "spend_half", "{from: z}", 0.1)], "no block of the dataset"),
        (["submit", write_pipeline(tmp_path, "huge", "spend_half", "[b0]", 5.0)], "huge"),
        (["submit", write_pipeline(tmp_path, "gpus", "spend_half", "[b0]", 0.1, "resources: {gpus: 64}\n")], "64 GPU(s)"),
        (["cancel", "42"], "unknown pipeline 42"),
        (["status", "42"], "unknown pipeline 42"),
    ]
    before = dump_database(tmp_path / "p.db")
    for args, message in cases:
        result = cli(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
        assert message in lines[0], (args, lines[0])
    assert dump_database(tmp_path / "p.db") == before

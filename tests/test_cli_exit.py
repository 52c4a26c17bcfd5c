"""The ``privsched`` program ends a successful simulation, submission, ledger, queue or user
command without the interpreter's teardown, yet runs the exit handlers and flushes its
output; a failed command is torn down as usual; a host that calls
:func:`privsched.cli.main` in-process keeps running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SIMULATE = ["simulate", "heterogeneous", "--policy", "dpack-n", "--n", "50", "--duration", "30"]


def test_a_dpack_simulation_exits_0_after_the_exit_handlers_with_its_output_written(tmp_path):
    program = (
        "import atexit, sys\n"
        "from privsched.cli import main\n"
        "atexit.register(lambda: print('exit handlers ran'))\n"
        "sys.argv = ['privsched', *sys.argv[1:]]\n"
        "main()\n"
    )
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-c", program, *SIMULATE, "--out", str(out)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("exit handlers ran")
    assert "wrote" in result.stdout
    assert json.loads((out / "summary.json").read_text())["policy"].startswith("dpack")


def test_a_host_calling_main_in_process_keeps_running_after_a_simulation(tmp_path):
    program = (
        "import sys\n"
        "from tests.cli_inprocess import invoke\n"
        "outcome = invoke(*sys.argv[1:])\n"
        "print('host still running, code', outcome.code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program, *SIMULATE, "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "host still running, code 0"


#: Runs ``privsched <argv>`` as the program; prints when the exit handlers run and when the
#: interpreter tears down the main module (it does not when the teardown is skipped).
TEARDOWN_PROBE = (
    "import atexit, sys\n"
    "from privsched.cli import main\n"
    "class Witness:\n"
    "    def __del__(self):\n"
    "        print('torn down', flush=True)\n"
    "witness = Witness()\n"
    "atexit.register(lambda: print('exit handlers ran'))\n"
    "sys.argv = ['privsched', *sys.argv[1:]]\n"
    "main()\n"
)


def run_program(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PRIVSCHED_DB"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-c", TEARDOWN_PROBE, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A database with a dataset, a block and a statistic pipeline's specification."""
    folder = tmp_path_factory.mktemp("exit")
    job = {"kind": "statistic", "params": {"query": "count"}}
    spec = {"name": "count", "dataset": "reviews", "blocks": {"last": 1}, "epsilon": 0.1, "job": job}
    (folder / "count.json").write_text(json.dumps(spec))
    for setup in (["init"], ["dataset", "create", "reviews", "--epsilon", "10", "--delta", "1e-7"], ["blocks", "add", "reviews", "d1"]):
        assert run_program(*setup, cwd=folder).returncode == 0
    return folder


def test_a_submission_ends_after_the_exit_handlers_without_the_teardown_and_is_recorded(folder):
    submitted = run_program("submit", "count.json", cwd=folder)
    assert (submitted.returncode, submitted.stdout.splitlines(), submitted.stderr) == (0, ["1", "exit handlers ran"], "")
    refused = run_program("submit", "missing.json", cwd=folder)  # a failed command is torn down as usual
    assert refused.returncode == 1
    assert refused.stdout.splitlines() == ["exit handlers ran", "torn down"]
    listed = run_program("list", "--state", "pending", cwd=folder)
    assert listed.returncode == 0
    assert [line.split()[1:6:2] for line in listed.stdout.splitlines() if line.startswith("│ 1 ")] == [["1", "count", "reviews"]]


@pytest.mark.parametrize(
    "args",
    [
        ["dataset", "list"],
        ["blocks", "add", "reviews", "d2"],
        ["budget", "show"],
        ["audit"],
        ["list"],
        ["status", "1"],
        ["user", "list"],
        ["--help"],
    ],
    ids=" ".join,
)
def test_a_ledger_queue_or_user_command_or_the_help_ends_after_the_exit_handlers_without_the_teardown(folder, args):
    done = run_program(*args, cwd=folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "exit handlers ran"
    assert "torn down" not in done.stdout

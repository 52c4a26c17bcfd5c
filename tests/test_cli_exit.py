"""The ``privsched`` program ends a successful simulation without the interpreter's teardown,
yet runs the exit handlers and flushes its output; a host that calls
:func:`privsched.cli.main` in-process keeps running."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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

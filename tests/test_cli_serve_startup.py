"""``privsched serve`` says what it serves with (policy and parameters, pool, executor,
sandbox, database, API address) once it holds the database, and only then; by default it
serves DPF with per-arrival unlocking, N = 100."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]


def test_serve_prints_its_summary_once_it_holds_the_database_and_a_second_one_prints_none(tmp_path: Path, run_cli):
    db = tmp_path / "p.db"
    assert run_cli("init", "--db", db).returncode == 0
    env = {**os.environ, "PRIVSCHED_DB": str(db), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "privsched", "serve", "--listen", "127.0.0.1:0", "--sandbox", "none", "--cpus", "1"]
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        summary = [first.stdout.readline() for _ in range(5)] if first.stdout else []
        assert summary[0] == f"serving {db}\n", "".join(summary)
        assert summary[1] == "  policy    dpf-n (unlock=n, n=100)\n"
        assert summary[2].startswith("  pool      1 CPUs, ") and summary[3] == "  executor  local, sandbox none\n"
        assert summary[4].startswith("  HTTP API  http://127.0.0.1:")
        second = run_cli("serve", "--listen", "127.0.0.1:0", "--until-idle", "--sandbox", "none", env={"PRIVSCHED_DB": str(db)})
        assert second.returncode == 1 and second.stdout == ""
        assert second.stderr.startswith("error: another scheduler is already serving") and len(second.stderr.splitlines()) == 1
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)


def test_a_per_arrival_policy_given_no_n_takes_100_and_another_takes_none(tmp_path: Path, run_cli):
    env = {"PRIVSCHED_DB": str(tmp_path / "p.db")}
    assert run_cli("init", "--db", tmp_path / "p.db").returncode == 0
    for policy, shown in (("rr-n", "rr-n (unlock=n, n=100)"), ("fcfs", "fcfs (unlock=all)"), ("dpf-n", "dpf-n (unlock=n, n=7)")):
        extra = ["--n", "7"] if shown.endswith("n=7)") else []
        served = run_cli("serve", "--policy", policy, *extra, "--until-idle", "--sandbox", "none", "--cpus", "1", env=env)
        assert served.returncode == 0, served.stderr
        assert f"  policy    {shown}\n" in served.stdout

"""Whole-process ``privsched submit``, this checkout against a baseline checkout, interleaved.

Rows: a statistic and a DP-SGD pipeline submitted to a local database, and the same two
through a server (``--server``, each version's own ``privsched serve`` on the loopback),
next to ``python -c pass``. Each version has its own database (one RDP dataset, 30 blocks,
a submitter); run i of every row runs the baseline and this code one after the other, so
that both see the same load; the table gives the median wall and CPU (user + system) time
of ``--repeats`` runs and the CPU ratio. Bytecode is cached as an installed package caches
it (``PYTHONPYCACHEPREFIX``, filled by the set-up). Target (issues 14 and 16): ≤ 0.3 s.

    git archive main | tar -x -C /tmp/main
    .venv/bin/python benchmarks/submit_cli.py --baseline /tmp/main
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cli import DPSGD, REPO, STATISTIC, TARGET_S, timed

ROWS = ("python -c pass", "submit (statistic)", "submit (dpsgd)", "--server submit (statistic)", "--server submit (dpsgd)")


class Version:
    """One checkout: its database, its server and the command line of each row."""

    def __init__(self, name: str, repo: Path, python: str, work: Path, env: dict[str, str]) -> None:
        self.name, self.python, self.work = name, python, work
        self.env = {**env, "PYTHONPATH": str(repo)}
        self.db = str(work / "bench.db")
        for kind, spec in (("statistic", STATISTIC), ("dpsgd", DPSGD)):
            (work / f"{kind}.json").write_text(json.dumps(spec))
        for setup in (
            ["init"],
            ["dataset", "create", "reviews", "--epsilon", "10", "--delta", "1e-7"],
            ["blocks", "add", "reviews", *[f"day-{i:03d}" for i in range(30)]],
        ):
            timed(self.cli(*setup, "--db", self.db), self.env, work)
        added = subprocess.run(
            self.cli("user", "add", "bench", "--role", "submitter", "--db", self.db), env=self.env, cwd=work, capture_output=True, text=True
        )
        token = added.stdout.strip().splitlines()[-1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.server = subprocess.Popen(
            self.cli("serve", "--db", self.db, "--listen", f"127.0.0.1:{port}"),
            env=self.env,
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        while "HTTP API on" not in (line := self.server.stdout.readline()):  # type: ignore[union-attr]
            if not line:
                raise SystemExit(f"{name}: privsched serve did not start")
        self.remote_env = {**self.env, "PRIVSCHED_SERVER": f"http://127.0.0.1:{port}", "PRIVSCHED_TOKEN": token}

    def cli(self, *words: str) -> list[str]:
        return [self.python, "-m", "privsched", *words]

    def run(self, row: str) -> tuple[float, float]:
        if row == "python -c pass":
            return timed([self.python, "-c", "pass"], self.env, self.work)
        kind = "statistic" if "statistic" in row else "dpsgd"
        spec = str(self.work / f"{kind}.json")
        if row.startswith("--server"):
            return timed(self.cli("submit", spec), self.remote_env, self.work)
        return timed(self.cli("submit", spec, "--db", self.db), self.env, self.work)

    def close(self) -> None:
        self.server.terminate()
        self.server.communicate(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="Checkout to compare with (e.g. main).")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--python", default=sys.executable, help="Interpreter of both checkouts' environment.")
    args = parser.parse_args()
    dropped = ("PRIVSCHED_DB", "PRIVSCHED_SERVER", "PRIVSCHED_TOKEN", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    with tempfile.TemporaryDirectory() as folder:
        env["PYTHONPYCACHEPREFIX"] = str(Path(folder) / "pycache")
        versions = []
        try:
            for name, repo in (("baseline", args.baseline.resolve()), ("this code", REPO)):
                (Path(folder) / name).mkdir()
                versions.append(Version(name, repo, args.python, Path(folder) / name, env))
            times: dict[tuple[str, str], list[tuple[float, float]]] = {(v.name, row): [] for v in versions for row in ROWS}
            for _ in range(args.repeats):
                for row in ROWS:
                    for version in versions:
                        times[version.name, row].append(version.run(row))
        finally:
            for version in versions:
                version.close()
    print(f"`privsched submit`, whole process, median of {args.repeats} interleaved runs; baseline: {args.baseline}")
    print(f"| command | this code wall s | CPU s | baseline wall s | CPU s | CPU this/baseline | ≤ {TARGET_S} s (wall / CPU) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in ROWS:
        (wall, cpu), (base_wall, base_cpu) = (median(times[name, row]) for name in ("this code", "baseline"))
        met = "" if row.startswith("python") else f"{'yes' if wall <= TARGET_S else 'no'} / {'yes' if cpu <= TARGET_S else 'no'}"
        print(f"| {row} | {wall:.3f} | {cpu:.3f} | {base_wall:.3f} | {base_cpu:.3f} | {cpu / base_cpu:.2f} | {met} |")


def median(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


if __name__ == "__main__":
    main()

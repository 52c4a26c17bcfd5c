"""Whole-process time of each ``privsched`` command against Python's own start-up.

Every command runs as a fresh ``python -m privsched ...`` process, as a user's shell runs
it; the time is the median wall time of ``--repeats`` runs (default 5), next to two
baselines measured in the same run: ``python -c pass`` (the interpreter alone) and
``python -c "import privsched"``. The database holds one RDP dataset with ``--blocks``
blocks and a few pending pipelines. Target: every command that does not itself compute
answers within 0.3 s.

A second table times ``privsched simulate multi-block --policy dpf-n --n 175`` as a whole
process, with and without ``--plots``, against the simulation's own run time (the
``runtime_s`` its summary reports). Target: whole process ≤ simulation + 0.5 s.

Each process may cache the bytecode it compiles, as an installed package does (the
caches go to a temporary folder, ``PYTHONPYCACHEPREFIX``, and the set-up commands fill them);
``--no-bytecode-cache`` measures a cold compile of every module instead (what a shell with
``PYTHONDONTWRITEBYTECODE`` set pays every time).

Run from the repository root: ``.venv/bin/python benchmarks/cli.py``. ``--repo`` and
``--python`` measure another checkout and environment with the same script; ``--before``
(and ``--before-python``) also measure an earlier version (e.g. a ``git archive main`` copy)
in the same run, each command's runs alternating between the two, and print both with their
ratio. ``list --state cancelled`` lists without ranking the pending pipelines (``list``
says why each waits).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.3

STATISTIC = {
    "name": "count",
    "dataset": "reviews",
    "blocks": {"last": 2},
    "epsilon": 0.1,
    "job": {"kind": "statistic", "params": {"query": "count"}},
}
DPSGD = {
    "name": "mlp",
    "dataset": "reviews",
    "blocks": {"last": 10},
    "epsilon": 1.0,
    "delta": 1e-9,
    "job": {"kind": "dpsgd", "params": {"model": "mlp", "sample_rate": 0.05, "epochs": 2, "lr": 0.05}},
}


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_time(make_argv: Callable[[int], list[str]], repeats: int, env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Median wall and CPU time of ``repeats`` runs; ``make_argv(i)`` gives the i-th command line."""
    runs = [timed(make_argv(i), env, cwd) for i in range(repeats)]
    return statistics.median(wall for wall, _ in runs), statistics.median(cpu for _, cpu in runs)


@dataclass
class Checkout:
    """One version of privsched under test: its interpreter, environment and database."""

    label: str
    python: str
    env: dict[str, str]
    work: Path

    @property
    def db(self) -> str:
        return str(self.work / "bench.db")

    def cli(self, *words: str) -> list[str]:
        return [self.python, "-m", "privsched", *words]


def prepare(label: str, repo: Path, python: str, work: Path, blocks: int, repeats: int, cold: bool, pending: int = 0) -> Checkout:
    """A checkout's environment and a database of one RDP dataset with ``blocks`` blocks and
    ``repeats`` pending statistic pipelines (for ``cancel`` to cancel), then ``pending``
    more submitted in one transaction through the Python API (``list`` and ``status`` rank them)."""
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PRIVSCHED_DB", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = str(repo)
    if cold:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    for name, spec in (("statistic", STATISTIC), ("dpsgd", DPSGD)):
        (work / f"{name}.json").write_text(json.dumps(spec))
    checkout = Checkout(label, python, env, work)
    db = checkout.db
    for setup in (
        checkout.cli("init", "--db", db),
        checkout.cli("dataset", "create", "reviews", "--epsilon", "10", "--delta", "1e-7", "--db", db),
        checkout.cli("blocks", "add", "reviews", *[f"day-{i:03d}" for i in range(blocks)], "--db", db),
    ):
        timed(setup, env, work)
    for _ in range(repeats):
        timed(checkout.cli("submit", str(work / "statistic.json"), "--db", db), env, work)
    if pending:
        more = f"import privsched as ps; ps.connect({db!r}).submit_many([{STATISTIC!r}] * {pending})"
        subprocess.run([python, "-c", more], env=env, cwd=work, check=True)
    return checkout


def commands(c: Checkout) -> list[tuple[str, Callable[[int], list[str]]]]:
    """Each measured command line of checkout ``c``; the i-th run gets ``make(i)``."""
    db, work = c.db, c.work
    return [
        ("python -c pass", lambda i: [c.python, "-c", "pass"]),
        ("python -c 'import privsched'", lambda i: [c.python, "-c", "import privsched"]),
        ("--help", lambda i: c.cli("--help")),
        ("init", lambda i: c.cli("init", "--db", db)),
        ("dataset create", lambda i: c.cli("dataset", "create", f"d{i}", "--epsilon", "1", "--delta", "1e-6", "--db", db)),
        ("dataset list", lambda i: c.cli("dataset", "list", "--db", db)),
        ("blocks add", lambda i: c.cli("blocks", "add", "reviews", f"extra-{i}", "--db", db)),
        ("blocks list", lambda i: c.cli("blocks", "list", "reviews", "--db", db)),
        ("submit (statistic)", lambda i: c.cli("submit", str(work / "statistic.json"), "--db", db)),
        ("submit (dpsgd)", lambda i: c.cli("submit", str(work / "dpsgd.json"), "--db", db)),
        ("list", lambda i: c.cli("list", "--db", db)),
        ("status", lambda i: c.cli("status", "1", "--db", db)),
        ("cancel", lambda i: c.cli("cancel", str(i + 1), "--db", db)),
        ("list --state cancelled", lambda i: c.cli("list", "--state", "cancelled", "--db", db)),
        ("budget show", lambda i: c.cli("budget", "show", "--db", db)),
        ("audit", lambda i: c.cli("audit", "--db", db)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pending", type=int, default=0, help="Further pending pipelines for list and status to rank.")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--repo", type=Path, default=REPO, help="Checkout whose privsched is measured.")
    parser.add_argument("--python", default=sys.executable, help="Interpreter of that checkout's environment.")
    parser.add_argument("--before", type=Path, help="A checkout of an earlier version, measured in the same run (runs alternate).")
    parser.add_argument("--before-python", help="Interpreter of that checkout's environment (default: --python).")
    parser.add_argument("--no-bytecode-cache", action="store_true", help="Compile every module in every process.")
    parser.add_argument("--no-simulate", action="store_true", help="Skip the simulate table.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        setup = (args.blocks, args.repeats, args.no_bytecode_cache, args.pending)
        after = prepare("after", args.repo.resolve(), args.python, work / "after", *setup)
        before = None
        if args.before is not None:
            before = prepare("before", args.before.resolve(), args.before_python or args.python, work / "before", *setup)
        checkouts = [c for c in (before, after) if c is not None]
        lines = [commands(c) for c in checkouts]
        rows = []
        for index, (name, _) in enumerate(lines[-1]):
            runs: list[list[tuple[float, float]]] = [[] for _ in checkouts]
            for i in range(args.repeats):  # alternate, so that a change of the machine's load hits both alike
                for k, c in enumerate(checkouts):
                    runs[k].append(timed(lines[k][index][1](i), c.env, c.work))
            rows.append((name, [(statistics.median(w for w, _ in r), statistics.median(u for _, u in r)) for r in runs]))
        simulations = []
        if not args.no_simulate:
            options = subprocess.run(after.cli("simulate", "--help"), env=after.env, cwd=after.work, capture_output=True, text=True).stdout
            flags = ("--no-plots", "--plots") if "--no-plots" in options else ("",)  # earlier versions always plot
            simulations = [(flag, simulate_times(after.cli, flag, args.repeats, after.env, after.work)) for flag in flags]
    cache = "no bytecode cache" if args.no_bytecode_cache else "bytecode cached"
    database = f"{args.blocks} blocks, {args.repeats + args.pending} pending"
    print(f"privsched at {args.repo.resolve()}, median of {args.repeats} whole-process runs, {database}, {cache}")
    bare = rows[0][1][-1][0]
    if before is None:
        print(f"| command | wall s | CPU s | wall − python -c pass | × python -c pass | ≤ {TARGET_S} s wall |")
        print("|---|---:|---:|---:|---:|---|")
        for name, ((wall, cpu),) in rows:
            met = "" if name.startswith("python") else ("yes" if wall <= TARGET_S else "no")
            print(f"| {name} | {wall:.3f} | {cpu:.3f} | {wall - bare:.3f} | {wall / bare:.1f} | {met} |")
    else:
        print(f"before: {args.before.resolve()} (runs alternate with the after version's)")
        header = "| command | before wall s | after wall s | after ÷ before | before CPU s | after CPU s | after − python -c pass"
        print(f"{header} | ≤ {TARGET_S} s wall |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for name, ((wall0, cpu0), (wall, cpu)) in rows:
            met = "" if name.startswith("python") else ("yes" if wall <= TARGET_S else "no")
            print(f"| {name} | {wall0:.3f} | {wall:.3f} | {wall / wall0:.2f} | {cpu0:.3f} | {cpu:.3f} | {wall - bare:.3f} | {met} |")
    if simulations:
        print()
        print("| simulate multi-block, dpf-n N = 175 | whole process s | CPU s | simulation s | overhead s | ≤ 0.5 s |")
        print("|---|---:|---:|---:|---:|---|")
        for flag, (wall, cpu, simulation) in simulations:
            overhead = wall - simulation
            met = "yes" if overhead <= 0.5 else "no"
            print(f"| {flag or 'plots always drawn'} | {wall:.3f} | {cpu:.3f} | {simulation:.3f} | {overhead:.3f} | {met} |")


def simulate_times(cli: Callable[..., list[str]], flag: str, repeats: int, env: dict[str, str], cwd: Path) -> tuple[float, float, float]:
    """Median whole-process wall and CPU time of a simulation, and median simulation time."""
    walls, cpus, runs = [], [], []
    for i in range(repeats):
        out = cwd / f"sim{flag}{i}"
        argv = cli("simulate", "multi-block", "--policy", "dpf-n", "--n", "175", "--out", str(out))
        wall, cpu = timed(argv + ([flag] if flag else []), env, cwd)
        walls.append(wall)
        cpus.append(cpu)
        runs.append(json.loads((out / "summary.json").read_text())["runtime_s"])
    return statistics.median(walls), statistics.median(cpus), statistics.median(runs)


if __name__ == "__main__":
    main()

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
``--python`` measure another checkout and environment (e.g. the previous version) with the
same script.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--repo", type=Path, default=REPO, help="Checkout whose privsched is measured.")
    parser.add_argument("--python", default=sys.executable, help="Interpreter of that checkout's environment.")
    parser.add_argument("--no-bytecode-cache", action="store_true", help="Compile every module in every process.")
    args = parser.parse_args()
    repo = args.repo.resolve()
    env = {k: v for k, v in os.environ.items() if k not in ("PRIVSCHED_DB", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = str(repo)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        if args.no_bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        db = str(work / "bench.db")
        for name, spec in (("statistic", STATISTIC), ("dpsgd", DPSGD)):
            (work / f"{name}.json").write_text(json.dumps(spec))

        def cli(*words: str) -> list[str]:
            return [args.python, "-m", "privsched", *words]

        for setup in (
            cli("init", "--db", db),
            cli("dataset", "create", "reviews", "--epsilon", "10", "--delta", "1e-7", "--db", db),
            cli("blocks", "add", "reviews", *[f"day-{i:03d}" for i in range(args.blocks)], "--db", db),
        ):
            timed(setup, env, work)
        for _ in range(args.repeats):  # pipelines for `cancel` to cancel
            timed(cli("submit", str(work / "statistic.json"), "--db", db), env, work)

        commands: list[tuple[str, Callable[[int], list[str]]]] = [
            ("python -c pass", lambda i: [args.python, "-c", "pass"]),
            ("python -c 'import privsched'", lambda i: [args.python, "-c", "import privsched"]),
            ("--help", lambda i: cli("--help")),
            ("init", lambda i: cli("init", "--db", db)),
            ("dataset create", lambda i: cli("dataset", "create", f"d{i}", "--epsilon", "1", "--delta", "1e-6", "--db", db)),
            ("dataset list", lambda i: cli("dataset", "list", "--db", db)),
            ("blocks add", lambda i: cli("blocks", "add", "reviews", f"extra-{i}", "--db", db)),
            ("blocks list", lambda i: cli("blocks", "list", "reviews", "--db", db)),
            ("submit (statistic)", lambda i: cli("submit", str(work / "statistic.json"), "--db", db)),
            ("submit (dpsgd)", lambda i: cli("submit", str(work / "dpsgd.json"), "--db", db)),
            ("list", lambda i: cli("list", "--db", db)),
            ("status", lambda i: cli("status", "1", "--db", db)),
            ("cancel", lambda i: cli("cancel", str(i + 1), "--db", db)),
            ("budget show", lambda i: cli("budget", "show", "--db", db)),
            ("audit", lambda i: cli("audit", "--db", db)),
        ]
        rows = [(name, median_time(make, args.repeats, env, work)) for name, make in commands]
        options = subprocess.run(cli("simulate", "--help"), env=env, cwd=work, capture_output=True, text=True).stdout
        flags = ("--no-plots", "--plots") if "--no-plots" in options else ("",)  # earlier versions always plot
        simulations = [(flag, simulate_times(cli, flag, args.repeats, env, work)) for flag in flags]
    (bare, _), (package, _) = rows[0][1], rows[1][1]
    cache = "no bytecode cache" if args.no_bytecode_cache else "bytecode cached"
    print(f"privsched at {repo}, median of {args.repeats} whole-process runs, {args.blocks} blocks, {cache}")
    print(f"| command | wall s | CPU s | wall − python -c pass | × python -c pass | × import privsched | ≤ {TARGET_S} s |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, (wall, cpu) in rows:
        met = "" if name.startswith("python") else ("yes" if wall <= TARGET_S else "no")
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | {wall - bare:.3f} | {wall / bare:.1f} | {wall / package:.1f} | {met} |")
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

"""Whole-process ``privsched simulate`` against the simulation time it reports.

Each reference workload is simulated by a fresh ``python -m privsched simulate ...`` process,
as a user's shell runs it (default ``--no-plots``); the process's wall and CPU time (user +
system) are set against the event loop's own ``runtime_s`` and ``cpu_s`` from the
``summary.json`` it writes. The overhead (whole process − simulation) is what start-up,
workload generation, writing the results and printing cost. Baseline measured in the same
run: ``python -c pass`` (the interpreter alone). Target: overhead ≤ 0.5 s.

Run from the repository root: ``.venv/bin/python benchmarks/simulate_cli.py [--repeats 5]``.
``--repo`` and ``--python`` measure another checkout and environment with the same script.
An editable install's import hook imports its own checkout whatever ``PYTHONPATH`` says, so
with ``--repo`` every process (the baseline's too) starts through :data:`LAUNCHER`, which
drops that hook first; compare two checkouts by giving ``--repo`` for both.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.5

#: (workload, simulate options): the OSDI'21 microbenchmarks at the paper's DPF-N, basic and
#: RDP, the macrobenchmark, and the heterogeneous workload under DPack.
CASES = [
    ("single-block", ["--policy", "dpf-n", "--n", "175"]),
    ("multi-block", ["--policy", "dpf-n", "--n", "175"]),
    ("multi-block-rdp", ["--policy", "dpf-n", "--n", "14514"]),
    ("macro", ["--policy", "dpf-n", "--n", "100"]),
    ("heterogeneous", ["--policy", "dpack-n", "--n", "100"]),
]


#: ``python -c LAUNCHER REPO ARGS...`` runs ``python ARGS...`` (``-c CODE`` or ``-m MODULE``)
#: with REPO's packages imported, not those of an editable install.
LAUNCHER = """
import runpy, sys
sys.meta_path[:] = [finder for finder in sys.meta_path if "editable" not in repr(finder).lower()]
repo, flag, target, *rest = sys.argv[1:]
sys.path.insert(0, repo)
sys.argv = [target, *rest]
if flag == "-c":
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--repo", type=Path, help="Checkout whose privsched is measured (default: this one, run plainly).")
    parser.add_argument("--python", default=sys.executable, help="Interpreter of that checkout's environment.")
    parser.add_argument("--only", default="", help="Comma-separated workloads (default: all).")
    args = parser.parse_args()
    repo = (args.repo or REPO).resolve()
    env = {**os.environ, "PYTHONPATH": str(repo)}
    python = [args.python] if args.repo is None else [args.python, "-c", LAUNCHER, str(repo)]
    cases = [c for c in CASES if not args.only or c[0] in args.only.split(",")]
    interpreter = [timed([*python, "-c", "pass"], env) for _ in range(args.repeats)]
    print(
        f"`python -c pass`: {statistics.median(w for w, _ in interpreter):.3f} s wall, "
        f"{statistics.median(c for _, c in interpreter):.3f} s CPU (median of {args.repeats})\n"
    )
    print(
        "| workload | options | whole wall s | whole CPU s | simulation wall s | simulation CPU s "
        "| overhead wall s | overhead CPU s | overhead ≤ 0.5 s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as folder:
        for workload, options in cases:
            rows = []
            for i in range(args.repeats):
                out = Path(folder) / f"{workload}-{i}"
                wall, cpu = timed([*python, "-m", "privsched", "simulate", workload, "--out", str(out), *options], env)
                summary = json.loads((out / "summary.json").read_text())
                rows.append((wall, cpu, summary["runtime_s"], summary["cpu_s"]))
            whole_wall, whole_cpu, sim_wall, sim_cpu = (statistics.median(column) for column in zip(*rows))
            over_wall = statistics.median(w - s for w, _, s, _ in rows)
            over_cpu = statistics.median(c - s for _, c, _, s in rows)
            verdict = "yes" if over_cpu <= TARGET_S and over_wall <= TARGET_S else ("CPU only" if over_cpu <= TARGET_S else "no")
            print(
                f"| {workload} | `{' '.join(options)}` | {whole_wall:.2f} | {whole_cpu:.2f} | {sim_wall:.2f} | "
                f"{sim_cpu:.2f} | {over_wall:.2f} | {over_cpu:.2f} | {verdict} |",
                flush=True,
            )
    print(f"\nMedians of {args.repeats} runs; overhead = whole process − the simulation's own time, per run.")


if __name__ == "__main__":
    main()

"""Job start on the local executor: cold (a new interpreter per job) against warm (forked from
the fork server, which has the runner, torch and Opacus imported).

Measured from the executor's ``start`` call (the moment a granted job is handed to it) to:

- **statistic**: the first line of the job's code, the job confined by Landlock as always;
- **DP-SGD**: the end of the first DP-SGD step (Opacus, a logistic regression on 256 synthetic
  rows; see ``benchmarks/launch_jobs.py``), imports included;
- **statistic, grant → start**: from a pipeline's grant in the ledger to the first line of its
  job's code, through a scheduler serving in a thread with the executor (FCFS, ticks of
  10 ms), one pipeline at a time;
- **built-in DP count, grant → settled**: the same, to the ledger's settlement of a built-in
  ``statistic`` job (a count with OpenDP's Laplace noise).

Cold and warm launches alternate, ``--runs`` of each (default 7), one at a time; the table
gives the median and the ratio cold / warm. The fork server is started, and waited for,
before the first warm launch (its start is not part of any job's start).

Run from the repository root: ``.venv/bin/python benchmarks/launch.py [--runs N] [--sandbox none]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from privsched import connect  # noqa: E402
from privsched.budgets import Accounting  # noqa: E402
from privsched.jobs.context import BlockGrant, JobContext  # noqa: E402
from privsched.service.executors.base import Launch  # noqa: E402
from privsched.service.executors.local import LocalExecutor  # noqa: E402
from privsched.policies import make_policy  # noqa: E402
from privsched.service.resources import Placement, Pool  # noqa: E402
from privsched.service.serve import serve  # noqa: E402

JOBS = {"statistic": "launch_jobs:statistic", "DP-SGD": "launch_jobs:first_dpsgd_step"}


def launch_for(folder: Path, function: str, pipeline_id: int) -> Launch:
    folder.mkdir(parents=True)
    ctx = JobContext(
        pipeline_id=pipeline_id,
        name="bench",
        dataset="d",
        accounting=Accounting.basic(),
        delta=1e-9,
        blocks={"b": BlockGrant("b", None, np.array([1.0, 1e-9]))},
        device="cpu",
        workdir=folder / "work",
        params={},
    )
    job = {"function": function, "pythonpath": [str(REPO / "benchmarks")]}
    (folder / "context.json").write_text(json.dumps({**json.loads(ctx.to_json()), "job": job}))
    return Launch(pipeline_id, folder / "context.json", folder / "result.json", folder / "job.log", Placement((), 1.0, 0), time.time())


def time_to_start(executor: LocalExecutor, launch: Launch) -> float:
    """Seconds from ``start`` to the time the job wrote; the job must complete."""
    began = time.time()
    executor.start(launch)
    while True:
        results = executor.poll(time.time())
        if results:
            break
        time.sleep(0.005)
    if not results[0].completed:
        raise SystemExit(f"the job failed: {results[0].message} (log: {launch.log})")
    return float((launch.context.parent / "work" / "started").read_text()) - began


def through_scheduler(folder: Path, executor: LocalExecutor, runs: int) -> tuple[list[float], list[float]]:
    """Seconds from each pipeline's grant to its job's first line (a user statistic job), and
    from the grant to the settled result of a built-in DP count; ``runs`` of each, submitted
    one at a time to a scheduler serving with ``executor``."""
    folder.mkdir()
    np.savez(folder / "b0.npz", rating=np.arange(10.0))
    client = connect(folder / "privsched.db")
    client.create_dataset("d", epsilon=10, delta=1e-7, accounting="basic")
    client.add_blocks("d", [("b0", str(folder / "b0.npz"))])
    stop = threading.Event()
    thread = threading.Thread(
        target=serve, args=(client.path, make_policy("fcfs"), executor, Pool((), cpus=2.0, memory=0)), kwargs={"tick": 0.01, "stop": stop}
    )
    thread.start()
    user_job = {"function": JOBS["statistic"], "pythonpath": [str(REPO / "benchmarks")]}
    count_job = {"kind": "statistic", "params": {"query": "count"}}
    to_start, to_result = [], []
    try:
        for i in range(runs):
            for job, times in ((user_job, to_start), (count_job, to_result)):
                run = client.submit(
                    {"name": f"s{i}", "dataset": "d", "blocks": ["b0"], "epsilon": 0.01, "job": job, "resources": {"cpus": 1}}
                )
                while (info := client.status(run.id)).state in ("pending", "granted", "running"):
                    time.sleep(0.005)
                if info.state != "completed":
                    raise SystemExit(f"the probe ended {info.state}: {info.message}")
                ended = float((client.runs.workdir(run.id) / "started").read_text()) if job is user_job else info.finished_at
                times.append(ended - info.granted_at)
    finally:
        stop.set()
        thread.join()
        client.close()
    return to_start, to_result


def wait_ready(executor: LocalExecutor) -> float:
    assert executor.launcher is not None
    began = time.monotonic()
    while True:
        server = executor.launcher.maintain()
        if server is not None and server.ready:
            return time.monotonic() - began
        if time.monotonic() - began > 300:
            raise SystemExit("the fork server did not become ready within 300 s")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sandbox", choices=("landlock", "none"), default="landlock")
    args = parser.parse_args()
    cold, warm = LocalExecutor(warm=False), LocalExecutor()
    for executor in (cold, warm):
        executor.sandbox = args.sandbox
    print(f"fork server ready after {wait_ready(warm):.2f} s (once, when the executor starts)")
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="privsched-launch-") as folder:
        pipeline_id = 0
        for _ in range(args.runs):
            for job, function in JOBS.items():
                for mode, executor in (("cold", cold), ("warm", warm)):
                    pipeline_id += 1
                    launch = launch_for(Path(folder) / str(pipeline_id), function, pipeline_id)
                    times.setdefault((job, mode), []).append(time_to_start(executor, launch))
        for mode, executor in (("cold", cold), ("warm", warm)):
            to_start, to_result = through_scheduler(Path(folder) / mode, executor, args.runs)
            times[("statistic, grant → start", mode)] = to_start
            times[("built-in DP count, grant → settled", mode)] = to_result
    assert warm.launcher is not None
    warm.launcher.close()
    print(f"\nstart → job running (median of {args.runs}, sandbox {args.sandbox})\n")
    print("| job | cold (ms) | warm (ms) | cold / warm |")
    print("|---|---:|---:|---:|")
    for job in [*JOBS, "statistic, grant → start", "built-in DP count, grant → settled"]:
        c, w = statistics.median(times[(job, "cold")]), statistics.median(times[(job, "warm")])
        print(f"| {job} | {1000 * c:.0f} | {1000 * w:.0f} | {c / w:.1f} |")


if __name__ == "__main__":
    main()

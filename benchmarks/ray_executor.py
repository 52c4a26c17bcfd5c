"""Dispatch overhead and short-job throughput: the local executor against the Ray executor.

Both run on this machine with the same compute: the local executor serves a pool of
``--cpus`` CPUs; the Ray executor a one-machine cluster of ``--cpus`` CPUs started for the
run (:func:`privsched.service.executors.ray_local.local_cluster`), or the cluster at
``--ray-address``. A scheduler (FCFS, tick 0.2 s) serves the database in a thread. The job is
``tests.ray_jobs:reports_gpus`` with no sleep: it reads its block, records when its code
started, and reports half its grant. Measured, per executor:

- dispatch overhead: from the grant (the ledger's ``granted_at``) to the first line of the
  job's own code, one job at a time (``--dispatch`` jobs, median); and from the job's last
  line to its pipeline being settled in the ledger;
- throughput: ``--burst`` such jobs submitted at once, 0.5 CPU each, from the first grant to
  the last settlement.

With ``--auth`` the Ray executor is measured a second time on a cluster started with Ray's
token authentication (``RAY_AUTH_MODE=token``; the executor sends the token in every request),
to show what authentication costs.

Run from the repository root: ``.venv/bin/python benchmarks/ray_executor.py [--quick] [--auth]``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from privsched import connect  # noqa: E402
from privsched.client import Client, Run  # noqa: E402
from privsched.service.executors.ray_local import local_cluster  # noqa: E402

JOB = {"function": "tests.ray_jobs:reports_gpus", "pythonpath": [str(REPO)]}


def spec(name: str) -> dict:
    return {"name": name, "dataset": "bench", "blocks": ["b0"], "epsilon": 0.001, "delta": 1e-9, "job": JOB, "resources": {"cpus": 0.5}}


def wait(runs: list[Run], scheduler: threading.Thread) -> None:
    while not all(r.done for r in runs):
        if not scheduler.is_alive():
            raise RuntimeError("the scheduler stopped")
        time.sleep(0.05)
    bad = [f"{r.id}: {r.status} {r.message}" for r in runs if r.status != "completed"]
    if bad:
        raise RuntimeError(f"jobs did not complete: {bad}")


def measure(folder: Path, executor: str, address: str | None, cpus: float, dispatch: int, burst: int) -> dict:
    """Dispatch and settle latencies (medians, s) and burst throughput (jobs/s) of one executor."""
    client: Client = connect(folder / f"{executor}.db")
    client.create_dataset("bench", epsilon=1000.0, delta=1e-6, accounting="basic")
    client.add_blocks("bench", [("b0", str(folder))])
    stop = threading.Event()
    options = {"ray_address": address} if executor == "ray" else {}

    def serve() -> None:
        with connect(client.path) as server:
            server.serve("fcfs", executor=executor, tick=0.2, cpus=cpus, stop=stop, **options)

    scheduler = threading.Thread(target=serve, daemon=True)
    scheduler.start()
    try:
        while client.runs.recorded_pool() is None:
            time.sleep(0.05)
        start, settle = [], []
        for i in range(dispatch + 1):  # the first job warms the executor up, and is left out
            run = client.submit(spec(f"one-{i}"))
            wait([run], scheduler)
            info = run.info
            if i:
                start.append(run.metrics["started"] - info.granted_at)
                settle.append(info.finished_at - run.metrics["ended"])
        runs = client.submit_many([spec(f"burst-{i}") for i in range(burst)])
        wait(runs, scheduler)
        infos = [r.info for r in runs]
        span = max(i.finished_at for i in infos) - min(i.granted_at for i in infos)
    finally:
        stop.set()
        scheduler.join()
        client.close()
    return {"start": statistics.median(start), "settle": statistics.median(settle), "throughput": burst / span}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dispatch", type=int, default=10, help="jobs run one at a time (median kept)")
    parser.add_argument("--burst", type=int, default=40, help="jobs submitted at once for the throughput")
    parser.add_argument("--cpus", type=float, default=2.0, help="CPUs of the pool and of the local Ray cluster")
    parser.add_argument("--ray-address", default=None, help="an existing cluster (default: start one here)")
    parser.add_argument("--quick", action="store_true", help="3 dispatch jobs and a burst of 12")
    parser.add_argument("--auth", action="store_true", help="also on a cluster with token authentication")
    args = parser.parse_args()
    if args.quick:
        args.dispatch, args.burst = 3, 12
    with tempfile.TemporaryDirectory(prefix="privsched-bench-") as tmp:
        local = measure(Path(tmp), "local", None, args.cpus, args.dispatch, args.burst)
        with ExitStack() as stack:
            address = args.ray_address or stack.enter_context(local_cluster(cpus=args.cpus))
            ray = measure(Path(tmp), "ray", address, args.cpus, args.dispatch, args.burst)
        columns = [("local", local), ("ray", ray)]
        if args.auth:
            token = secrets.token_hex(32)
            (Path(tmp) / "auth").mkdir()
            with local_cluster(cpus=args.cpus, token=token) as address:
                os.environ["RAY_AUTH_TOKEN"] = token  # the operator's token, as the executor reads it
                try:
                    columns.append(("ray, token auth", measure(Path(tmp) / "auth", "ray", address, args.cpus, args.dispatch, args.burst)))
                finally:
                    del os.environ["RAY_AUTH_TOKEN"]
    print(f"{args.cpus:g} CPUs, jobs of 0.5 CPU; {args.dispatch} jobs one at a time, bursts of {args.burst}\n")
    names = [name for name, _ in columns]
    ratios = ["ray / local"] + (["token auth / ray"] if args.auth else [])
    print("| measure | " + " | ".join(names + ratios) + " |")
    print("|---" * (1 + len(names) + len(ratios)) + "|")
    for key, label, unit in (
        ("start", "grant → job code starts (median)", "s"),
        ("settle", "job code ends → settled in the ledger (median)", "s"),
        ("throughput", f"throughput, {args.burst} short jobs at once", "jobs/s"),
    ):
        values = [f"{result[key]:.3f} {unit}" for _, result in columns]
        shown = [f"{ray[key] / local[key]:.2f}×"] + ([f"{columns[2][1][key] / ray[key]:.2f}×"] if args.auth else [])
        print(f"| {label} | " + " | ".join(values + shown) + " |")


if __name__ == "__main__":
    main()

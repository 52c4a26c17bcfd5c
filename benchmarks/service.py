"""Submission throughput and submit-to-grant latency of the scheduler service.

The database holds a backlog of ``--pending`` pipelines (default 10,000) over ``--blocks``
blocks (default 1,000) of one RDP dataset, (ε_G, δ_G) = (10, 1e-7), each pipeline asking
for 1–10 consecutive blocks with a Gaussian mechanism (σ ∈ [1, 10]).
Measured:

- submissions per second through ``privsched submit`` (one process per submission, as a
  user's shell loop would) and through ``Client.submit`` (one transaction per pipeline);
- latency from the submit call to the grant, as the submitter sees it (polling its
  status every 2 ms), when budget is free: a scheduler
  (``privsched serve --policy dpf-n --n 1e9 --tick 1s``) serves the database, the backlog
  stays pending (its blocks unlock 1/10^9 per arrival), and each probe pipeline asks for a
  fully unlocked block of its own; probes go one at a time, the next half a second after
  the previous one's job has ended and been settled. With ``--baseline DIR`` (a copy of other code of privsched, e.g.
  ``git archive main | tar -x -C DIR``) the Python API's probes run against the scheduler of
  that code too, the two serving in turns (``--rounds``) in the same run.

- the cost of confinement on job start (``--confinement``): from a pipeline's grant to the
  first line of its job's code, with the job run under Landlock and under ``--sandbox none``
  (a small database, probes alternating between the two modes in one process).

Run from the repository root: ``.venv/bin/python benchmarks/service.py [--quick] [--confinement]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from privsched.budgets import Gaussian, demand_vector, mechanism_json  # noqa: E402
from privsched import connect  # noqa: E402
from privsched.client import Client  # noqa: E402
from privsched.ledger import BlockSpec, PipelineRequest  # noqa: E402

JOB = {"function": "tests.service_jobs:spend_half"}


def build(path: Path, blocks: int, pending: int, seed: int = 0) -> Client:
    """The database with its backlog (written in batches straight through the ledger)."""
    client = connect(path)
    dataset = client.create_dataset("reviews", epsilon=10, delta=1e-7, accounting="rdp")
    keys = [f"block-{i:05d}" for i in range(blocks)]
    client.ledger.add_blocks("reviews", [BlockSpec(k) for k in keys])
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(pending):
        mechanism = Gaussian(sigma=float(rng.uniform(1.0, 10.0)))
        width = int(rng.integers(1, 11))
        start = int(rng.integers(0, blocks - width + 1))
        requests.append(
            PipelineRequest(
                name=f"backlog-{i}",
                dataset="reviews",
                block_keys=keys[start : start + width],
                demand=demand_vector(mechanism, dataset.accounting),
                mechanism=mechanism_json(mechanism),
                owner="bench",
                job=JOB,
                resources={"gpus": 0, "cpus": 0.01, "memory": 0},
            )
        )
    for chunk in range(0, pending, 1000):
        client.ledger.submit_many(requests[chunk : chunk + 1000])
    return client


def probe_spec(name: str, block: str) -> dict:
    return {
        "name": name,
        "dataset": "reviews",
        "blocks": [block],
        "mechanism": {"kind": "gaussian", "sigma": 3.0},
        "job": JOB,
        "resources": {"cpus": 0.01},
    }


def write_probe(folder: Path, name: str, block: str) -> Path:
    path = folder / f"{name}.yaml"
    spec = probe_spec(name, block)
    path.write_text(
        f"name: {name}\ndataset: reviews\nblocks: [{block}]\nmechanism: {{kind: gaussian, sigma: 3.0}}\n"
        f"job: {{function: '{JOB['function']}'}}\nresources: {{cpus: {spec['resources']['cpus']}}}\n"
    )
    return path


def cli(env: dict, *args: object) -> str:
    done = subprocess.run([sys.executable, "-m", "privsched", *map(str, args)], env=env, capture_output=True, text=True, check=True)
    return done.stdout


def rate_cli(env: dict, folder: Path, count: int) -> float:
    path = write_probe(folder, "rate-cli", "block-00000")
    started = time.perf_counter()
    for _ in range(count):
        cli(env, "submit", path)
    return count / (time.perf_counter() - started)


def rate_api(client: Client, count: int) -> float:
    spec = probe_spec("rate-api", "block-00000")
    started = time.perf_counter()
    for _ in range(count):
        client.submit(spec)
    return count / (time.perf_counter() - started)


def wait_granted(client: Client, pipeline_id: int) -> float:
    """The time the client first sees the probe granted (the ledger's ``granted_at`` is the
    start of the scheduler's tick, before the pass and its commit)."""
    give_up = time.monotonic() + 60
    while (info := client.status(pipeline_id)).granted_at is None:
        if info.state not in ("pending", "granted", "running") or time.monotonic() > give_up:
            raise RuntimeError(f"probe {pipeline_id} not granted: {info.state} {info.message or ''}")
        time.sleep(0.002)
    return time.time()


def wait_ended(client: Client, pipeline_id: int) -> None:
    """Wait until the probe's job has ended and been settled, and half a second more (the
    scheduler's tick after the settling is over, as far as it can tell)."""
    while client.status(pipeline_id).state in ("granted", "running"):
        time.sleep(0.01)
    time.sleep(0.5)


def free_blocks(client: Client, prefix: str, count: int) -> list[str]:
    keys = [f"{prefix}-{i:04d}" for i in range(count)]
    client.ledger.add_blocks("reviews", [BlockSpec(k) for k in keys], unlocked_fraction=1.0)
    return keys


def cli_latencies(client: Client, env: dict, folder: Path, probes: int) -> list[float]:
    """Submit-to-grant seconds of probes submitted through the CLI, one process each."""
    found = []
    for i, key in enumerate(free_blocks(client, "free-cli", probes)):
        started = time.time()
        pipeline_id = int(cli(env, "submit", write_probe(folder, f"probe-cli-{i}", key)))
        found.append(wait_granted(client, pipeline_id) - started)
        wait_ended(client, pipeline_id)
    return found


def api_latencies(client: Client, keys: list[str]) -> list[float]:
    """Submit-to-grant seconds of probes submitted through the Python API."""
    found = []
    for key in keys:
        started = time.time()
        run = client.submit(probe_spec(f"probe-{key}", key))
        found.append(wait_granted(client, run.id) - started)
        wait_ended(client, run.id)
    return found


@contextmanager
def serving(client: Client, env: dict, source: Path) -> Iterator[None]:
    """``privsched serve`` (dpf-n, n = 10^9, 1 s ticks) of the code in ``source`` on the database."""
    warm_up = free_blocks(client, f"warm-up-{time.time_ns()}", 1)  # added before it starts: not while it recovers
    server = subprocess.Popen(
        [sys.executable, "-m", "privsched", "serve", "--policy", "dpf-n", "--n", "1000000000", "--tick", "1s", "-q"],
        env={**env, "PYTHONPATH": str(source)},
        cwd=source,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,  # in ``source``: ``python -m`` looks in the working directory first
    )
    ok = False
    try:
        while client.ledger.lease_holder() is None:
            if server.poll() is not None:
                raise RuntimeError(f"the scheduler did not start: {server.stderr.read()}")
            time.sleep(0.05)
        api_latencies(client, warm_up)  # its first pass sees the backlog
        yield
        ok = True
    finally:
        server.terminate()
        _, errors = server.communicate()
        if not ok:
            print(f"the scheduler of {source} said: {errors}", file=sys.stderr)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile of ``values`` in milliseconds (nearest rank)."""
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_probe(client: Client, mode: str, i: int) -> float:
    """Seconds from one probe's grant to its job's first line, the scheduler confining jobs
    with ``mode``."""
    job = {"function": "tests.sandbox_jobs:records_start", "pythonpath": [str(REPO)]}
    run = client.submit(
        {"name": f"start-{i}", "dataset": "reviews", "blocks": ["b0"], "epsilon": 0.01, "job": job, "resources": {"cpus": 0.01}}
    )
    client.run_until_idle("fcfs", tick=0.01, cpus=1, gpus=0, sandbox=mode)
    info = client.status(run.id)
    return float((client.runs.workdir(run.id) / "started").read_text()) - info.granted_at


def confinement(probes: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="privsched-bench-"))
    np.savez(folder / "b0.npz", rating=np.arange(10.0))
    clients: dict[str, Client] = {}
    for mode in ("none", "landlock"):
        clients[mode] = connect(folder / f"start-{mode}.db")
        clients[mode].create_dataset("reviews", epsilon=10, delta=1e-7, accounting="basic")
        clients[mode].add_blocks("reviews", [("b0", str(folder / "b0.npz"))])
    by_mode: dict[str, list[float]] = {mode: [] for mode in clients}
    for i in range(probes):  # alternate, so that the machine's load weighs on both alike
        for mode, client in clients.items():
            by_mode[mode].append(start_probe(client, mode, i))
    base = statistics.median(by_mode["none"])
    print(f"\ngrant → first line of the job, {probes} probes per mode (local executor)\n")
    print("| sandbox | median (ms) | max (ms) | ratio to none |")
    print("|---|---|---|---|")
    for mode, values in by_mode.items():
        print(f"| {mode} | {1000 * statistics.median(values):.0f} | {1000 * max(values):.0f} | {statistics.median(values) / base:.2f} |")
    for client in clients.values():
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--cli-submissions", type=int, default=20)
    parser.add_argument("--api-submissions", type=int, default=200)
    parser.add_argument("--probes", type=int, default=50, help="Python API probes per scheduler and round")
    parser.add_argument("--cli-probes", type=int, default=10, help="CLI probes (with --confinement: probes per mode)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="a copy of other privsched code to compare the scheduler with")
    parser.add_argument("--quick", action="store_true", help="a small run (100 blocks, 1,000 pending)")
    parser.add_argument("--confinement", action="store_true", help="measure only the sandbox's cost on job start")
    args = parser.parse_args()
    if args.confinement:
        confinement(args.cli_probes)
        return
    if args.quick:
        args.blocks, args.pending, args.cli_submissions, args.api_submissions = 100, 1000, 5, 50
        args.probes, args.cli_probes, args.rounds = 5, 3, 1

    folder = Path(tempfile.mkdtemp(prefix="privsched-bench-"))
    db = folder / "bench.db"
    env = {**os.environ, "PRIVSCHED_DB": str(db), "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    client = build(db, args.blocks, args.pending)
    print(
        f"backlog: {args.pending:,} pending pipelines on {args.blocks:,} blocks (built in {time.perf_counter() - started:.1f} s)",
        file=sys.stderr,
    )
    client.runs.record_pool(client.pool())
    cli_rate = rate_cli(env, folder, args.cli_submissions)
    api_rate = rate_api(client, args.api_submissions)

    sources = {"this code": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    by_api: dict[str, list[float]] = {name: [] for name in sources}
    with serving(client, env, REPO):
        by_cli = cli_latencies(client, env, folder, args.cli_probes)
    for round_ in range(args.rounds):  # in turns, so that the machine's load weighs on both alike
        for name, source in sources.items():
            with serving(client, env, source):
                by_api[name] += api_latencies(client, free_blocks(client, f"free-{round_}-{name[:4]}", args.probes))

    def ms(values: list[float]) -> str:
        return f"{percentile(values, 0.5):.0f} / {1000 * max(values):.0f}"

    print(f"\n{args.pending:,} pending pipelines, {args.blocks:,} blocks, RDP (12 orders)\n")
    print("| measure | CLI | Python API | CLI/API |")
    print("|---|---|---|---|")
    print(f"| submissions per second | {cli_rate:.2f} | {api_rate:.1f} | {cli_rate / api_rate:.3f} |")
    mine = by_api["this code"]
    print(f"| submit → grant, median / max (ms) | {ms(by_cli)} | {ms(mine)} | {statistics.median(by_cli) / statistics.median(mine):.2f} |")
    print(f"\nsubmit → grant through the Python API, {len(mine)} probes per scheduler\n")
    print("| scheduler | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | p50 ratio to this code |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in by_api.items():
        print(
            f"| {name} | {percentile(values, 0.5):.1f} | {percentile(values, 0.9):.1f} | "
            f"{percentile(values, 0.99):.1f} | {1000 * max(values):.1f} | "
            f"{percentile(values, 0.5) / percentile(mine, 0.5):.2f} |"
        )
    client.close()


if __name__ == "__main__":
    main()

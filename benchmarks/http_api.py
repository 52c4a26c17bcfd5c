"""The HTTP API against the local Python API: submissions per second and submit → grant
latency with 8 concurrent clients, and the whole-process time of one ``privsched submit``.

The database holds a backlog of ``--pending`` pipelines (default 10,000) over ``--blocks``
blocks (default 1,000) of one RDP dataset, (ε_G, δ_G) = (10, 1e-7), each a Gaussian
mechanism (σ ∈ [1, 10]) on 1–10 consecutive blocks, all pending (nothing is unlocked). One
process runs the scheduler and the API, as deployed: ``privsched serve --listen ...
--policy dpf-n --n 1e9 --tick 1s``. In the same run, against that same process:

- submissions per second: 8 threads, each with its own client, submit pipelines that stay
  pending (remote clients over keep-alive HTTP; local clients, one SQLite connection each);
- submit → grant: 8 threads each submit probes that fit a free block of their own, one at
  a time, and wait for the grant; latency = when the client sees the grant − the time
  before the submit call. Clients see it by polling the status every 2 ms (both APIs,
  both servers) or, through the HTTP API (both servers), by waiting at the server for the change
  of state (``RemoteClient.wait_for_change``: a long poll, woken by the scheduler's pass);
- one ``privsched submit`` of a DP-SGD pipeline, whole process: through ``--server`` (the
  server plans the demand) and locally (the command plans it: torch and opacus load).

Each server is measured as it runs, not as it starts: before any measure, one job runs
through it and the benchmark waits until it starts jobs warm (:func:`warm_up`).

With ``--baseline DIR`` (a copy of other privsched code), the rates, latencies and the
remote command are measured against that code's server (and client) too, in the same run,
in ``--rounds`` that alternate the two servers so that both see the same load of the
machine: rates are the median over rounds, latencies pool every probe.

With ``--waiting-only``, only the probes waiting at the server are measured (every round,
against each server), with where their latency goes and the server's CPU per probe.

Run from the repository root: ``.venv/bin/python benchmarks/http_api.py [--quick] [--baseline DIR] [--waiting-only]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service import build, probe_spec  # noqa: E402 -- benchmarks/service.py, beside this script
from privsched.ledger import BlockSpec  # noqa: E402
from privsched import connect  # noqa: E402
from privsched.client import Client  # noqa: E402
from privsched.ledger.identities import Identities  # noqa: E402
from privsched.remote import RemoteClient  # noqa: E402

THREADS = 8
DPSGD = (
    "name: dpsgd\ndataset: reviews\nblocks: [block-00000]\nepsilon: 1.0\ndelta: 1.0e-9\n"
    "job: {kind: dpsgd, params: {model: mlp, sample_rate: 0.05, epochs: 2, lr: 0.05, optimizer: adam}}\n"
    "resources: {cpus: 0.01}\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def in_threads(work: Callable[[int], None]) -> float:
    """Seconds for THREADS threads to each run ``work(thread index)``."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def rate(make_client: Callable[[], object], count: int) -> float:
    """Submissions per second of THREADS clients submitting ``count`` pending pipelines."""
    clients = [make_client() for _ in range(THREADS)]
    spec = probe_spec("rate", "block-00000")

    def work(i: int) -> None:
        for _ in range(count // THREADS):
            clients[i].submit(spec)

    return (count // THREADS * THREADS) / in_threads(work)


@dataclass
class Probe:
    """One probe's clock readings (seconds since the epoch): before its submit call, when the
    call returned, when the client saw the grant; and the ledger's submission and grant times."""

    started: float
    submitted: float
    seen: float
    submitted_at: float = 0.0
    granted_at: float = 0.0

    @property
    def latency(self) -> float:
        return self.seen - self.started


def latencies(make_client: Callable[[], object], keys: list[str], probes: int, waiting: bool = False) -> list[Probe]:
    """Submit → grant of probes, THREADS clients each submitting one at a time and polling
    every 2 ms (or, ``waiting``, waiting at the server for the change of state)."""
    clients = [make_client() for _ in range(THREADS)]
    found: list[Probe] = []

    def work(i: int) -> None:
        client = clients[i]
        for n in range(probes):
            started = time.time()
            run = client.submit(probe_spec(f"probe-{i}-{n}", keys[i * probes + n]))
            submitted = time.time()
            if waiting:
                while (info := client.wait_for_change(run.id, "pending")).granted_at is None:
                    pass
            else:
                while (info := client.status(run.id)).granted_at is None:
                    time.sleep(0.002)
            found.append(Probe(started, submitted, time.time(), info.submitted_at, info.granted_at))

    in_threads(work)
    return found


def command_seconds(env: dict, path: Path, repeats: int, cwd: Path = REPO) -> tuple[float, float]:
    """Median whole-process wall and CPU (user + system) seconds of ``privsched submit path``."""
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "privsched", "submit", str(path)],
            env={**env, "PYTHONPATH": str(cwd)},
            cwd=cwd,
            check=True,
            capture_output=True,
        )  # in ``cwd``: ``-m`` looks there first
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--submissions", type=int, default=800, help="per API, in all threads")
    parser.add_argument("--probes", type=int, default=5, help="per thread and API")
    parser.add_argument("--repeats", type=int, default=5, help="whole-process submits per way")
    parser.add_argument("--rounds", type=int, default=2, help="rounds alternating this code's server and the baseline's")
    parser.add_argument("--quick", action="store_true", help="a small run (100 blocks, 1,000 pending)")
    parser.add_argument(
        "--waiting-only",
        action="store_true",
        help="measure only the probes waiting at the server (and the server's CPU per probe), in every round",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a copy of other privsched code (e.g. `git archive main | tar -x -C DIR`) whose server is measured too, after this code's",
    )
    args = parser.parse_args()
    if args.quick:
        args.blocks, args.pending, args.submissions, args.probes, args.repeats = 100, 1000, 160, 2, 2

    folder = Path(tempfile.mkdtemp(prefix="privsched-http-bench-"))
    db = folder / "bench.db"
    started = time.perf_counter()
    local = build(db, args.blocks, args.pending)
    local.runs.record_pool(local.pool())
    with Identities(db) as identities:
        token = identities.add_user("bench", "submitter")
    print(f"backlog: {args.pending:,} pending on {args.blocks:,} blocks ({time.perf_counter() - started:.1f} s)", file=sys.stderr)

    env = {**os.environ, "PRIVSCHED_DB": str(db), "PYTHONPATH": str(REPO)}
    spec = folder / "dpsgd.yaml"
    spec.write_text(DPSGD)
    sources = {"this code": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    rounds: dict[str, list[Measures]] = {name: [] for name in sources}
    remote_cmds: dict[str, tuple[float, float]] = {}
    if args.waiting_only:
        waiting_only(env, sources, local, token, db, args.probes, args.rounds)
        local.close()
        return
    for turn in range(args.rounds):
        for name, source in in_turn(sources, turn):
            keys = [f"free-{name[:4]}-{turn}-{i:04d}" for i in range(3 * THREADS * args.probes)]
            local.ledger.add_blocks("reviews", [BlockSpec(k) for k in keys], unlocked_fraction=1.0)
            with api_server(env, source, local) as (url, pid):
                rounds[name].append(measure(url, pid, token, db, keys, args.submissions, args.probes))
                if turn == 0:
                    remote_cmds[name] = command_seconds(
                        {**env, "PRIVSCHED_SERVER": url, "PRIVSCHED_TOKEN": token}, spec, args.repeats, source
                    )
                    if name == "this code":
                        local_cmd = command_seconds(env, spec, args.repeats)
    found = {name: Measures.pooled(found) for name, found in rounds.items()}

    mine, remote_cmd = found["this code"], remote_cmds["this code"]
    print(f"\n{args.pending:,} pending pipelines, {args.blocks:,} blocks, RDP (12 orders), {THREADS} concurrent clients\n")
    print("| measure | HTTP API | local Python API | HTTP/local |")
    print("|---|---:|---:|---:|")
    print(f"| submissions per second | {mine.remote_rate:.0f} | {mine.local_rate:.0f} | {mine.remote_rate / mine.local_rate:.2f} |")
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        print(
            f"| submit → grant {label} (ms) | {pct(mine.remote_latency, q):.0f} | {pct(mine.local_latency, q):.0f} | "
            f"{pct(mine.remote_latency, q) / pct(mine.local_latency, q):.2f} |"
        )
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        print(
            f"| submit → grant {label} (ms), HTTP waiting at the server, local polling | {pct(mine.wait_latency, q):.0f} | "
            f"{pct(mine.local_latency, q):.0f} | {pct(mine.wait_latency, q) / pct(mine.local_latency, q):.2f} |"
        )
    for i, clock in enumerate(("wall", "CPU")):
        print(
            f"| `privsched submit` of a DP-SGD pipeline, whole process, {clock} (s) | {remote_cmd[i]:.2f} | "
            f"{local_cmd[i]:.2f} | {remote_cmd[i] / local_cmd[i]:.2f} |"
        )
    if "baseline" in found:
        base = found["baseline"]
        print("\n| measure | this code | baseline | this code/baseline |")
        print("|---|---:|---:|---:|")
        for label, ours, theirs in (
            ("HTTP submissions per second", mine.remote_rate, base.remote_rate),
            ("local submissions per second", mine.local_rate, base.local_rate),
        ):
            print(f"| {label} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} |")
        print(
            f"| server CPU per HTTP submission (ms, scheduler included) | {1000 * mine.server_cpu:.2f} | "
            f"{1000 * base.server_cpu:.2f} | {mine.server_cpu / base.server_cpu:.2f} |"
        )
        for way in ("remote", "local"):
            for label, q in (("p50", 0.5), ("p99", 0.99)):
                ours, theirs = (pct(getattr(m, f"{way}_latency"), q) for m in (mine, base))
                print(
                    f"| {'HTTP' if way == 'remote' else 'local'} submit → grant {label} (ms) | {ours:.0f} | "
                    f"{theirs:.0f} | {ours / theirs:.2f} |"
                )
        for label, q in (("p50", 0.5), ("p99", 0.99)):
            ours, theirs = pct(mine.wait_latency, q), pct(base.wait_latency, q)
            label = f"HTTP submit → grant {label} (ms), waiting at the server"
            print(f"| {label} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} |")
        for i, clock in enumerate(("wall", "CPU")):
            ours, theirs = remote_cmd[i], remote_cmds["baseline"][i]
            print(f"| remote DP-SGD `privsched submit`, whole process, {clock} (s) | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f} |")
    print("\n| waiting probes: where submit → grant goes | " + " | ".join(f"{name} p50 / p90 (ms)" for name in found) + " |")
    print("|---|" + "---:|" * len(found))
    for label, part in SPLIT:
        parts = [[part(p) for p in m.wait_probes] for m in found.values()]
        print(f"| {label} | " + " | ".join(f"{pct(x, 0.5):.0f} / {pct(x, 0.9):.0f}" for x in parts) + " |")
    local.close()


#: The parts of a waiting probe's latency: the submit call; the ledger's submission time to
#: the clock of the pass that granted it (the scheduler noticing the submission, and waiting
#: behind what it was doing); that clock to the client seeing the grant (the pass itself,
#: the grant's commit, the waiting request's wake-up and answer).
SPLIT: tuple[tuple[str, Callable[[Probe], float]], ...] = (
    ("the submit call", lambda p: p.submitted - p.started),
    ("submitted → the granting pass's clock (ledger times)", lambda p: p.granted_at - p.submitted_at),
    ("the granting pass's clock → the client sees the grant", lambda p: p.seen - p.granted_at),
    ("submit → grant seen", lambda p: p.latency),
)


@dataclass
class Measures:
    remote_rate: float  # submissions per second through the HTTP API
    local_rate: float  # through the local Python API
    remote_latency: list[float]  # submit → grant seconds, polling
    local_latency: list[float]
    wait_latency: list[float]  # through the HTTP API, waiting at the server
    wait_probes: list[Probe]  # the waiting probes' clock readings
    server_cpu: float  # the server's CPU seconds per remote submission (scheduler included)

    @classmethod
    def pooled(cls, rounds: list[Measures]) -> Measures:
        """Rounds as one: median rates, every probe's latency."""
        return cls(
            statistics.median(m.remote_rate for m in rounds),
            statistics.median(m.local_rate for m in rounds),
            [x for m in rounds for x in m.remote_latency],
            [x for m in rounds for x in m.local_latency],
            [x for m in rounds for x in m.wait_latency],
            [x for m in rounds for x in m.wait_probes],
            statistics.median(m.server_cpu for m in rounds),
        )


def measure(url: str, pid: int, token: str, db: Path, keys: list[str], submissions: int, probes: int) -> Measures:
    """Rates and latencies, remote (polling, and waiting at the server) and local, against
    the server at ``url`` (process ``pid``)."""
    before = cpu_seconds(pid)
    remote_rate = rate(lambda: RemoteClient(url, token), submissions)
    server_cpu = (cpu_seconds(pid) - before) / (submissions // THREADS * THREADS)
    local_rate = rate(lambda: connect(db), submissions)
    n = THREADS * probes
    remote_latency = quiet_after(db, latencies(lambda: RemoteClient(url, token), keys[:n], probes))
    local_latency = quiet_after(db, latencies(lambda: connect(db), keys[n : 2 * n], probes))
    waiting = quiet_after(db, latencies(lambda: RemoteClient(url, token), keys[2 * n :], probes, waiting=True))
    return Measures(
        remote_rate,
        local_rate,
        [p.latency for p in remote_latency],
        [p.latency for p in local_latency],
        [p.latency for p in waiting],
        waiting,
        server_cpu,
    )


def in_turn(sources: dict[str, Path], turn: int) -> list[tuple[str, Path]]:
    """The servers of round ``turn`` in the order they run: reversed every other round, so
    that neither is always the first (the first server of a round measured about 10 %
    slower than the second in a run of one code against itself)."""
    order = list(sources.items())
    return order[::-1] if turn % 2 else order


def waiting_only(env: dict, sources: dict[str, Path], local: Client, token: str, db: Path, probes: int, rounds: int) -> None:
    """Only the probes waiting at the server, against each server in alternating rounds:
    submit → grant p50 / p90 / p99, its split (:data:`SPLIT`), and the server's CPU per probe
    (its submission, pass, grant, job start and settlement; not the jobs)."""
    found: dict[str, list[Probe]] = {name: [] for name in sources}
    cpu: dict[str, list[float]] = {name: [] for name in sources}
    medians: dict[str, list[float]] = {name: [] for name in sources}  # each round's p50
    for turn in range(rounds):
        for name, source in in_turn(sources, turn):
            keys = [f"wait-{name[:4]}-{turn}-{i:04d}" for i in range(THREADS * probes)]
            local.ledger.add_blocks("reviews", [BlockSpec(k) for k in keys], unlocked_fraction=1.0)
            with api_server(env, source, local) as (url, pid):
                before = cpu_seconds(pid)
                probed = quiet_after(db, latencies(lambda: RemoteClient(url, token), keys, probes, waiting=True))
                cpu[name].append((cpu_seconds(pid) - before) / len(keys))
                found[name] += probed
                medians[name].append(pct([p.latency for p in probed], 0.5))
    print(f"\nload average {os.getloadavg()[0]:.1f} (1 min), {rounds} rounds, {THREADS} clients × {probes} probes a round\n")
    print("| waiting probes | " + " | ".join(f"{name} p50 / p90 / p99 (ms)" for name in found) + " |")
    print("|---|" + "---:|" * len(found))
    for label, part in SPLIT:
        parts = [[part(p) for p in probes_] for probes_ in found.values()]
        print(f"| {label} | " + " | ".join(f"{pct(x, 0.5):.0f} / {pct(x, 0.9):.0f} / {pct(x, 0.99):.0f}" for x in parts) + " |")
    per_probe = [f"{1000 * statistics.median(c):.2f}" for c in cpu.values()]
    print("| server CPU per probe (ms, median of rounds) | " + " | ".join(per_probe) + " |")
    rounds_ = "; ".join(f"{name}: {', '.join(f'{m:.0f}' for m in ms)}" for name, ms in medians.items())
    print(f"\nsubmit → grant p50 of each round (ms): {rounds_}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (not its children: the jobs)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quiet_after(db: Path, found: list[Probe]) -> list[Probe]:
    """``found``, once every granted probe's job has ended: the next measure does not share
    the machine with the jobs of this one."""
    with connect(db) as client:
        while client.list(states=["granted", "running"]):
            time.sleep(0.05)
    return found


@contextmanager
def api_server(env: dict, source: Path, local: Client) -> Iterator[tuple[str, int]]:
    """``privsched serve --listen`` (the scheduler and the API in one process) of the code
    in ``source``; yields its address and process id."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "privsched",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--policy",
            "dpf-n",
            "--n",
            "1000000000",
            "--tick",
            "1s",
        ],
        env={**env, "PYTHONPATH": str(source)},
        cwd=source,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # in ``source``: ``-m`` looks there first
    try:
        line = server.stdout.readline()
        if "HTTP API on" not in line:
            raise RuntimeError(f"the server did not start: {line}{server.stdout.read()}")
        while local.ledger.lease_holder() is None:
            time.sleep(0.05)
        warm_up(local)
        yield f"http://127.0.0.1:{port}", server.pid
    finally:
        server.terminate()
        server.wait()


#: Seconds a server that does not say how it starts jobs is given to warm its fork server up
#: after its first job (importing torch and Opacus there takes 3–4 s on this machine).
WARM_UP_SECONDS = 8.0


def warm_up(local: Client) -> None:
    """Measure a server as it runs, not as it starts: run one job through it (a server
    whose fork server starts with its first job starts it then), then wait until it says
    that jobs start warm (``/v1/scheduler``'s ``job_starts``, from the runs folder), or
    :data:`WARM_UP_SECONDS` where it does not say."""
    key = f"warm-up-{time.monotonic_ns()}"
    local.ledger.add_blocks("reviews", [BlockSpec(key)], unlocked_fraction=1.0)
    run = local.submit(probe_spec(key, key))
    while local.status(run.id).state in ("pending", "granted", "running"):
        time.sleep(0.02)
    deadline = time.monotonic() + 60
    while (starts := local.scheduler_job_starts()) != "warm":
        if starts is None:
            time.sleep(WARM_UP_SECONDS)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server's jobs still start {starts}")
        time.sleep(0.05)


def pct(values: list[float], q: float) -> float:
    """The q-quantile of ``values`` in milliseconds (nearest rank)."""
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


if __name__ == "__main__":
    main()

"""A throwaway one-machine Ray cluster, to try the Ray executor, test it and benchmark it.

:func:`local_cluster` runs ``ray start --head`` with declared resources (GPUs may be fake:
Ray then hands out their ids without any device behind them), in its own temporary folder
and on free ports, so it never meets another cluster of the machine. It yields the dashboard
address the executor takes. With a ``token`` the cluster runs Ray's token authentication
(``RAY_AUTH_MODE=token``, the token in ``RAY_AUTH_TOKEN`` of its processes); ``nodes`` adds
worker nodes on the same machine. On exit it ends the processes of that cluster only (the
process group of each ``ray start``; job commands die with their supervisors) and removes its folder. Its jobs
start this interpreter as ``python``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(pgid: int, grace: float = 1.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if _group_alive(pgid):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)


def _start(command: list[str], env: dict[str, str]) -> int:
    """Run ``ray start`` in a process group of its own (its daemons stay in it); the group's
    id. ``RuntimeError`` if it fails (the group is stopped)."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output, _ = process.communicate()
    if process.returncode != 0:
        _stop_group(process.pid)
        raise RuntimeError(f"ray start failed: {output.strip().splitlines()[-1:]}")
    return process.pid


@contextmanager
def local_cluster(
    cpus: float = 2, gpus: int = 0, memory: int = 4 * 10**9, token: str | None = None, nodes: tuple[float, ...] = ()
) -> Iterator[str]:
    """A Ray head on this machine with ``cpus`` CPUs, ``gpus`` GPUs and ``memory`` bytes of
    task memory, requiring ``token`` when given, and one more node per entry of ``nodes``
    (its CPUs, with ``memory`` each: several nodes on one machine, as a cluster of several
    hosts looks to Ray); yields its dashboard address (``http://127.0.0.1:PORT``).
    ``RuntimeError`` if it does not start."""
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must stay short
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "RAY_USAGE_STATS_ENABLED": "0"}
    if token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    dashboard, gcs = free_port(), free_port()
    command = [
        str(Path(bin_dir, "ray")),
        "start",
        "--head",
        "--num-cpus",
        f"{cpus:g}",
        "--num-gpus",
        str(gpus),
        "--memory",
        str(memory),
        "--object-store-memory",
        str(100 * 10**6),
        "--temp-dir",
        folder,
        "--port",
        str(gcs),
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dashboard),
        "--include-dashboard",
        "true",
        "--ray-client-server-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
        "--disable-usage-stats",
    ]
    groups: list[int] = []
    try:
        groups.append(_start(command, env))
        head_ip = next(arg.split("=", 1)[1] for arg in _group_commands(groups[0]) if arg.startswith("--node-ip-address="))
        for node_cpus in nodes:
            worker = [command[0], "start", "--address", f"{head_ip}:{gcs}", "--num-cpus", f"{node_cpus:g}", "--num-gpus", "0"]
            worker += ["--memory", str(memory), "--object-store-memory", str(100 * 10**6), "--disable-usage-stats"]
            groups.append(_start(worker, env))
        yield f"http://127.0.0.1:{dashboard}"
    finally:
        for group in reversed(groups):
            _stop_group(group)
        shutil.rmtree(folder, ignore_errors=True)


def _group_commands(pgid: int) -> list[str]:
    """The command-line arguments of every process in process group ``pgid``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                found += (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
    return found

"""Hostile and accounted user jobs the sandbox tests submit as ``tests.sandbox_jobs:<name>``.

This module holds no tests: job processes import it, so it stays light (no torch).
Each job reads its target from ``ctx.params``.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from privsched.jobs.context import JobContext
from privsched.jobs.primitives import PrimitiveRefused


def reads_file(ctx: JobContext) -> None:
    """Opens a path it was not granted (another block's data, the ledger database)."""
    with open(ctx.params["path"], "rb") as stream:
        stream.read(1)


def writes_file(ctx: JobContext) -> None:
    """Writes (creating or replacing) a file outside its work folder."""
    Path(ctx.params["path"]).write_text("tampered\n")


def deletes_file(ctx: JobContext) -> None:
    os.remove(ctx.params["path"])


def connects(ctx: JobContext) -> None:
    """Opens a TCP connection to a port on this machine."""
    socket.create_connection(("127.0.0.1", int(ctx.params["port"])), timeout=5).close()


def reads_then_reports_zero(ctx: JobContext) -> None:
    """Reads every granted block itself, then claims it spent nothing."""
    for key in ctx.block_keys:
        ctx.open_block(key).read()
    ctx.report_spent(ctx.budget * 0)


def counts_then_stops(ctx: JobContext) -> None:
    """Spends ``params['epsilon']`` through one DP count, tries one count beyond its grant
    (refused), and stops early; it reports zero, which is not believed either way."""
    value = ctx.dp_count(float(ctx.params["epsilon"]))
    try:
        ctx.dp_count(float(ctx.params["too_much"]))
        refused = False
    except PrimitiveRefused:
        refused = True
    ctx.report_metrics(count=value, refused=refused)
    ctx.report_spent(ctx.budget * 0)


def leaves_a_daemon(ctx: JobContext) -> None:
    """Double-forks a ``setsid`` grandchild that keeps running, writes its pid (and its PID
    namespace, where a confined job's pids mean nothing outside), and returns
    (or, with ``params['hang']``, keeps running too)."""
    pid_file = Path(ctx.workdir, "daemon.pid")
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            Path(ctx.workdir, "daemon.ns").write_text(os.readlink("/proc/self/ns/pid"))
            Path(f"{pid_file}.tmp").write_text(str(os.getpid()))
            os.replace(f"{pid_file}.tmp", pid_file)
            while True:
                time.sleep(0.1)
        os._exit(0)
    while not pid_file.exists():
        time.sleep(0.01)
    while ctx.params.get("hang"):
        time.sleep(0.1)


def records_start(ctx: JobContext) -> None:
    """Writes the time its code started running (``started``, seconds since the epoch)."""
    Path(ctx.workdir, "started").write_text(repr(time.time()))


def probes(ctx: JobContext) -> None:
    """Tries what a hostile job tries (a packet socket on the loopback, a device node, the
    kernel log, every process's environment) and reports each outcome, its own environment
    (printed as well), uid, capabilities and the processes it sees."""
    import errno
    import socket as sockets
    import stat

    def attempt(action) -> str:
        try:
            action()
            return "allowed"
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc))

    def packet_socket() -> None:
        sockets.socket(sockets.AF_PACKET, sockets.SOCK_RAW, sockets.htons(0x0003)).close()  # ETH_P_ALL

    def device_node() -> None:
        os.mknod(Path(ctx.workdir, "kmsg"), 0o600 | stat.S_IFCHR, os.makedev(1, 11))

    environs = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environs[entry.name] = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
    status = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":\t" in line)
    print("environment:", sorted(os.environ.items()))
    ctx.report_metrics(
        fifo=attempt(lambda: os.mkfifo(Path(ctx.workdir, "fifo"))),
        unix_socket=attempt(lambda: sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM).close()),
        packet_socket=attempt(packet_socket),
        device_node=attempt(device_node),
        kernel_log=attempt(lambda: open("/dev/kmsg", "rb").close()),
        environment=dict(os.environ),
        environs=environs,
        processes=sorted(int(p.name) for p in Path("/proc").glob("[0-9]*")),
        uid=os.getuid(),
        capabilities=status["CapEff"].strip(),
        no_new_privs=status["NoNewPrivs"].strip(),
        seccomp=status["Seccomp"].strip(),
    )


def waits(ctx: JobContext) -> None:
    """Opens its first block when ``params['read']``, writes ``started``, then waits to be
    stopped."""
    if ctx.params.get("read"):
        ctx.open_block(ctx.block_keys[0]).read(1)
    Path(ctx.workdir, "started").write_text("ok")
    while True:
        time.sleep(0.1)


def probes_its_blocks(ctx: JobContext) -> None:
    """Tries to ``stat`` and open each path of ``params['files']`` and to ``stat`` and list
    each folder of ``params['folders']`` itself; reports which it could (and which it could
    ``stat``), and what its context says of where its blocks are; then reads one granted block
    through the supervisor."""
    reached, seen = [], []
    for path in [*ctx.params["files"], *ctx.params["folders"]]:
        try:
            os.stat(path)
            seen.append(path)
        except OSError:
            pass
    for path in ctx.params["files"]:
        try:
            open(path, "rb").close()
            reached.append(path)
        except OSError:
            pass
    for folder in ctx.params["folders"]:
        try:
            os.listdir(folder)
            reached.append(folder)
        except OSError:
            pass
    with ctx.open_block(ctx.block_keys[0]) as stream:
        size = len(stream.read())
    ctx.report_metrics(reached=reached, seen=seen, locations=[b.location for b in ctx.blocks.values()], brokered_bytes=size)


def reads_block_files(ctx: JobContext) -> None:
    """Reads each file of its first block through the supervisor; reports their sizes by name."""
    files = ctx.block_files(ctx.block_keys[0])
    ctx.report_metrics(sizes={name: len(stream.read()) for name, stream in files.items()})


def reads_parquet(ctx: JobContext) -> None:
    """Reads its first block, a Parquet file, from the supervisor's descriptor with pyarrow."""
    import pyarrow.parquet as pq

    with ctx.open_block(ctx.block_keys[0]) as stream:
        table = pq.read_table(stream)
    ctx.report_metrics(columns=table.column_names, rows=table.num_rows)


def counts_at_its_epsilon(ctx: JobContext) -> None:
    """Spends the ε its context gives (after an elastic grant: the largest its grant holds)
    through one DP count."""
    assert ctx.epsilon is not None
    ctx.report_metrics(count=ctx.dp_count(ctx.epsilon), epsilon=ctx.epsilon)

"""Putting a job's process in its own Linux namespaces, as an unprivileged uid.

:func:`isolate` runs in the job's freshly forked (single-threaded) process, before Landlock
(:mod:`privsched.jobs.sandbox`) and before any of the job's code. It leaves the job

- in its own **mount** namespace whose root is a fresh tmpfs holding only what the job's
  Landlock rules name (bind mounts at the same paths), a fresh ``/proc`` of its own PID
  namespace and a ``/dev`` of the device files it may use: block files, the ledger and
  other runs are not there to ``stat``;
- in its own **user** namespace as an unprivileged uid (``nobody``, 65534, when privsched
  runs as root; otherwise the operator's own uid) with every capability dropped;
- in its own **PID** namespace (it is its init: when it ends, the kernel kills every process
  left in it), **IPC** namespace and, unless it keeps TCP access, **network** namespace
  (only a loopback of its own, down; up for a data-parallel job, whose processes reach one
  another through it and nothing else: :func:`loopback_up`).

The kernel interfaces are ``unshare(2)``, ``user_namespaces(7)`` (``uid_map``,
``setgroups``), ``mount(2)`` with ``MS_BIND``, ``pivot_root(2)`` (``pivot_root(".", ".")``
then a lazy unmount of the old root, as its manual page describes), ``pid_namespaces(7)``
and ``capabilities(7)`` (``capset``, ``PR_CAPBSET_DROP``). Root sets the mount namespace up
while still privileged (so it can bind folders only root may traverse), then drops to the
job's uid and enters the other namespaces unprivileged; another user sets it up inside a
first user namespace of its own.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import platform
import signal
import socket
import struct
from functools import cache
from pathlib import Path

from privsched.jobs.sandbox import Confinement, SandboxError

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 1, 4, 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522
#: ``pivot_root`` has no C library wrapper: its number per architecture.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
#: The uid (and gid) a job runs as when privsched runs as root.
NOBODY = 65534
#: Top-level links of a merged-/usr system, recreated in the job's root so programs it starts find
#: their loader (``/lib64/ld-linux-x86-64.so.2``).
_ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result < 0:
        errno = ctypes.get_errno()
        raise SandboxError(errno, f"{what} failed: {os.strerror(errno)}")


def job_ids() -> tuple[int, int]:
    """The uid and gid a job runs as: ``nobody`` under root, else the operator's own (also
    under a root whose user namespace has no ``nobody`` to switch to)."""
    return (NOBODY, NOBODY) if os.geteuid() == 0 and _mapped(NOBODY) else (os.getuid(), os.getgid())


def _mapped(uid: int) -> bool:
    """Whether ``uid`` exists in this process's user namespace (user_namespaces(7))."""
    try:
        lines = Path("/proc/self/uid_map").read_text().splitlines()
    except OSError:
        return True
    return any(int(inside) <= uid < int(inside) + int(count) for inside, _, count in (line.split() for line in lines))


@cache
def available() -> str | None:
    """None where this process can put a job in its namespaces, else why not (one line).

    Tried for real in a throw-away child (the job's uid entering a user namespace): kernels
    and distributions disable unprivileged user namespaces in several ways."""
    if platform.machine() not in _SYS_PIVOT_ROOT:
        return f"no pivot_root system call known for {platform.machine()}"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            if job_ids()[0] != os.geteuid():
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
            _unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID)
            code = 0
        except BaseException as exc:  # the reason travels to the parent
            os.write(write, str(exc).encode()[:300])
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as stream:
        reason = stream.read().decode(errors="replace")
    status = os.waitpid(pid, 0)[1]
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return f"user namespaces are unavailable ({reason or 'the probe failed'})"


def _unshare(flags: int) -> None:
    _check(_libc().unshare(ctypes.c_int(flags)), "unshare")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    result = _libc().mount(encode(source), target.encode(), encode(fstype), ctypes.c_ulong(flags), encode(data))
    _check(result, f"mount({source or fstype} on {target})")


def _write(path: str, text: str) -> None:
    with open(path, "w") as stream:
        stream.write(text)


def _map_self(uid: int, gid: int) -> None:
    """Map ``uid`` and ``gid`` to themselves in the user namespace just entered (the one
    mapping an unprivileged process may write, user_namespaces(7))."""
    try:
        _write("/proc/self/setgroups", "deny")
    except OSError:
        pass  # already denied by a parent namespace
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def _beneath(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def view_paths(rules: Confinement) -> tuple[list[str], list[str]]:
    """The paths bound into the job's root (outermost only: what lies beneath a bound
    folder is already there) and the folders made there empty (listable folders: only
    what is bound beneath them shows)."""
    wanted = [*rules.read, *rules.write, *rules.devices]
    bound: list[str] = []
    for path in sorted({os.path.realpath(p) for p in wanted if os.path.exists(p)}, key=lambda p: Path(p).parts):
        if path != "/proc" and not _beneath(path, [b for b in bound if os.path.isdir(b)]):
            bound.append(path)
    empty = [os.path.realpath(p) for p in rules.listable if os.path.isdir(p)]
    return bound, [p for p in empty if not _beneath(p, [b for b in bound if os.path.isdir(b)])]


def _build_root(root: str, rules: Confinement, fresh_proc: bool) -> None:
    """A tmpfs at ``root`` holding bind mounts of what ``rules`` name, at their own paths."""
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    bound, empty = view_paths(rules)
    for path in bound:
        target = root + path
        if os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            Path(target).touch()
        _mount(path, target, None, _MS_BIND | _MS_REC)
    for path in empty:
        os.makedirs(root + path, exist_ok=True)
    for name in _ROOT_LINKS:
        if os.path.islink("/" + name) and not os.path.lexists(f"{root}/{name}"):
            os.symlink(os.readlink("/" + name), f"{root}/{name}")
    os.makedirs(f"{root}/dev", exist_ok=True)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        if not os.path.lexists(f"{root}/dev/{name}"):
            os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(f"{root}/proc", exist_ok=True)
    if fresh_proc:
        _mount("proc", f"{root}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    else:  # a user namespace without its own PID namespace may not mount a new proc: bind it
        _mount("/proc", f"{root}/proc", None, _MS_BIND | _MS_REC)


def _pivot(root: str) -> None:
    """Make ``root`` this mount namespace's root and drop the old one (pivot_root(2))."""
    os.chdir(root)
    _check(_libc().syscall(ctypes.c_long(_SYS_PIVOT_ROOT[platform.machine()]), b".", b"."), "pivot_root")
    _check(_libc().umount2(b".", ctypes.c_int(_MNT_DETACH)), "umount of the old root")
    os.chdir("/")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets (capabilities(7))."""
    libc = _libc()
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "prctl(CAPBSET_DROP)")
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(CAP_AMBIENT_CLEAR_ALL)")
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), data), "capset")


def isolate(rules: Confinement, root: Path, workdir: Path) -> None:
    """Move this process's job into its own namespaces (module docstring), with ``root`` (an
    empty folder) as the mount point of its new root. Returns in the job's process, PID 1 of
    its namespace, in ``workdir``; this process waits for it and exits with its status.
    Raises :class:`SandboxError` where a step fails."""
    uid, gid = job_ids()
    privileged = uid != os.geteuid()  # root, dropping to nobody
    supervisor = os.getppid()
    if privileged:
        for folder in rules.write:
            os.chown(folder, uid, gid)
        _unshare(CLONE_NEWNS)
    else:
        _unshare(CLONE_NEWUSER | CLONE_NEWNS)
        _map_self(uid, gid)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    root.mkdir(exist_ok=True)
    _build_root(str(root), rules, fresh_proc=privileged)
    _pivot(str(root))
    if privileged:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        _libc().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # a change of uid made /proc/self root's
    host_network = rules.network or rules.rendezvous_port is not None  # a rank across nodes reaches the others' hosts
    _unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | (0 if host_network else CLONE_NEWNET))
    _map_self(uid, gid)
    if rules.loopback and not rules.network:
        loopback_up()
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # a change of uid cleared it
    if os.getppid() != supervisor:  # the supervisor died meanwhile: nothing to report to
        os._exit(1)
    pid = os.fork()
    if pid != 0:
        _wait_and_exit(pid)
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # (an orphan before this goes to the subreaper)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    drop_capabilities()
    os.chdir(workdir)


def loopback_up() -> None:
    """Bring up the loopback of this process's own network namespace (``SIOCSIFFLAGS`` with
    ``IFF_UP``, netdevice(7)), as the owner of its user namespace may: the namespace has no
    other interface, so what listens there is reachable only from within it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(probe, _SIOCGIFFLAGS, request))[1]
        try:
            fcntl.ioctl(probe, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
        except OSError as exc:
            raise SandboxError(exc.errno, f"bringing the job's loopback up failed: {exc.strerror}") from None


def _wait_and_exit(pid: int) -> None:
    """The process between the supervisor and the job's namespace: holds none of the job's
    descriptors but its output, waits for it and ends as it did (killed by the same signal, or
    with the same exit code)."""
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code < 0:  # through the C library: Python's signal() is for its main thread, which this may not be
        _libc().signal(-code, ctypes.c_void_p(0))  # SIG_DFL
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)

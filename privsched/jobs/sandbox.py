"""Confining a job process with Linux Landlock (no root, no helper binaries).

A process calls :func:`confine` once, before it imports any of the job's code: from then
on it, and every process it starts, may only

- read (and execute) the folders and files of :attr:`Confinement.read`, and list (not
  open) the entries of :attr:`Confinement.listable`;
- read and write beneath :attr:`Confinement.write` (its run folder and a private tmp);
- bind or connect TCP sockets when :attr:`Confinement.network` allows it (ABI ≥ 4);
- reach abstract unix sockets and send signals inside its own sandbox (ABI ≥ 6).

The kernel interface is the three system calls of the Landlock ABI (Salaün, Landlock LSM,
``Documentation/userspace-api/landlock.rst``): ``landlock_create_ruleset`` with the access
rights the ruleset *handles* (everything not granted by a rule is denied),
``landlock_add_rule`` per path (``LANDLOCK_RULE_PATH_BENEATH``) or TCP port
(``LANDLOCK_RULE_NET_PORT``), and ``landlock_restrict_self`` after
``prctl(PR_SET_NO_NEW_PRIVS)``. Rights a kernel's ABI does not know are left out (best
effort, as the kernel documentation recommends), so the same code runs on every ABI from 1 to
the newest; :func:`abi_version` is 0 where Landlock is missing (an old kernel, another OS).
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: Sandbox modes: ``landlock`` (the default) or ``none`` (jobs run unconfined).
SANDBOX_MODES: tuple[str, ...] = ("landlock", "none")
#: Environment variable giving the sandbox mode when no option does.
SANDBOX_VARIABLE = "PRIVSCHED_SANDBOX"

# System call numbers: the same on every architecture (the generic table, since Linux 5.13).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem access rights (linux/landlock.h) and the ABI that introduced each.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
#: Rights that apply to a regular file (a rule on a file may hold only these).
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
WRITE = _FS_BY_ABI[5]  # every filesystem right

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6


class SandboxError(OSError):
    """The sandbox cannot be set up (Landlock missing, a rule the kernel refuses)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The Landlock ABI this kernel offers, 0 when it has none (or Landlock is disabled)."""
    libc = _libc()
    if libc is None:
        return 0
    version = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def sandbox_mode(option: str | None = None) -> str:
    """The sandbox mode: the option, else ``$PRIVSCHED_SANDBOX``, else ``landlock``; an
    unknown name raises ``ValueError`` with one line."""
    mode = option or os.environ.get(SANDBOX_VARIABLE) or "landlock"
    if mode not in SANDBOX_MODES:
        raise ValueError(f"unknown sandbox {mode!r} (expected one of {', '.join(SANDBOX_MODES)})")
    return mode


def require_sandbox(mode: str) -> None:
    """Refuse to run jobs confined where Landlock or user namespaces are missing
    (``SandboxError``, one line)."""
    if mode != "landlock":
        return
    from privsched.jobs.namespaces import available

    missing = "this kernel offers no Landlock sandbox" if abi_version() == 0 else available()
    if missing:
        raise SandboxError(f"{missing}: pass --sandbox none (or set {SANDBOX_VARIABLE}=none) to run jobs unconfined")


@dataclass(frozen=True)
class Confinement:
    """What a confined process may still reach."""

    read: tuple[str, ...]  # folders or files: read and execute beneath them
    write: tuple[str, ...]  # folders: every filesystem right beneath them
    listable: tuple[str, ...] = ()  # folders whose entries may be listed, not opened
    network: bool = False  # whether TCP bind and connect stay allowed
    #: Data-parallel jobs: the job's own network namespace gets its loopback up, and TCP is
    #: left to that namespace (it reaches the job's own processes only), for gloo's transport.
    loopback: bool = False
    #: A data-parallel rank on another host's reach (docs/sandbox.md, "Ranks across nodes"): the
    #: job keeps the host's network namespace; TCP connect stays allowed, TCP bind only on this
    #: port (the rendezvous privsched chose) and on port 0 (an ephemeral port, gloo's listeners).
    rendezvous_port: int | None = None
    devices: tuple[str, ...] = field(default_factory=lambda: DEVICES + gpu_devices())  # read, write, ioctl


#: Character devices every job may use.
DEVICES: tuple[str, ...] = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


def gpu_devices() -> tuple[str, ...]:
    """NVIDIA's device files (CUDA opens them and calls ioctl on them); which GPUs a job uses is set
    by ``CUDA_VISIBLE_DEVICES``, not by the sandbox."""
    return tuple(sorted(str(p) for p in Path("/dev").glob("nvidia*")))


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise SandboxError(errno, f"Landlock {what} failed: {os.strerror(errno)}")
    return result


def confine(rules: Confinement) -> int:
    """Restrict this process (and its future children) to ``rules``; returns the ABI used.

    Paths that do not exist are skipped (a rule needs an open file descriptor). Raises
    :class:`SandboxError` where Landlock is missing: callers decide whether to run unconfined.
    """
    abi = abi_version()
    if abi == 0:
        raise SandboxError("this kernel offers no Landlock sandbox")
    libc = _libc()
    assert libc is not None
    fs = _FS_BY_ABI[min(abi, 5)]
    attr = _RulesetAttr(fs, 0, 0)
    if abi >= 4 and rules.rendezvous_port is not None and not rules.network:
        attr.handled_access_net = NET_BIND_TCP
    elif abi >= 4 and not (rules.network or rules.loopback):
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = _check(
        libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)), "create_ruleset"
    )
    try:
        grants = [(p, READ) for p in rules.read] + [(p, WRITE) for p in rules.write]
        # The process's own /proc entry: CUDA's driver writes there when it initialises (seen on
        # an H100: cuInit fails with "OS call failed" without it); it reaches no other process.
        grants.append((f"/proc/{os.getpid()}", WRITE))
        grants += [(p, FS_READ_FILE | FS_WRITE_FILE | FS_IOCTL_DEV | FS_READ_DIR) for p in rules.devices]
        grants += [(p, FS_READ_DIR) for p in rules.listable]
        for path, access in grants:
            _add_path(libc, ruleset, path, access & fs)
        if attr.handled_access_net == NET_BIND_TCP:
            assert rules.rendezvous_port is not None  # set just above
            for port in sorted({0, rules.rendezvous_port}):
                _add_port(libc, ruleset, port, NET_BIND_TCP)
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        _check(libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)), "restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _add_path(libc: ctypes.CDLL, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # nothing there to grant
    try:
        if not os.path.isdir(path):
            access &= _FILE_RIGHTS
        rule = _PathBeneathAttr(access, fd)
        _check(
            libc.syscall(
                ctypes.c_long(_SYS_ADD_RULE),
                ctypes.c_int(ruleset),
                ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            ),
            f"add_rule({path})",
        )
    finally:
        os.close(fd)


def _add_port(libc: ctypes.CDLL, ruleset: int, port: int, access: int) -> None:
    rule = _NetPortAttr(access, port)
    _check(
        libc.syscall(
            ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_NET_PORT), ctypes.byref(rule), ctypes.c_uint32(0)
        ),
        f"add_rule(port {port})",
    )


def python_roots() -> list[str]:
    """What the Python interpreter itself needs to read: its prefixes, its standard library
    and every folder on ``sys.path``, plus the system's shared libraries and configuration."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, str(Path(sys.executable).parent)}
    roots.update(p for p in sys.path if p)
    roots.update(("/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", "/sys"))
    return sorted(str(Path(p).resolve()) for p in roots if os.path.exists(p))


def exposed(
    read: list[str] | tuple[str, ...], protected: list[str] | tuple[str, ...], writable: list[str] | tuple[str, ...] = ()
) -> list[str]:
    """The protected paths (the ledger database, other blocks' data, other runs) a job could
    read: one beneath a readable or ``writable`` root (confinement could not hide it), or one
    holding a readable root (a code root inside another run's folder, say). The job's own
    ``writable`` folders may lie inside a protected one (its work folder inside the runs
    folder). A job with any of them must not start."""
    roots = [Path(r).resolve() for r in (*read, *writable)]
    readable = [Path(r).resolve() for r in read]
    hits = []
    for path in protected:
        target = Path(path).resolve()
        if any(target == root or root in target.parents for root in roots) or any(target in root.parents for root in readable):
            hits.append(str(path))
    return hits

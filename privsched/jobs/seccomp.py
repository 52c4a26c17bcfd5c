"""A seccomp filter for what a job's namespaces do not reach.

Without capabilities a job can neither open a packet socket nor make a device node, but a
filter refuses both outright, whatever uid or namespace a kernel bug or a misconfigured host
leaves it: ``socket(AF_PACKET, ...)``, ``mknod``/``mknodat`` of a character or block device,
and ``io_uring_setup`` (io_uring's operations, sockets among them, bypass seccomp). Each is
answered ``EPERM``, as is any system call made through another architecture's table (a
32-bit ``socketcall`` would otherwise slip past the numbers checked here).

The program is classic BPF over ``struct seccomp_data`` (``nr`` at offset 0, ``arch`` at 4,
``args[i]`` at 16 + 8i, little-endian), installed with ``prctl(PR_SET_SECCOMP,
SECCOMP_MODE_FILTER)`` after ``PR_SET_NO_NEW_PRIVS`` (kernel documentation,
``Documentation/userspace-api/seccomp_filter.rst``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from typing import NamedTuple

from privsched.jobs.sandbox import SandboxError

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_LD_W_ABS, _JEQ_K, _JSET_K, _AND_K, _RET_K = 0x20, 0x15, 0x45, 0x54, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_AF_PACKET = 17
_X32_BIT = 0x40000000
_S_IFMT = 0o170000  # the file-type bits of a mode (inode(7))


class _Arch(NamedTuple):
    audit: int  # AUDIT_ARCH_*
    socket: int
    mknodat: int
    mknod: int | None  # None where the table has only mknodat
    io_uring_setup: int


#: ``AUDIT_ARCH_*`` and system call numbers (arch/x86/entry/syscalls/syscall_64.tbl, the generic table).
_ARCHES = {
    "x86_64": _Arch(0xC000003E, socket=41, mknodat=259, mknod=133, io_uring_setup=425),
    "aarch64": _Arch(0xC00000B7, socket=198, mknodat=33, mknod=None, io_uring_setup=425),
}


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Filter))]


def _arg(index: int) -> int:
    return 16 + 8 * index  # the low 32 bits of args[index]


def program(machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for this (or the named) architecture."""
    arch = _ARCHES[machine or platform.machine()]
    deny = (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)
    allow = (_RET_K, 0, 0, _RET_ALLOW)
    device_mode = [(_AND_K, 0, 0, _S_IFMT), (_JEQ_K, 1, 0, stat.S_IFCHR), (_JEQ_K, 0, 1, stat.S_IFBLK), deny, allow]
    code: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 1, 0, arch.audit), deny, (_LD_W_ABS, 0, 0, 0)]
    if arch.audit == _ARCHES["x86_64"].audit:
        code += [(_JSET_K, 0, 1, _X32_BIT), deny]
    code += [(_JEQ_K, 0, 1, arch.io_uring_setup), deny]
    code += [(_JEQ_K, 0, 3, arch.socket), (_LD_W_ABS, 0, 0, _arg(0)), (_JEQ_K, 0, 1, _AF_PACKET), deny, (_LD_W_ABS, 0, 0, 0)]
    code += [(_JEQ_K, 0, len(device_mode) + 1, arch.mknodat), (_LD_W_ABS, 0, 0, _arg(2)), *device_mode, (_LD_W_ABS, 0, 0, 0)]
    if arch.mknod is not None:
        code += [(_JEQ_K, 0, len(device_mode) + 1, arch.mknod), (_LD_W_ABS, 0, 0, _arg(1)), *device_mode]
    return [*code, allow]


def install() -> None:
    """Filter this process (and every process it starts) from now on; raises
    :class:`SandboxError` where the kernel refuses or the architecture is unknown."""
    if platform.machine() not in _ARCHES:
        raise SandboxError(f"no seccomp filter known for {platform.machine()}")
    code = program()
    filters = (_Filter * len(code))(*(_Filter(*instruction) for instruction in code))
    prog = _Program(len(code), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 or libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) < 0:
        failed = ctypes.get_errno()
        raise SandboxError(failed, f"installing the seccomp filter failed: {os.strerror(failed)}")

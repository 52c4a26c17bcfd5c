"""Running a command in its own user and mount namespaces (``unshare --user --map-root-user
--mount``), where an unprivileged test may mount file systems that only that command sees:
a small tmpfs (a full disk), a folder bound read-only over itself (a read-only file system)."""

from __future__ import annotations

import subprocess

UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]


def namespaces_allowed() -> bool:
    """Whether this system lets an unprivileged process create user and mount namespaces."""
    try:
        return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False

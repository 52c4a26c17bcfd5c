"""A real scheduler process that stops (SIGSTOP) or dies (SIGKILL) at one step of a launch.

    python tests/fault_scheduler.py DB STEP stop|kill [LEASE_TTL]

It serves DB with FCFS and the local executor, wrapping one real operation so that the
process signals itself just before or just after it (the operation itself is not replaced).
Steps, in launch order (privsched.service.launching):

    before-running  before the ledger moves the pipeline granted → running
    after-running   after that write (launch recorded as launching), before the spawn marker
    after-marker    after the spawn marker, before the process is started
    after-popen     after the process started, before its pid file is written
    after-pid-file  after its pid file, before the launch is recorded as started
    after-started   after the launch is recorded as started

This module holds no tests.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from privsched.ledger import Ledger  # noqa: E402
from privsched.policies import make_policy  # noqa: E402
from privsched.service import launching  # noqa: E402
from privsched.service.executors import local  # noqa: E402
from privsched.service.resources import Pool  # noqa: E402
from privsched.service.serve import ServiceError, serve  # noqa: E402

STEPS = ("before-running", "after-running", "after-marker", "after-popen", "after-pid-file", "after-started")


def _fault(sig: int) -> None:
    print("fault", flush=True)
    os.kill(os.getpid(), sig)


def wrap(owner: object, name: str, sig: int, *, before: bool) -> None:
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if before:
            _fault(sig)
        result = original(*args, **kwargs)
        if not before:
            _fault(sig)
        return result

    setattr(owner, name, wrapped)


def main() -> int:
    db, step, action = sys.argv[1:4]
    ttl = float(sys.argv[4]) if len(sys.argv) > 4 else None
    sig = signal.SIGSTOP if action == "stop" else signal.SIGKILL
    if step == "before-running":
        wrap(Ledger, "mark_running", sig, before=True)
    elif step == "after-running":
        wrap(launching.LaunchFiles, "mark_spawning", sig, before=True)
    elif step == "after-marker":
        wrap(local.LocalExecutor, "start", sig, before=True)
    elif step == "after-popen":  # the job's process exists (started cold or forked), its pid file is not written
        wrap(local, "_start_ticks", sig, before=False)
    elif step == "after-pid-file":
        wrap(Ledger, "record_started", sig, before=True)
    elif step == "after-started":
        wrap(Ledger, "record_started", sig, before=False)
    else:
        raise SystemExit(f"unknown step {step!r}")
    try:
        serve(db, make_policy("fcfs"), local.LocalExecutor(), Pool((), cpus=4.0, memory=0), tick=0.05, until_idle=True, lease_ttl=ttl)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

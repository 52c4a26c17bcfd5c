"""Waiting in a test for something to happen: poll a condition until it holds, and fail
with a message naming what never happened.

The bound, :data:`PATIENCE`, is there only so that a broken build fails instead of hanging:
it is far above the time anything a test waits for takes on a loaded machine, and no test
asserts on how long anything took."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Seconds a test waits for an event before it fails.
PATIENCE = 300.0


def wait_for(condition: Callable[[], object], what: str, check: Callable[[], None] = lambda: None, poll: float = 0.05) -> None:
    """Return once ``condition()`` is true; ``check()`` runs between polls (to raise early
    if what should make it true has stopped). AssertionError naming ``what`` after
    :data:`PATIENCE` seconds."""
    deadline = time.monotonic() + PATIENCE
    while not condition():
        check()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {PATIENCE:g} s")
        time.sleep(poll)

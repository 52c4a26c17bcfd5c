"""A scheduler serving a database in a thread of the test process (``privsched serve``'s
loop, real job processes), stopped when the ``with`` block ends."""

from __future__ import annotations

import threading
from pathlib import Path

from privsched.service.serve import serve_options
from tests.support.waiting import wait_for


class Serving:
    """A scheduler serving the database in a thread, stopped on exit."""

    def __init__(self, path: Path, **options) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        options = {"tick": 0.1, "cpus": 8, "gpus": 2, **options}
        self.thread = threading.Thread(target=self._run, args=(path, options), daemon=True)

    def _run(self, path: Path, options: dict) -> None:
        try:
            serve_options(path, stop=self.stop, **options)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> Serving:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop.set()
        self.thread.join()


def wait_for_state(run, state: str) -> None:
    """Wait until pipeline handle ``run`` is in ``state`` (:func:`~tests.support.waiting.wait_for`)."""
    wait_for(lambda: run.status == state, f"pipeline {run.id} is {state}")

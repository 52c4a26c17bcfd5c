"""Answering a request once a pipeline's state changes, instead of the client polling.

``GET /v1/pipelines/{id}?wait=SECONDS&since=STATE`` answers as soon as the pipeline's
state is no longer ``since`` (by default: its state when the request came), or after
``wait`` seconds with the state then: a long poll, after Kubernetes' watches and Consul's
blocking queries. A waiting request holds no thread: it awaits :class:`StateChanges`, which
the scheduler of this process fires after each pass that changed pipelines' states
(:func:`privsched.service.wakeup.changed`), waking only the requests that wait on one of
those pipelines (one grant no longer makes every waiting request read its pipeline again);
a change made by another process is seen at the next look, every :data:`RECHECK` seconds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

from privsched.service import wakeup

#: Seconds between two looks of a waiting request when nothing in this process woke it: only
#: a change made by another process (a local `privsched cancel`) goes unannounced.
RECHECK = 1.0

#: The longest a request may wait, in seconds (below the remote client's 60-second timeout).
MAX_WAIT = 30.0

T = TypeVar("T")


class StateChanges:
    """Wakes the event loop's requests waiting on a pipeline at each change of its state
    that the scheduler of this process reports for the database at ``path`` (and all of
    them at a change it does not name). Create and use it on the event loop."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._path = path
        self._loop = asyncio.get_running_loop()
        self._events: dict[int, asyncio.Event] = {}  # per pipeline waited on: the next change's event
        self._waiters: dict[int, int] = {}  # per pipeline waited on: how many requests wait
        wakeup.watch(path, self._notify)

    def close(self) -> None:
        wakeup.unwatch(self._path, self._notify)

    def _notify(self, pipelines: wakeup.Changed) -> None:
        """From the scheduler's (or a worker's) thread: fire on the loop."""
        self._loop.call_soon_threadsafe(self._fire, pipelines)

    def _fire(self, pipelines: wakeup.Changed) -> None:
        """Set the events of the pipelines that changed; the next wait on each awaits a new one."""
        for pipeline_id in list(self._events) if pipelines is None else pipelines:
            event = self._events.pop(pipeline_id, None)
            if event is not None:
                event.set()

    def _next(self, pipeline_id: int) -> asyncio.Event:
        return self._events.setdefault(pipeline_id, asyncio.Event())

    async def until(self, pipeline_id: int, look: Callable[[], Awaitable[T]], done: Callable[[T], bool], seconds: float) -> T:
        """``await look()`` (a read of pipeline ``pipeline_id``) again at each change of it
        (and every :data:`RECHECK` seconds) until ``done`` holds of what it found or
        ``seconds`` have passed; what the last look found."""
        deadline = self._loop.time() + seconds
        self._waiters[pipeline_id] = self._waiters.get(pipeline_id, 0) + 1
        try:
            event = self._next(pipeline_id)  # taken before each look: a change during the look is not missed
            found = await look()
            while not done(found) and (left := deadline - self._loop.time()) > 0:
                try:
                    await asyncio.wait_for(event.wait(), min(RECHECK, left))
                except TimeoutError:
                    if left <= RECHECK:  # the time is up
                        break
                event = self._next(pipeline_id)
                found = await look()
            return found
        finally:
            self._waiters[pipeline_id] -= 1
            if not self._waiters[pipeline_id]:  # no one waits on it any more: forget its event
                del self._waiters[pipeline_id]
                self._events.pop(pipeline_id, None)

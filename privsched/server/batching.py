"""Group commit of submissions: requests that arrive together share one ledger
transaction, and so one disk sync, instead of one each.

Each request builds its own claim (parsing, demand, compute check), then hands it to
one writer thread, which records everything waiting in one :meth:`Ledger.submit_many`
(all or none) on a connection of its own, then wakes the scheduler of this process
(:mod:`privsched.service.wakeup`). If that transaction fails, the writer records the batch one by one, so each
request gets its own outcome: its pipeline id, or its own error (a duplicate submission
id, a demand that can never be granted) with nothing written for it.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from privsched.ledger import Ledger, PipelineRequest
from privsched.ledger.identities import Identities, User
from privsched.service import wakeup

#: Most submissions one transaction records.
MAX_BATCH = 256


@dataclass
class _Pending:
    request: PipelineRequest
    user: User
    submission_id: str | None
    done: Future[int] = field(default_factory=Future)


class SubmitBatcher:
    """Records submissions for many request threads through one writer thread."""

    def __init__(self, ledger: Ledger) -> None:
        # A connection of its own: the request threads' reads on ``ledger`` do not wait
        # behind the writer's transactions and their disk syncs (WAL readers never block).
        self.ledger = Ledger(ledger.path)
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="privsched-submit", daemon=True)
        self._thread.start()

    def enqueue(self, request: PipelineRequest, user: User, submission_id: str | None) -> Future[int]:
        """Record one claim: a future of its pipeline id once committed, or of the error
        that refused it."""
        pending = _Pending(request, user, submission_id)
        self._queue.put(pending)
        return pending.done

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        self.ledger.close()

    def _run(self) -> None:
        while (first := self._queue.get()) is not None:
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(item)
            self._record(batch)

    def _record(self, batch: list[_Pending]) -> None:
        claim = Identities.claim(self.ledger.db, [(p.user, p.submission_id) for p in batch])
        try:
            ids = self.ledger.submit_many([p.request for p in batch], claim=claim, actor=[p.user.name for p in batch])
        except BaseException as exc:  # noqa: BLE001 -- handed to the request that caused it
            if len(batch) == 1:
                batch[0].done.set_exception(exc)
            else:
                for pending in batch:
                    self._record([pending])
            return
        wakeup.notify(self.ledger.path)
        for pending, pipeline_id in zip(batch, ids):
            pending.done.set_result(pipeline_id)

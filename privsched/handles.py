"""A handle on one submitted pipeline, shared by the local and the remote client."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:  # the data classes load NumPy, which a remote submission never needs
    from privsched.ledger.models import PipelineInfo
    from privsched.ledger.states import PipelineState

H = TypeVar("H", bound="PipelineHandle")


class PipelineSource(Protocol):
    """What a handle asks of its client."""

    def status(self, pipeline_id: int) -> PipelineInfo: ...

    def cancel(self, pipeline_id: int) -> str: ...

    def logs(self, pipeline_id: int) -> str: ...


class PipelineHandle:
    """One pipeline of a client; every property asks the client afresh."""

    #: Seconds between two looks at the pipeline in :meth:`wait`.
    POLL = 0.1

    def __init__(self, client: PipelineSource, pipeline_id: int) -> None:
        self.client = client
        self.id = int(pipeline_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id}, status={self.status!r})"

    @property
    def info(self) -> PipelineInfo:
        return self.client.status(self.id)

    @property
    def status(self) -> PipelineState:
        return self.info.state

    @property
    def done(self) -> bool:
        return self.status.is_final()

    def wait(self: H, timeout: float | None = None, poll: float | None = None) -> H:
        """Block until the pipeline ends (a scheduler must be serving the database);
        ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"pipeline {self.id} is still {self.status} after {timeout:g} s")
            time.sleep(self.POLL if poll is None else poll)
        return self

    def cancel(self) -> str:
        return self.client.cancel(self.id)

    def logs(self) -> str:
        return self.client.logs(self.id)

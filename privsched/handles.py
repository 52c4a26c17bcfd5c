"""A handle on one submitted pipeline, shared by the local and the remote client."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:  # the data classes load NumPy, which a remote submission never needs
    from privsched.ledger.models import PipelineInfo
    from privsched.ledger.states import PipelineState
    from privsched.results import PipelineResult

H = TypeVar("H", bound="PipelineHandle")


class PipelineSource(Protocol):
    """What a handle asks of its client."""

    def status(self, pipeline_id: int) -> PipelineInfo: ...

    def cancel(self, pipeline_id: int) -> str: ...

    def logs(self, pipeline_id: int) -> str: ...

    def result(self, pipeline_id: int) -> PipelineResult: ...

    def download(self, pipeline_id: int, out: str | os.PathLike, names: Sequence[str] | None = None) -> list[Path]: ...


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

    @property
    def result(self) -> PipelineResult:
        """What the pipeline released, what it was charged, and its artifacts."""
        return self.client.result(self.id)

    @property
    def metrics(self) -> dict[str, Any]:
        """What its job released (empty before it ends)."""
        return self.result.metrics

    def download(self, out: str | os.PathLike, names: Sequence[str] | None = None) -> list[Path]:
        """Copy its artifacts (all, or ``names``) into the folder ``out``; the files written."""
        return self.client.download(self.id, out, names)

"""What a client may hold of the server: request bodies, connections, file descriptors, time.

- A cap on request bodies, enforced before the app reads them: a ``Content-Length`` over the
  limit gets 413 at once, and a chunked body is cut off once it passes the limit
  (:class:`BodyLimit`).
- A cap on open connections, below the process's open-file limit less a reserve kept for the
  scheduler (its job launches, the ledger): a connection past the cap is closed as soon as it
  is accepted, so clients are refused and the scheduler never runs out of descriptors
  (:func:`connection_cap`, :func:`guarded_protocol`).
- A deadline for a request's headers (:data:`HEADER_TIMEOUT`), armed when a connection opens
  and after each response: an idle or slow ("slowloris") connection is closed when it passes.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


#: A body declared at most this many times the limit is read and dropped before the 413,
#: so that a client still sending sees the answer rather than a reset connection.
DRAIN = 16


class TooLarge(HTTPException):
    """Raised while the app reads a body past the limit; the app's handler answers 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes")


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with a one-line 413."""

    def __init__(self, app: ASGIApp, limit: int, upload_limit: int | None = None, upload_suffix: str = "") -> None:
        self.app = app
        self.limit = limit
        #: A larger limit for uploads: POST requests whose path ends in ``upload_suffix``.
        self.upload_limit, self.upload_suffix = upload_limit, upload_suffix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.upload_limit is not None and scope.get("method") == "POST" and str(scope.get("path", "")).endswith(self.upload_suffix):
            await BodyLimit(self.app, self.upload_limit)(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            if declared.isdigit() and int(declared) <= DRAIN * self.limit:
                await self._drain(receive)  # so that the client, still sending, reads the answer
            await self._refuse(send)
            return
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise TooLarge(self.limit)
            return message

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracking)
        except TooLarge:
            if not started:
                await self._refuse(send)

    @staticmethod
    async def _drain(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body"):
                return

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"error": f"request body over {self.limit} bytes"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


#: File descriptors kept free for the scheduler whatever clients do: a job launch takes a
#: log, pipes, a context file; the ledger and the fork server take more.
FD_RESERVE = 256
#: The most connections served at once, however high the open-file limit.
MAX_CONNECTIONS = 1024
#: Seconds a connection has to send a request's headers (after it opens, or after a response).
HEADER_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE = 5


def raise_open_file_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns the soft limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def connection_cap(soft_limit: int, open_now: int) -> int:
    """How many connections to serve at once: what the open-file limit leaves after the
    descriptors open now and :data:`FD_RESERVE`, at most :data:`MAX_CONNECTIONS`, at least 8."""
    return max(8, min(MAX_CONNECTIONS, soft_limit - open_now - FD_RESERVE))


def open_descriptors() -> int:
    """The descriptors this process holds (Linux: ``/proc/self/fd``; elsewhere a guess)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def guarded_protocol(cap: int, header_timeout: float = HEADER_TIMEOUT) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, closing a connection accepted past ``cap`` at once and
    one that has not sent a request's headers ``header_timeout`` seconds after it opened or
    after its last response."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Guarded(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > cap:
                transport.abort()
                return
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(header_timeout, self._due, self.cycle)

        def _due(self, cycle: Any) -> None:
            if self.cycle is cycle and not self.transport.is_closing():  # no request began since
                self.transport.close()

    return Guarded

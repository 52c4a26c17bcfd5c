"""A cap on request bodies, enforced before the app reads them: a ``Content-Length`` over
the limit gets 413 at once, and a chunked body is cut off once it passes the limit."""

from __future__ import annotations

import json

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

"""Security headers on every response of the HTTP API and the dashboard.

- ``Content-Security-Policy``: scripts, styles and requests from this server only, nothing
  inline, no frames, no plugins (the dashboard loads its one script and one style sheet from
  ``/dashboard/static`` and sets styles only through the DOM, which the policy allows);
- ``X-Frame-Options: DENY`` (and ``frame-ancestors 'none'``): no page of it inside another's;
- ``X-Content-Type-Options: nosniff``: a response is only what its media type says;
- ``Referrer-Policy: no-referrer``: no address of it leaves with a link.

FastAPI's own OpenAPI page (``/docs``), which loads its scripts from a CDN, is off; the schema
stays at ``/openapi.json``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The policy of every response.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class SecurityHeaders:
    """ASGI middleware: add :data:`HEADERS` to every HTTP response (errors included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in HEADERS if h[0] not in names)]
            await send(message)

        await self.app(scope, receive, with_headers)

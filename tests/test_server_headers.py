"""Security headers on every response of a real server on the loopback, and no page that
loads scripts from elsewhere."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from importlib import resources

import pytest

from privsched.server.headers import CONTENT_SECURITY_POLICY
from tests.server_fixtures import Server, server  # noqa: F401 -- the fixture

EXPECTED = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def fetch(server: Server, path: str, token: str | None = None) -> tuple[int, dict[str, str | None], bytes]:
    """The status, the :data:`EXPECTED` headers (None where missing) and the body."""
    request = urllib.request.Request(server.url + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {name: response.headers.get(name) for name in EXPECTED}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {name: exc.headers.get(name) for name in EXPECTED}, exc.read()


@pytest.mark.parametrize(
    ("path", "user", "status"),
    [
        ("/", None, 200),
        ("/dashboard/static/dashboard.js", None, 200),
        ("/v1/datasets", "admin", 200),
        ("/v1/datasets", None, 401),
        ("/v1/nothing-here", "admin", 404),
        ("/openapi.json", None, 200),
    ],
)
def test_every_response_carries_the_security_headers(server: Server, path: str, user: str | None, status: int):  # noqa: F811
    code, headers, _ = fetch(server, path, None if user is None else server.tokens[user])
    assert code == status
    assert headers == EXPECTED


def test_the_cdn_backed_openapi_pages_are_off(server: Server):  # noqa: F811
    assert fetch(server, "/docs")[0] == 404 and fetch(server, "/redoc")[0] == 404


def test_the_dashboard_page_needs_nothing_the_policy_forbids():
    """No inline script, style or event handler, and nothing from another origin: what
    ``script-src 'self'; style-src 'self'`` lets a browser run."""
    static = resources.files("privsched.dashboard").joinpath("static")
    page = static.joinpath("index.html").read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=\"/)", page) == [] and "<style" not in page
    assert re.findall(r"\son[a-z]+=", page) == [] and " style=" not in page
    assert re.findall(r"(?:src|href)=\"(?:https?:)?//", page) == []
    script = static.joinpath("dashboard.js").read_text()
    assert not re.search(r"\beval\(|new Function\(|setAttribute\(\"style\"|\.innerHTML\s*=", script)

"""A privsched HTTP API on the loopback for the server and remote-client tests: a real
database, real users with real tokens, and a real uvicorn server on a free port."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from privsched import connect
from privsched.ledger.identities import Identities
from privsched.server.runner import Listen, http_api
from tests.support.blockdata import block_files


@dataclass
class Server:
    url: str
    db: Path
    tokens: dict[str, str]  # user name -> bearer token

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        user: str | None = "admin",
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One request with ``user``'s token (None: no token); the status and decoded JSON."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if user is not None:
            request.add_header("Authorization", f"Bearer {self.tokens.get(user, user)}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def make_database(path: Path) -> dict[str, str]:
    """Datasets ``reviews`` (open to all) and ``secret`` (team red only), each with blocks
    b0..b3 fully unlocked (basic accounting, ε_G = 1), and five users (the submitters may
    submit code jobs); returns their tokens."""
    with connect(path) as client:
        for name in ("reviews", "secret"):
            client.create_dataset(name, epsilon=1.0, delta=1e-6, accounting="basic")
            client.add_blocks(name, block_files(path.parent / name, [f"b{i}" for i in range(4)]), unlocked=1.0)
        secret = client.dataset("secret").id
    with Identities(path) as identities:
        identities.restrict(secret, ["red"])
        return {
            "admin": identities.add_user("admin", "admin"),
            "alice": identities.add_user("alice", "submitter", "blue", code=True),
            "bob": identities.add_user("bob", "submitter", "blue", code=True),
            "rita": identities.add_user("rita", "submitter", "red", code=True),
            "vera": identities.add_user("vera", "viewer", "blue"),
        }


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    db = tmp_path / "p.db"
    tokens = make_database(db)
    with http_api(db, Listen("127.0.0.1", 0)) as bound:
        yield Server(bound.url, db, tokens)


def spec(name: str = "p", dataset: str = "reviews", blocks: list[str] | None = None, epsilon: float = 0.2) -> dict:
    return {
        "name": name,
        "dataset": dataset,
        "blocks": blocks or ["b0"],
        "epsilon": epsilon,
        "job": {"function": "tests.service_jobs:spend_half"},
    }

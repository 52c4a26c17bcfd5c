"""``list`` filters, ``quota list`` and the budget view through ``--server``: the filters are the API's query
parameters (``GET /v1/pipelines?owner=&mine=&limit=``), ``--mine`` is the token's user,
and a team's quota usage is seen by its members and admins only (``GET /v1/quotas``)."""

from __future__ import annotations

import json

import pytest

import privsched as ps
from privsched.ledger import Ledger
from tests.cli_inprocess import invoke
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture


def remote(server: Server, user: str, monkeypatch: pytest.MonkeyPatch, *args: str) -> object:
    """``privsched --server URL *args -o json`` with ``user``'s token: the decoded answer."""
    monkeypatch.setenv("PRIVSCHED_TOKEN", server.tokens[user])
    done = invoke("--server", server.url, *args, "-o", "json")
    assert done.code == 0 and done.stderr == "", done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def submitted(server: Server) -> list[int]:
    """Pipelines by alice, bob, alice and rita (on ``secret``, red's), in this order."""
    ids = []
    for user, dataset in (("alice", "reviews"), ("bob", "reviews"), ("alice", "reviews"), ("rita", "secret")):
        with ps.connect(server.url, token=server.tokens[user]) as client:
            ids.append(client.submit(spec(dataset=dataset, epsilon=0.1)).id)
    return ids


def test_list_mine_through_a_server_is_the_tokens_user(server: Server, submitted: list[int], monkeypatch):
    assert [p["id"] for p in remote(server, "alice", monkeypatch, "list", "--mine")] == [submitted[0], submitted[2]]


def test_list_owner_and_limit_through_a_server(server: Server, submitted: list[int], monkeypatch):
    assert [p["owner"] for p in remote(server, "vera", monkeypatch, "list", "--owner", "bob")] == ["bob"]
    assert [p["id"] for p in remote(server, "admin", monkeypatch, "list", "--limit", "2")] == submitted[2:]


def test_list_owner_never_shows_a_dataset_the_caller_may_not_read(server: Server, submitted: list[int], monkeypatch):
    assert remote(server, "alice", monkeypatch, "list", "--owner", "rita") == []


def test_a_limit_below_one_is_refused_by_the_api(server: Server):
    status, answer = server.call("GET", "/v1/pipelines?limit=0")
    assert status == 422 and "limit" in answer["error"]


def test_a_misspelt_dataset_through_the_api_suggests_only_a_readable_one(server: Server):
    suggested = {"error": "unknown dataset 'reveiws'; did you mean 'reviews'?"}
    assert server.call("GET", "/v1/datasets/reveiws", user="alice") == (404, suggested)
    assert server.call("GET", "/v1/datasets/secrets", user="alice") == (404, {"error": "unknown dataset 'secrets'"})
    assert server.call("GET", "/v1/datasets/secrets", user="rita")[1]["error"].endswith("did you mean 'secret'?")


def test_quota_list_shows_a_teams_share_and_what_it_holds(server: Server, submitted: list[int], monkeypatch):
    with ps.connect(server.url, token=server.tokens["admin"]) as admin:
        admin.set_quota("reviews", "blue", 0.5)
        admin.set_quota("secret", "red", 0.25)
    with Ledger(server.db) as ledger:
        ledger.grant([submitted[0]])
    (blue,) = remote(server, "vera", monkeypatch, "quota", "list")
    assert (blue["dataset"], blue["team"], blue["share"], blue["consumed"]) == ("reviews", "blue", 0.5, 0.0)
    assert blue["held"] == pytest.approx(0.1)  # alice's granted ε 0.1 of ε_G = 1
    assert [q["team"] for q in remote(server, "rita", monkeypatch, "quota", "list")] == ["red"]
    assert [q["team"] for q in remote(server, "admin", monkeypatch, "quota", "list")] == ["blue", "red"]


def test_quota_list_locally_shows_every_team(server: Server, submitted: list[int]):
    with ps.connect(server.db) as client:
        client.set_quota("reviews", "blue", 0.5)
    done = invoke("quota", "list", db=server.db)
    assert done.code == 0 and "│ reviews │ blue │ 50 %  │ 0 %  │ 0 %      │" in done.stdout


def test_the_budget_view_adds_up_and_covers_only_readable_datasets(server: Server, submitted: list[int], monkeypatch):
    with Ledger(server.db) as ledger:
        ledger.grant(submitted)
    status, answer = server.call("GET", "/v1/budget", user="vera")
    assert status == 200 and [entry["dataset"]["name"] for entry in answer] == ["reviews"]
    b0 = next(block for block in answer[0]["blocks"] if block["key"] == "b0")
    assert b0["shares"]["allocated"] == pytest.approx(0.3)  # three pipelines of ε 0.1 on ε_G = 1
    for block in answer[0]["blocks"]:
        assert sum(block["shares"][part] for part in ("consumed", "allocated", "left")) == pytest.approx(1.0)


def test_budget_show_through_a_server_prints_the_budget_view(server: Server, submitted: list[int], monkeypatch):
    with Ledger(server.db) as ledger:
        ledger.grant(submitted)
    assert remote(server, "admin", monkeypatch, "budget", "show", "reviews") == server.call("GET", "/v1/budget?dataset=reviews")[1]


def test_a_pipelines_answer_gives_its_demand_per_block_as_epsilon_and_share(server: Server, submitted: list[int], monkeypatch):
    status, answer = server.call("GET", f"/v1/pipelines/{submitted[0]}", user="vera")
    assert status == 200
    shown = [(b["key"], b["epsilon"], b["share"], b["consumed_epsilon"]) for b in answer["budget"]]
    assert shown == [("b0", 0.1, pytest.approx(0.1), None)]
    assert remote(server, "vera", monkeypatch, "status", str(submitted[0]))["budget"] == answer["budget"]


def test_a_listing_leaves_the_per_block_budget_out(server: Server, submitted: list[int]):
    assert {p["budget"] for p in server.call("GET", "/v1/pipelines")[1]} == {None}

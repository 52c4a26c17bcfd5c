"""The HTTP API against a real server on the loopback: authentication, roles and teams,
bad requests, idempotent submissions; every refusal changes nothing in the database."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privsched.ledger import Ledger
from privsched.ledger.identities import Identities
from tests.conftest import dump_database
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture

ROUTES = [
    ("GET", "/v1/datasets", None),
    ("GET", "/v1/pipelines", None),
    ("POST", "/v1/pipelines", {"spec": spec()}),
    ("POST", "/v1/datasets", {"name": "new", "epsilon": 1, "delta": 1e-6}),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_a_request_without_a_live_token_gets_401_and_changes_nothing(server: Server, method, path, body):
    with Identities(server.db) as identities:
        identities.revoke("bob")
    before = dump_database(server.db)
    for user in (None, "psk_not-a-token", "bob"):
        status, answer = server.call(method, path, body, user=user)
        assert status == 401, answer
        assert "token" in answer["error"] and "\n" not in answer["error"]
    assert dump_database(server.db) == before


def submit(server: Server, user: str, **fields) -> int:
    status, answer = server.call("POST", "/v1/pipelines", {"spec": spec(**fields)}, user=user)
    assert status == 201, answer
    return answer["id"]


def test_submitters_are_refused_what_is_not_theirs_with_403_and_nothing_changes(server: Server):
    alices = submit(server, "alice")
    before = dump_database(server.db)
    refused = [
        ("POST", f"/v1/pipelines/{alices}/cancel", None),  # another user's pipeline
        ("POST", "/v1/datasets", {"name": "mine", "epsilon": 1, "delta": 1e-6}),
        ("POST", "/v1/datasets/reviews/blocks", {"blocks": [{"key": "b9"}]}),
        ("POST", "/v1/datasets/reviews/unlock", {"fraction": 1.0}),  # releasing budget
        ("GET", "/v1/datasets/secret", None),  # a dataset of team red only
        ("GET", "/v1/blocks?dataset=secret", None),
        ("POST", "/v1/pipelines", {"spec": spec(dataset="secret")}),
        ("GET", "/v1/audit", None),
        ("POST", "/v1/users", {"name": "eve", "role": "admin"}),
        ("GET", f"/v1/pipelines/{alices}/logs", None),
    ]
    for method, path, body in refused:
        status, answer = server.call(method, path, body, user="bob")
        assert status == 403, (path, answer)
        assert "\n" not in answer["error"]
    assert dump_database(server.db) == before


def test_a_viewer_reads_but_may_not_submit_or_cancel(server: Server):
    own = submit(server, "alice")
    assert server.call("GET", f"/v1/pipelines/{own}", user="vera")[0] == 200
    assert server.call("POST", "/v1/pipelines", {"spec": spec()}, user="vera")[0] == 403
    assert server.call("POST", f"/v1/pipelines/{own}/cancel", user="vera")[0] == 403


def test_datasets_of_other_teams_are_not_listed_and_their_team_reads_them(server: Server):
    names = lambda user: {d["name"] for d in server.call("GET", "/v1/datasets", user=user)[1]}  # noqa: E731
    assert names("alice") == {"reviews"}
    assert names("rita") == names("admin") == {"reviews", "secret"}
    own = submit(server, "rita", dataset="secret")
    listed = server.call("GET", "/v1/pipelines", user="alice")[1]
    assert own not in [p["id"] for p in listed]
    assert server.call("GET", f"/v1/pipelines/{own}", user="alice")[0] == 403


def test_a_pipeline_records_its_owner_and_team_and_its_owner_may_cancel_it(server: Server):
    status, answer = server.call("POST", "/v1/pipelines", {"spec": {**spec(), "owner": "someone-else"}}, user="alice")
    assert status == 201
    assert (answer["owner"], answer["team"]) == ("alice", "blue")  # a submitter cannot pose as another
    status, answer = server.call("POST", f"/v1/pipelines/{answer['id']}/cancel", user="alice")
    assert (status, answer["outcome"]) == (200, "cancelled")


BAD_BODIES = [
    b"{not json",
    b"[]",
    b'{"spec": 3}',
    b'{"spec": {"name": "x"}}',
    b'{"spec": {"name": "x", "dataset": "reviews", "blocks": ["b0"], "epsilon": -1}}',
    b'{"spec": {"name": "x", "dataset": "reviews", "blocks": ["nope"], "epsilon": 0.1, "job": {"function": "m:f"}}}',
    b'{"spec": {"name": "x", "dataset": "reviews", "blocks": ["b0"], "epsilon": 5, "job": {"function": "m:f"}}}',
    b'{"spec": {}, "extra": 1}',
]


@pytest.mark.parametrize("raw", BAD_BODIES)
def test_a_malformed_request_gets_one_line_4xx_and_nothing_is_written(server: Server, raw: bytes):
    before = dump_database(server.db)
    status, answer = server.call("POST", "/v1/pipelines", raw=raw)
    assert 400 <= status < 500
    assert answer["error"] and "\n" not in answer["error"]
    assert dump_database(server.db) == before
    assert server.call("GET", "/v1/datasets")[0] == 200  # still serving


def test_an_oversized_request_gets_413_and_the_server_keeps_serving(server: Server):
    before = dump_database(server.db)
    big = b'{"spec": {"name": "' + b"x" * (2 << 20) + b'"}}'
    status, answer = server.call("POST", "/v1/pipelines", raw=big)
    assert status == 413 and "request body over" in answer["error"]
    assert dump_database(server.db) == before
    assert server.call("GET", "/v1/pipelines")[0] == 200


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.sampled_from(["name", "dataset", "blocks", "epsilon", "delta", "job", "weight"]),
        st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.lists(st.text(max_size=3), max_size=2)),
    )
)
def test_any_malformed_specification_is_refused_with_one_line_and_writes_nothing(server: Server, fields):
    before = dump_database(server.db)
    status, answer = server.call("POST", "/v1/pipelines", {"spec": fields})
    assert 400 <= status < 500, answer
    assert "\n" not in answer["error"]
    assert dump_database(server.db) == before


def test_resubmitting_a_submission_id_returns_the_first_pipeline(server: Server):
    body = {"spec": spec(), "id": "nightly-1"}
    first = server.call("POST", "/v1/pipelines", body, user="alice")
    again = server.call("POST", "/v1/pipelines", body, user="alice")
    assert (first[0], again[0]) == (201, 200)
    assert first[1]["id"] == again[1]["id"]
    assert len(server.call("GET", "/v1/pipelines")[1]) == 1
    status, answer = server.call("POST", "/v1/pipelines", body, user="bob")
    assert status == 409 and "another user" in answer["error"]


def test_concurrent_submissions_of_one_id_create_one_pipeline(server: Server):
    answers = []

    def post() -> None:
        answers.append(server.call("POST", "/v1/pipelines", {"spec": spec(), "id": "race"}, user="alice"))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(status for status, _ in answers) == [200] * 7 + [201]
    assert len({answer["id"] for _, answer in answers}) == 1
    with Ledger(server.db) as ledger:
        assert len(ledger.list_pipelines()) == 1


def test_the_openapi_page_documents_every_route(server: Server):
    status, schema = server.call("GET", "/openapi.json", user=None)
    assert status == 200
    for path in (
        "/v1/datasets",
        "/v1/blocks",
        "/v1/pipelines",
        "/v1/pipelines/{pipeline_id}",
        "/v1/pipelines/{pipeline_id}/cancel",
        "/v1/pipelines/{pipeline_id}/logs",
        "/v1/audit",
        "/v1/users",
    ):
        assert path in schema["paths"]
    assert "PipelineOut" in schema["components"]["schemas"]


def test_an_admin_manages_users_and_a_revoked_token_stops_working(server: Server):
    status, answer = server.call("POST", "/v1/users", {"name": "sam", "role": "submitter", "team": "blue"})
    assert status == 201 and answer["token"].startswith("psk_")
    token = answer["token"]
    assert server.call("GET", "/v1/pipelines", user=token)[0] == 200
    assert server.call("POST", "/v1/users/sam/revoke")[0] == 200
    assert server.call("GET", "/v1/pipelines", user=token)[0] == 401
    with Ledger(server.db) as ledger:
        stored = ledger.db.execute("SELECT token_hash FROM users WHERE name = 'sam'").fetchone()[0]
    assert token not in stored and len(stored) == 64  # only the SHA-256 is kept


def test_concurrent_submissions_each_get_their_own_outcome(server: Server):
    """Submissions that share a transaction: one that can never be granted (ε 5 > ε_G 1)
    is refused alone, and every other is recorded once."""
    answers: dict[int, tuple[int, dict]] = {}

    def post(i: int) -> None:
        body = {"spec": spec(name=f"p{i}", epsilon=5.0 if i % 4 == 0 else 0.01)}
        answers[i] = server.call("POST", "/v1/pipelines", body, user="alice")

    threads = [threading.Thread(target=post, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, (status, answer) in answers.items():
        assert status == (400 if i % 4 == 0 else 201), answer
    with Ledger(server.db) as ledger:
        names = sorted(p.name for p in ledger.list_pipelines())
    assert names == sorted(f"p{i}" for i in range(16) if i % 4)


def test_the_dashboard_shows_each_caller_only_the_datasets_of_its_team(server: Server):
    names = lambda user: [d["name"] for d in server.call("GET", "/v1/dashboard/blocks", user=user)[1]]  # noqa: E731
    assert names("vera") == ["reviews"]
    assert names("rita") == names("admin") == ["reviews", "secret"]
    assert server.call("GET", "/v1/dashboard/queue", user=None)[0] == 401
    assert server.call("GET", "/v1/dashboard/audit", user="vera")[0] == 403
    status, audit = server.call("GET", "/v1/dashboard/audit")
    assert status == 200 and audit["ok"] and audit["head"]


@given(st.lists(st.floats(allow_nan=False), min_size=1, max_size=12), st.integers(0, 3))
def test_answers_carry_every_float_exactly_including_infinities(vector: list[float], copies: int):
    import json

    from privsched.server.app import reply
    from privsched.server.models import BlockOut

    block = BlockOut(
        id=1,
        dataset="d",
        key="k",
        location=None,
        state="active",
        created_at=1.5,
        capacity=vector,
        locked=vector,
        unlocked=[],
        allocated=vector,
        consumed=[0.0],
    )
    assert json.loads(reply(block).body) == block.model_dump()
    assert json.loads(reply([block] * copies).body) == [block.model_dump()] * copies
    assert json.loads(reply({"vector": vector}).body) == {"vector": vector}

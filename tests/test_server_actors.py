"""Against a real server on the loopback: every ledger event a request causes records the
authenticated user, the API and ``privsched status`` show it, and local writes record the
operator."""

from __future__ import annotations

from privsched.jobs.runner import JOB_RAISED
from privsched.ledger import Ledger
from privsched.ledger.models import OPERATOR
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture


def state_actors(server: Server, pipeline_id: int, user: str = "admin") -> list[tuple[str, str]]:
    status, answer = server.call("GET", f"/v1/pipelines/{pipeline_id}/events", user=user)
    assert status == 200, answer
    return [(e["kind"], e["actor"]) for e in answer if e["amount"] is None]


def test_a_submit_and_a_cancel_by_a_user_record_that_user(server: Server):
    status, answer = server.call("POST", "/v1/pipelines", {"spec": spec()}, user="alice")
    assert status == 201, answer
    pipeline = answer["id"]
    assert server.call("POST", f"/v1/pipelines/{pipeline}/cancel", user="alice")[0] == 200
    assert state_actors(server, pipeline, user="alice") == [("submit", "alice"), ("cancel", "alice")]
    with Ledger(server.db) as ledger:
        assert {e.actor for e in ledger.events(pipeline_id=pipeline)} == {"alice"}


def test_an_admin_cancelling_a_users_pipeline_is_recorded_as_the_admin(server: Server):
    pipeline = server.call("POST", "/v1/pipelines", {"spec": spec()}, user="bob")[1]["id"]
    assert server.call("POST", f"/v1/pipelines/{pipeline}/cancel", user="admin")[0] == 200
    assert state_actors(server, pipeline, user="bob") == [("submit", "bob"), ("cancel", "admin")]


def test_releasing_budget_creating_datasets_and_adding_blocks_record_the_admin(server: Server):
    with Ledger(server.db) as ledger:
        before = ledger.events()[-1].id
    assert server.call("POST", "/v1/datasets", {"name": "new", "epsilon": 1, "delta": 1e-6, "accounting": "basic"})[0] == 201
    assert server.call("POST", "/v1/datasets/new/blocks", {"blocks": [{"key": "k1"}]})[0] == 201
    assert server.call("POST", "/v1/datasets/new/unlock", {"fraction": 0.5})[0] == 200
    with Ledger(server.db) as ledger:
        caused = [(e.kind, e.actor) for e in ledger.events() if e.id > before]
    assert caused == [("create", "admin"), ("create", "admin"), ("unlock", "admin")]


def test_writes_before_the_server_were_the_operators(server: Server):
    with Ledger(server.db) as ledger:
        setup = [e for e in ledger.events() if e.kind in ("create", "unlock")]
    assert setup and {e.actor for e in setup} == {OPERATOR}


def test_status_shows_who_submitted_and_who_cancelled(server: Server, run_cli):
    pipeline = server.call("POST", "/v1/pipelines", {"spec": spec()}, user="alice")[1]["id"]
    server.call("POST", f"/v1/pipelines/{pipeline}/cancel", user="admin")
    for env in ({"PRIVSCHED_DB": str(server.db)}, {"PRIVSCHED_SERVER": server.url, "PRIVSCHED_TOKEN": server.tokens["vera"]}):
        shown = run_cli("status", str(pipeline), env=env)
        assert shown.returncode == 0, shown.stderr
        rows = {line.split()[1]: line for line in shown.stdout.splitlines() if line.strip().startswith("│")}
        assert rows["submitted"].rstrip(" │").endswith("by alice"), shown.stdout
        assert rows["finished"].rstrip(" │").endswith("by admin"), shown.stdout


def test_a_code_jobs_own_failure_message_in_the_events_reaches_its_submitter_and_admins_only(server: Server):
    pipeline = server.call("POST", "/v1/pipelines", {"spec": spec()}, user="alice")[1]["id"]
    said = JOB_RAISED + "ValueError: raw record 42 leaked here"
    with Ledger(server.db) as ledger:
        ledger.fail(pipeline, said, actor="scheduler")
    for user, shown in (("alice", said), ("admin", said), ("bob", None), ("vera", None)):
        answer = server.call("GET", f"/v1/pipelines/{pipeline}/events", user=user)[1]
        assert [e["reason"] for e in answer if e["kind"] == "fail"] == [shown], user


def test_a_failure_privsched_decided_is_shown_in_the_events_to_every_reader(server: Server):
    pipeline = server.call("POST", "/v1/pipelines", {"spec": spec()}, user="alice")[1]["id"]
    with Ledger(server.db) as ledger:
        ledger.fail(pipeline, "the job could not be started: no room", touched_data=False, actor="scheduler")
    for user in ("alice", "bob", "vera"):
        answer = server.call("GET", f"/v1/pipelines/{pipeline}/events", user=user)[1]
        assert [e["reason"] for e in answer if e["kind"] == "fail"] == ["the job could not be started: no room"], user

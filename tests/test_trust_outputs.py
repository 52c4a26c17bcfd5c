"""The trust model, enforced through a real server on the loopback and the real submit path:
a code job (``function:``) only from a submitter an admin allowed, and what it released or
wrote (metrics, its own failure message, its log) only to its submitter and admins, while
what privsched itself decided reaches every reader (docs/privacy.md, "Who may run what")."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import privsched as ps
from privsched.ledger import Ledger
from privsched.ledger.identities import Identities
from privsched.remote import RemoteError
from privsched.jobs.runner import JOB_RAISED
from privsched.server.access import WITHHELD, WITHHELD_BUILTIN
from tests.cli_inprocess import invoke
from tests.conftest import dump_database
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture
from tests.service_jobs import MARKER
from tests.support.serving import Serving

#: Generous: two tiny jobs on a shared machine.
WAIT = 120.0


def code_spec(name: str, function: str, block: str, epsilon: float = 0.2) -> dict:
    return {**spec(name, "reviews", [block], epsilon), "job": {"function": f"tests.service_jobs:{function}"}}


def fetch(server: Server, path: str, user: str) -> tuple[int, str]:
    """The status and body (as text) of ``GET path`` with ``user``'s token."""
    request = urllib.request.Request(server.url + path, headers={"Authorization": f"Bearer {server.tokens[user]}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def every_answer(server: Server, user: str, pipeline_ids: list[int]) -> dict[str, str]:
    """What ``user`` reads from every route and dashboard page about the database and the pipelines."""
    paths = ["/", "/v1/datasets", "/v1/blocks", "/v1/pipelines", "/v1/reasons", "/v1/scheduler"]
    paths += ["/v1/dashboard/blocks", "/v1/dashboard/queue", "/v1/dashboard/pipelines", "/v1/dashboard/teams", "/metrics"]
    paths += ["/dashboard/static/dashboard.js"]
    for pipeline_id in pipeline_ids:
        paths += [f"/v1/pipelines/{pipeline_id}{tail}" for tail in ("", "?wait=0.1", "/events", "/logs")]
        paths.append(f"/v1/dashboard/pipelines/{pipeline_id}")
    return {path: fetch(server, path, user)[1] for path in paths}


def every_command(server: Server, user: str, pipeline_ids: list[int], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What ``user`` reads from every reading command through ``--server`` (stdout and stderr)."""
    monkeypatch.setenv("PRIVSCHED_SERVER", server.url)
    monkeypatch.setenv("PRIVSCHED_TOKEN", server.tokens[user])
    commands = [["list"], ["budget", "show"], ["blocks", "list", "reviews"], ["dataset", "list"]]
    for pipeline_id in pipeline_ids:
        commands += [["status", pipeline_id], ["logs", pipeline_id]]
    found = {}
    for command in commands:
        done = invoke(*command)
        found[" ".join(map(str, command))] = done.stdout + done.stderr
    return found


def test_a_code_jobs_metric_message_and_log_reach_its_submitter_and_admins_and_no_viewer(server: Server, monkeypatch: pytest.MonkeyPatch):
    alice = ps.connect(server.url, token=server.tokens["alice"])
    with Serving(server.db, cpus=2, gpus=0):
        failed = alice.submit(code_spec("fails", "speaks_marker_then_raises", "b0"))
        completed = alice.submit(code_spec("completes", "speaks_marker_then_completes", "b1"))
        assert failed.wait(WAIT).status == "failed" and completed.wait(WAIT).status == "completed"
    ids = [failed.id, completed.id]
    for reader in ("vera", "bob"):  # a viewer of the team, and another submitter of it
        for where, text in {**every_answer(server, reader, ids), **every_command(server, reader, ids, monkeypatch)}.items():
            assert MARKER not in text, (reader, where)
    vera = ps.connect(server.url, token=server.tokens["vera"])
    assert vera.status(failed.id).message == WITHHELD
    for reader in ("alice", "admin"):
        answers = every_answer(server, reader, ids)
        assert MARKER in answers[f"/v1/pipelines/{failed.id}"]  # its exception
        assert MARKER in answers[f"/v1/pipelines/{failed.id}/logs"] and MARKER in answers[f"/v1/pipelines/{completed.id}/logs"]
        assert MARKER in answers[f"/v1/dashboard/pipelines/{completed.id}"]  # its metrics
        assert MARKER in answers["/v1/dashboard/pipelines"]  # the result column
    assert alice.status(failed.id).message == f"the job raised RuntimeError: {MARKER}"


def test_what_privsched_decided_about_a_pipeline_reaches_its_submitter_and_every_reader(server: Server):
    alice = ps.connect(server.url, token=server.tokens["alice"])
    first = alice.submit(code_spec("first", "no_report", "b2", epsilon=0.7))  # consumes its whole grant
    hopeless = alice.submit(code_spec("hopeless", "spend_half", "b2", epsilon=0.5))
    with Serving(server.db, cpus=2, gpus=0):
        assert first.wait(WAIT).status == "completed" and hopeless.wait(WAIT).status == "failed"
    for user in ("alice", "vera", "bob"):
        message = ps.connect(server.url, token=server.tokens[user]).status(hopeless.id).message
        assert message is not None and message.startswith("can never be granted"), (user, message)


def test_a_built_in_jobs_own_failure_message_and_log_reach_admins_only(server: Server):
    count = {**spec("count", "reviews", ["b3"], 0.1), "job": {"kind": "statistic", "params": {"query": "count"}}}
    pipeline = server.call("POST", "/v1/pipelines", {"spec": count}, user="alice")[1]["id"]
    said = JOB_RAISED + "IndexError: token 70001 is out of range"
    with Ledger(server.db) as ledger:
        ledger.fail(pipeline, said, actor="scheduler")
    for user, shown in (("admin", said), ("alice", WITHHELD_BUILTIN), ("vera", WITHHELD_BUILTIN)):
        assert server.call("GET", f"/v1/pipelines/{pipeline}", user=user)[1]["message"] == shown, user
    assert server.call("GET", f"/v1/pipelines/{pipeline}/logs", user="alice")[0] == 403
    assert server.call("GET", f"/v1/pipelines/{pipeline}/logs", user="admin")[0] == 200


def test_a_submitter_without_code_rights_gets_403_and_one_line_for_a_code_job_and_nothing_is_written(
    server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    with Identities(server.db) as identities:
        token = identities.add_user("dora", "submitter", "blue")
    server.tokens["dora"] = token
    before = dump_database(server.db)
    status, answer = server.call("POST", "/v1/pipelines", {"spec": code_spec("mine", "spend_half", "b0")}, user="dora")
    assert status == 403 and answer["error"].startswith("dora may not submit code jobs (function:)")
    assert server.call("POST", "/v1/pipelines/dry-run", {"spec": code_spec("mine", "spend_half", "b0")}, user="dora")[0] == 403
    with pytest.raises(RemoteError) as refused:
        ps.connect(server.url, token=token).submit(code_spec("mine", "spend_half", "b0"))
    assert refused.value.status == 403 and "\n" not in str(refused.value)
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ndataset: reviews\nblocks: [b0]\nepsilon: 0.2\njob: {function: 'tests.service_jobs:spend_half'}\n")
    monkeypatch.setenv("PRIVSCHED_SERVER", server.url)
    monkeypatch.setenv("PRIVSCHED_TOKEN", token)
    done = invoke("submit", path)
    assert done.code == 1 and done.stdout == "" and done.stderr.startswith("error: dora may not submit code jobs")
    assert done.stderr.count("\n") == 1
    with Ledger(server.db) as ledger:
        assert ledger.list_pipelines() == []
    assert dump_database(server.db) == before


def test_code_rights_granted_and_revoked_by_an_admin_are_recorded_with_who_changed_them(server: Server):
    with Identities(server.db) as identities:
        server.tokens["dora"] = identities.add_user("dora", "submitter", "blue")
    dora = ps.connect(server.url, token=server.tokens["dora"])
    assert server.call("POST", "/v1/users/dora/code", {"allowed": True}, user="alice")[0] == 403  # admins only
    status, allowed = server.call("POST", "/v1/users/dora/code", {"allowed": True}, user="admin")
    assert status == 200 and allowed == next(u for u in server.call("GET", "/v1/users")[1] if u["name"] == "dora")
    assert allowed["code"] is True
    assert dora.submit(code_spec("mine", "spend_half", "b0")).status == "pending"
    assert server.call("POST", "/v1/users/dora/code", {"allowed": False}, user="admin")[1]["code"] is False
    with pytest.raises(RemoteError):
        dora.submit(code_spec("again", "spend_half", "b0"))
    with Identities(server.db) as identities:
        changes = [(c.change, c.actor) for c in identities.changes("dora")]
    assert changes == [("added as submitter of team blue", None), ("code allowed", "admin"), ("code denied", "admin")]


def test_an_admin_grants_code_rights_through_the_remote_command_line(server: Server, monkeypatch: pytest.MonkeyPatch):
    with Identities(server.db) as identities:
        token = identities.add_user("dora", "submitter", "blue")
    monkeypatch.setenv("PRIVSCHED_SERVER", server.url)
    monkeypatch.setenv("PRIVSCHED_TOKEN", server.tokens["alice"])
    refused = invoke("user", "allow-code", "dora")
    assert refused.code == 1 and refused.stderr.startswith("error: only an admin may grant or revoke code rights")
    monkeypatch.setenv("PRIVSCHED_TOKEN", server.tokens["admin"])
    assert invoke("user", "allow-code", "dora").stdout == "user dora may submit code jobs\n"
    assert ps.connect(server.url, token=token).submit(code_spec("mine", "spend_half", "b0")).status == "pending"
    with Identities(server.db) as identities:
        assert identities.changes("dora")[-1].actor == "admin"


def test_viewers_and_admins_cannot_be_given_code_rights_and_nothing_changes(tmp_path: Path):
    db = tmp_path / "p.db"
    with ps.connect(db) as client:
        client.init()
        client.add_user("vera", "viewer")
        client.add_user("ada", "admin")
        before = dump_database(db)
        for name in ("vera", "ada", "nobody"):
            done = invoke("user", "allow-code", name, db=db)
            assert done.code == 1 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, name
        assert invoke("user", "add", "val", "--role", "viewer", "--code", db=db).code == 1
        assert dump_database(db) == before


def test_user_add_with_code_lets_a_local_submitter_run_code_and_user_list_says_so(tmp_path: Path):
    db = tmp_path / "p.db"
    ps.connect(db).init()
    assert invoke("user", "add", "carl", "--role", "submitter", "--code", db=db).code == 0
    assert invoke("user", "add", "dan", "--role", "submitter", db=db).code == 0
    listed = invoke("user", "list", db=db).stdout.splitlines()
    rows = {line.split("│")[1].strip(): line.split("│")[4].strip() for line in listed if "│" in line}
    assert (rows["carl"], rows["dan"]) == ("yes", "no")
    assert invoke("user", "deny-code", "carl", db=db).stdout == "user carl may no longer submit code jobs\n"
    with Identities(db) as identities:
        assert [u.may_run_code for u in identities.users()] == [False, False]


def test_the_readme_privacy_and_sandbox_docs_state_the_trust_model_in_the_same_words():
    from tests.conftest import REPO

    def paragraph(name: str) -> str:
        found = re.search(r"\*\*Who may run what\.\*\*.*?\n\n", (REPO / name).read_text(), re.S)
        assert found is not None, name
        return found.group(0)

    stated = {paragraph(name) for name in ("README.md", "docs/privacy.md", "docs/sandbox.md")}
    assert len(stated) == 1
    assert "reach only their submitter and admins" in next(iter(stated))

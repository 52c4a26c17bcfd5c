"""Waiting for a pipeline's change of state through the API (``?wait=&since=``), woken by
the scheduler of the same process, and the remote handle's ``wait`` that uses it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import privsched as ps
from privsched.policies import make_policy
from privsched.server import watching
from privsched.service import wakeup
from privsched.service.resources import Pool
from privsched.service.serve import serve
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture
from tests.support.executors import InstantExecutor
from tests.support.waiting import PATIENCE


@pytest.fixture
def scheduler(server: Server) -> Iterator[None]:  # noqa: F811 -- the fixture
    """A scheduler serving the server's database in its process, ticking only when woken."""
    stop = threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(server.db, make_policy("fcfs"), InstantExecutor(), Pool((), cpus=8.0, memory=0)),
        kwargs={"tick": 3600.0, "stop": stop},
    )
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.fixture
def no_rechecks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting requests look again only when woken, never on their own."""
    monkeypatch.setattr(watching, "RECHECK", 3600.0)


def submitted(server: Server, user: str = "alice", **fields) -> int:  # noqa: F811
    status, answer = server.call("POST", "/v1/pipelines", {"spec": spec(**fields)}, user=user)
    assert status == 201, answer
    return answer["id"]


def test_a_waiting_read_answers_once_the_scheduler_of_the_process_changes_the_state(server: Server, scheduler, no_rechecks):  # noqa: F811
    pipeline = submitted(server, blocks=["b1"])
    status, answer = server.call("GET", f"/v1/pipelines/{pipeline}?wait=30&since=pending", user="alice")
    assert status == 200 and answer["state"] != "pending", answer


def test_a_waiting_read_answers_with_the_same_state_when_nothing_changes(server: Server):  # noqa: F811
    pipeline = submitted(server)  # no scheduler serves the database: it stays pending
    status, answer = server.call("GET", f"/v1/pipelines/{pipeline}?wait=0.2", user="alice")
    assert (status, answer["state"]) == (200, "pending")


def test_a_state_other_than_since_is_answered_at_once(server: Server, no_rechecks):  # noqa: F811
    pipeline = submitted(server)
    status, answer = server.call("GET", f"/v1/pipelines/{pipeline}?wait=30&since=granted", user="alice")
    assert (status, answer["state"]) == (200, "pending")


def test_an_ended_pipeline_is_answered_at_once(server: Server, no_rechecks):  # noqa: F811
    pipeline = submitted(server)
    assert server.call("POST", f"/v1/pipelines/{pipeline}/cancel", user="alice")[0] == 200
    status, answer = server.call("GET", f"/v1/pipelines/{pipeline}?wait=30", user="alice")
    assert (status, answer["state"]) == (200, "cancelled")


def test_a_change_no_one_announces_is_seen_at_the_next_look(server: Server, monkeypatch):  # noqa: F811
    monkeypatch.setattr(watching, "RECHECK", 0.05)
    run = ps.connect(server.url, token=server.tokens["alice"]).submit(spec())
    canceller = threading.Timer(0.05, cancel_in_own_client, args=(server, run.id))  # the ledger directly, as another process would
    canceller.start()
    status, answer = server.call("GET", f"/v1/pipelines/{run.id}?wait=30&since=pending", user="alice")
    canceller.join()
    assert (status, answer["state"]) == (200, "cancelled")


def test_a_cancel_through_the_api_wakes_a_remote_wait(server: Server, no_rechecks):  # noqa: F811
    client = ps.connect(server.url, token=server.tokens["alice"])
    run = client.submit(spec())  # no scheduler serves the database: it stays pending
    canceller = threading.Timer(0.05, lambda: server.call("POST", f"/v1/pipelines/{run.id}/cancel", user="alice"))
    canceller.start()
    assert run.wait(timeout=PATIENCE).info.state == "cancelled"  # far less than the hour a recheck would take
    canceller.join()


def test_a_remote_wait_for_change_gives_the_pipeline_once_granted(server: Server, scheduler, no_rechecks):  # noqa: F811
    client = ps.connect(server.url, token=server.tokens["bob"])
    run = client.submit(spec(blocks=["b2"]))
    assert client.wait_for_change(run.id, "pending").granted_at is not None


def test_waiting_reads_keep_the_access_rules(server: Server):  # noqa: F811
    pipeline = submitted(server, user="rita", dataset="secret")
    assert server.call("GET", f"/v1/pipelines/{pipeline}?wait=30", user="alice")[0] == 403
    assert server.call("GET", f"/v1/pipelines/{pipeline}?wait=30", user=None)[0] == 401
    assert server.call("GET", f"/v1/pipelines/{pipeline}?wait=31", user="rita")[0] == 422
    assert server.call("GET", f"/v1/pipelines/{pipeline}?wait=1&since=asleep", user="rita")[0] == 422


def test_changed_calls_the_watchers_of_its_database_only(tmp_path):
    calls: list[tuple[str, frozenset[int] | None]] = []
    watchers = {name: (lambda pipelines, name=name: calls.append((name, pipelines))) for name in ("a", "b")}
    for name, watcher in watchers.items():
        wakeup.watch(tmp_path / f"{name}.db", watcher)
    wakeup.changed(tmp_path / "a.db", [3, 4])
    wakeup.unwatch(tmp_path / "b.db", watchers["b"])
    wakeup.changed(tmp_path / "b.db")
    wakeup.unwatch(tmp_path / "a.db", watchers["a"])
    wakeup.changed(tmp_path / "a.db")
    assert calls == [("a", frozenset({3, 4}))]


def test_a_change_wakes_only_the_requests_waiting_on_the_pipelines_it_names(tmp_path, no_rechecks):
    async def scenario() -> dict[int, int]:
        changes = watching.StateChanges(tmp_path / "a.db")
        looks = {1: 0, 2: 0}

        def waiter(pipeline_id: int) -> asyncio.Task:
            async def look() -> int:
                looks[pipeline_id] += 1
                return looks[pipeline_id]

            return asyncio.create_task(changes.until(pipeline_id, look, lambda n: n >= 2, 3600.0))

        first, second = waiter(1), waiter(2)
        await asyncio.sleep(0)  # both have looked once and wait
        wakeup.changed(tmp_path / "a.db", [1])
        await first  # woken, looked again, done
        await asyncio.sleep(0)
        assert looks[2] == 1  # not woken by pipeline 1's change
        wakeup.changed(tmp_path / "a.db")  # a change that names no pipeline wakes every waiter
        await second
        changes.close()
        return looks

    assert asyncio.run(scenario()) == {1: 2, 2: 2}


def test_the_local_client_waits_for_a_change_too(server: Server):  # noqa: F811
    with ps.connect(server.db) as client:
        run = client.submit(spec())  # no scheduler serves the database: it stays pending
        assert client.wait_for_change(run.id, "granted").state == "pending"  # not the state waited out: at once
        canceller = threading.Timer(0.05, cancel_in_own_client, args=(server, run.id))  # a client per thread
        canceller.start()
        assert client.wait_for_change(run.id, "pending", 30).state == "cancelled"
        canceller.join()


def cancel_in_own_client(server: Server, pipeline_id: int) -> None:  # noqa: F811
    with ps.connect(server.db) as client:
        client.cancel(pipeline_id)

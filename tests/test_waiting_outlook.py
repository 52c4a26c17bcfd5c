"""Why a pipeline waits, beyond the budget it lacks now: when the serving unlock rule will have
released enough (per time or per arrival), and what compute a granted job waits for. Checked
against the live scheduler's own unlock on a real ledger."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import privsched as ps
from privsched.policies import make_policy
from privsched.service.executors.local import LocalExecutor
from privsched.service.resources import Pool
from privsched.service.scheduler import Scheduler
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture


def pipeline(blocks: list[str], epsilon: float, gpus: int = 0, cpus: float = 1.0) -> dict:
    return {
        "name": "p",
        "dataset": "d",
        "blocks": blocks,
        "epsilon": epsilon,
        "job": {"function": "tests.service_jobs:spend_half"},
        "resources": {"gpus": gpus, "cpus": cpus},
    }


#: The compute the tests' scheduler serves with: two GPUs and four CPUs.
POOL = Pool(("0", "1"), 4.0, 0)


def database(path: Path, accounting: str = "basic", serving: tuple[str, dict] | None = None) -> ps.Client:
    """A dataset ``d`` of two blocks, nothing unlocked, served (as recorded) by ``serving``."""
    client = ps.connect(path)
    client.create_dataset("d", epsilon=1.0 if accounting == "basic" else 10.0, delta=1e-6, accounting=accounting)
    client.add_blocks("d", ["b0", "b1"])
    client.runs.record_pool(POOL)
    if serving is not None:
        spec = make_policy(serving[0], **serving[1])
        client.runs.record_policy(spec.name, spec.params)
    return client


def scheduler(client: ps.Client, policy: str, **options: object) -> Scheduler:
    """The live scheduler of the recorded policy, having counted every arrival so far."""
    spec = make_policy(policy, **options)  # type: ignore[arg-type]
    live = Scheduler(client.ledger, spec, LocalExecutor(), client.pool(), client.runs)
    live.recover(0.0)
    return live


def assert_fits_from(client: ps.Client, run_id: int, at: float, lifetime: float) -> None:
    """The live DPF-T scheduler's unlock an instant before ``at`` leaves the pipeline short of
    budget; its unlock at ``at`` lets it fit."""
    live = scheduler(client, "dpf-t", lifetime=lifetime)
    live.unlock(math.nextafter(at, 0.0))
    assert client.reasons("d")[run_id].code == "budget"
    live.unlock(at)
    assert client.reasons("d")[run_id].code == "turn"


def test_under_a_per_time_rule_the_reason_gives_the_time_the_scheduler_will_have_unlocked_enough(tmp_path):
    client = database(tmp_path / "p.db", serving=("dpf-t", {"lifetime": 1000.0}))
    run = client.submit(pipeline(["b0", "b1"], 0.3))
    why = client.reasons("d")[run.id]
    created = max(b.created_at for b in client.blocks("d"))
    assert (why.code, why.unlock, why.order) == ("budget", "time", "dpf-t")
    assert why.fits_at == pytest.approx(created + 300.0, abs=1.0)
    assert why.unlock_block in ("b0", "b1") and "if nothing else is granted" in why.text()
    assert_fits_from(client, run.id, why.fits_at, 1000.0)


def test_under_rdp_the_estimate_holds_at_some_order(tmp_path):
    client = database(tmp_path / "p.db", accounting="rdp", serving=("dpf-t", {"lifetime": 500.0}))
    run = client.submit({**pipeline(["b0"], 0.0), "epsilon": None, "mechanism": {"kind": "gaussian", "sigma": 1.0}})
    why = client.reasons("d")[run.id]
    created = client.blocks("d")[0].created_at
    assert (why.code, why.unlock, why.unlock_block) == ("budget", "time", "b0")
    assert created + 100 < why.fits_at < created + 400  # α = 5: d = 2.5 of ε_G(5) = 6.55
    assert_fits_from(client, run.id, why.fits_at, 500.0)


def test_under_a_per_arrival_rule_the_reason_counts_the_arrivals_still_needed(tmp_path):
    client = database(tmp_path / "p.db", serving=("dpf-n", {"n": 10}))
    run = client.submit(pipeline(["b0"], 0.45))  # its own arrival unlocks 0.1: four more reach 0.5
    why = client.reasons("d")[run.id]
    assert (why.unlock, why.arrivals, why.unlock_block) == ("arrivals", 4, "b0")
    assert "fits after 4 more arrival(s) on block b0" in why.text() and why.short().endswith("+4")
    for _ in range(3):
        client.submit(pipeline(["b0"], 0.9))
    scheduler(client, "dpf-n", n=10).unlock(0.0)
    assert (client.reasons("d")[run.id].code, client.reasons("d")[run.id].arrivals) == ("budget", 1)
    client.submit(pipeline(["b0"], 0.9))
    due = client.reasons("d")[run.id]  # counted, not yet unlocked
    assert due.arrivals == 0 and "the arrivals so far release enough at the scheduler's next unlock" in due.text()
    scheduler(client, "dpf-n", n=10).unlock(0.0)
    assert client.reasons("d")[run.id].code == "turn"


def test_a_demand_no_unlock_can_meet_says_it_waits_for_released_budget(tmp_path):
    client = database(tmp_path / "p.db", serving=("dpf-t", {"lifetime": 100.0}))
    client.unlock("d", 1.0)
    first = client.submit(pipeline(["b0"], 0.7))
    client.ledger.grant([first.id])
    run = client.submit(pipeline(["b0"], 0.5))
    why = client.reasons("d")[run.id]
    assert (why.code, why.unlock, why.unlock_block, why.fits_at) == ("budget", "time", None, None)
    assert "no further unlock is enough" in why.text() and why.short().endswith("never")


def test_without_a_recorded_policy_reasons_rank_by_arrival_and_estimate_nothing(tmp_path):
    client = database(tmp_path / "p.db")
    run = client.submit(pipeline(["b0"], 0.3))
    why = client.reasons("d")[run.id]
    assert (why.code, why.order, why.unlock, why.fits_at, why.arrivals) == ("budget", "arrival", None, None, None)


def test_a_granted_job_says_what_compute_it_waits_for_in_grant_order(tmp_path, run_cli):
    client = database(tmp_path / "p.db")
    client.unlock("d", 1.0)
    running = client.submit(pipeline(["b0"], 0.1, gpus=1, cpus=2))
    blocked = client.submit(pipeline(["b0"], 0.1, gpus=2, cpus=1))
    small = client.submit(pipeline(["b1"], 0.1, gpus=0, cpus=1))
    client.ledger.grant([running.id, blocked.id, small.id])
    client.ledger.mark_running(running.id, {"executor": "local", "gpus": ["0"], "cpus": 2.0, "memory": 0})
    reasons = client.reasons("d")
    assert running.id not in reasons
    assert (reasons[blocked.id].code, reasons[blocked.id].rank, reasons[blocked.id].pending) == ("compute", 1, 2)
    assert reasons[blocked.id].text() == "compute: needs 2 GPU(s), 1 CPU(s), free 1 GPU(s), 2 CPU(s); rank 1/2 (grant)"
    assert reasons[small.id].free is None and "starts at the scheduler's next pass" in reasons[small.id].text()
    env = {"PRIVSCHED_DB": str(client.path), "COLUMNS": "200"}
    assert "compute 1/2" in run_cli("list", env=env).stdout
    assert "compute: needs 2 GPU(s)" in run_cli("status", blocked.id, env=env).stdout
    client.runs.record_pool(Pool(("0",), 4.0, 0))  # the scheduler now serves a smaller pool
    never = client.reasons("d")[blocked.id]
    assert never.never == "the job asks for 2 GPU(s) but the pool has 1" and never.short() == "compute never"


def test_the_api_gives_the_same_outlook_as_the_local_client(server: Server):  # noqa: F811
    with ps.connect(server.db) as local:
        spec_t = make_policy("dpf-t", lifetime=1000.0)
        local.runs.record_policy(spec_t.name, spec_t.params)
        local.runs.record_pool(Pool(("0",), 2.0, 0))
        first = local.submit(spec(blocks=["b0"], epsilon=0.9))
        local.ledger.grant([first.id])
        local.ledger.mark_running(first.id, {"executor": "local", "gpus": [], "cpus": 2.0, "memory": 0})
        granted = local.submit(spec(blocks=["b1"], epsilon=0.1))
        local.ledger.grant([granted.id])
        waiting = local.submit(spec(blocks=["b0"], epsilon=0.5))
        here = local.reasons("reviews")
    there = ps.connect(server.url, token=server.tokens["alice"]).reasons("reviews")
    assert there[waiting.id].unlock == "time" and there[waiting.id].unlock_block is None  # all unlocked already
    assert there[granted.id].code == "compute" and there[granted.id].free == "1 GPU(s), 0 CPU(s)"
    assert {k: v.to_dict() for k, v in there.items()} == {k: v.to_dict() for k, v in here.items()}


def test_the_dashboard_shows_why_a_pipeline_waits_on_its_page_and_in_the_queue(server: Server):  # noqa: F811
    with ps.connect(server.db) as local:
        local.runs.record_pool(Pool((), 2.0, 0))
        first = local.submit(spec(blocks=["b0"], epsilon=0.9))
        local.ledger.grant([first.id])
        waiting = local.submit(spec(blocks=["b0"], epsilon=0.5))
    status, page = server.call("GET", f"/v1/dashboard/pipelines/{waiting.id}", user="alice")
    assert status == 200 and page["waiting"].startswith("budget: block b0 ε needs 0.5, unlocked 0.1")
    status, queue = server.call("GET", "/v1/dashboard/queue", user="alice")
    assert [row["reason"] for row in queue["granted"]] == [
        "compute: fits the free compute, starts at the scheduler's next pass; rank 1/1 (grant)"
    ]
    assert server.call("GET", f"/v1/dashboard/pipelines/{first.id}", user="alice")[1]["waiting"].startswith("compute")


def test_an_api_served_beside_a_scheduler_ranks_and_estimates_with_that_scheduler_s_policy(tmp_path):
    from privsched.ledger.identities import Identities
    from privsched.server.runner import Listen, http_api

    client = database(tmp_path / "p.db")  # no recorded policy: only the one handed to the API
    run = client.submit(pipeline(["b0"], 0.25))
    with Identities(client.path) as identities:
        token = identities.add_user("ana", "viewer")
    with http_api(client.path, Listen("127.0.0.1", 0), policy=make_policy("dpf-n", n=10)) as bound:
        why = ps.connect(bound.url, token=token).reasons("d")[run.id]
    assert (why.order, why.unlock, why.arrivals, why.unlock_block) == ("dpf-n", "arrivals", 2, "b0")

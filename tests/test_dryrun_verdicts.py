"""``submit --dry-run`` decides: it fits now (exit 0), waits and says why (exit 3), or can
never fit (exit 4), weighing the blocks' budgets, what they consumed for good, the team's
quota and the compute pool; it reads the demand as (ε, δ) at the dataset's δ_G, as ``status``
does; it writes nothing; and the client and the HTTP API say the same."""

from __future__ import annotations

from pathlib import Path

import pytest

import privsched as ps
from privsched.ledger import Ledger
from privsched.readouts import readout
from tests.cli_inprocess import invoke
from tests.conftest import dump_database
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture
from tests.support.blockdata import block_files


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A basic dataset ``d`` (ε_G = 1): b0 fully unlocked, b1 half unlocked, b2 with 0.7 consumed."""
    path = tmp_path / "p.db"
    with ps.connect(path) as client:
        client.create_dataset("d", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("d", block_files(tmp_path, ["b0", "b2"]), unlocked=1.0)
        client.add_blocks("d", block_files(tmp_path, ["b1"]), unlocked=0.5)
        spent = client.submit(builtin("spent", ["b2"], 0.7))
    with Ledger(path) as ledger:
        ledger.grant([spent.id])
        ledger.mark_running(spent.id, {})
        ledger.fail(spent.id, "stopped", touched_data=True)  # consumes its grant for good
    return path


def builtin(name: str, blocks: list[str], epsilon: float, **resources: float) -> dict:
    job = {"kind": "statistic", "params": {"query": "count"}}
    return {"name": name, "dataset": "d", "blocks": blocks, "epsilon": epsilon, "job": job, "resources": resources}


def dry_run(db: Path, tmp_path: Path, blocks: str, epsilon: float, extra: str = "") -> tuple[int, list[str]]:
    """``privsched submit --dry-run`` of a count on ``blocks``: exit status and lines; nothing written."""
    path = tmp_path / "p.yaml"
    path.write_text(
        f"name: p\ndataset: d\nblocks: {blocks}\nepsilon: {epsilon}\njob: {{kind: statistic, params: {{query: count}}}}\n{extra}"
    )
    before = dump_database(db)
    done = invoke("submit", path, "--dry-run", db=db)
    assert done.stderr == "" and dump_database(db) == before
    return done.code, done.stdout.splitlines()


def test_a_demand_that_fits_every_block_now_fits_now_and_exits_0(db: Path, tmp_path: Path):
    assert dry_run(db, tmp_path, "[b0, b1]", 0.4) == (
        0,
        [
            "pipeline p on d: demand ε=0.4 at δ=0",
            "ε = 0.4 → 40 % of block b0: fits now",
            "ε = 0.4 → 40 % of block b1: fits now",
            "fits now",
        ],
    )


def test_a_demand_short_of_unlocked_budget_waits_says_where_and_exits_3(db: Path, tmp_path: Path):
    code, lines = dry_run(db, tmp_path, "[b0, b1]", 0.6)
    assert code == 3 and lines[2] == "ε = 0.6 → 60 % of block b1: does not fit now: ε short 0.1"
    assert lines[-1] == "waits: budget: block b1 ε short 0.1 of the unlocked budget"


def test_a_demand_beyond_what_a_block_has_not_consumed_can_never_fit_and_exits_4(db: Path, tmp_path: Path):
    code, lines = dry_run(db, tmp_path, "[b0, b2]", 0.5)
    assert code == 4 and lines[2] == "ε = 0.5 → 50 % of block b2: can never fit"
    assert lines[-1] == "can never fit: its demand exceeds what block 'b2' has not consumed in ε or δ"


def test_a_job_the_pool_can_never_hold_can_never_fit_and_exits_4(db: Path, tmp_path: Path):
    code, lines = dry_run(db, tmp_path, "[b0]", 0.1, "resources: {cpus: 4000}\n")
    assert code == 4 and lines[-1].startswith("can never fit: the job asks for 4000 CPU(s) but the pool has")


def test_the_demand_is_read_at_the_datasets_delta_as_status_reads_it(tmp_path: Path):
    db = tmp_path / "r.db"
    with ps.connect(db) as client:
        client.create_dataset("d", epsilon=10.0, delta=1e-7)
        client.add_blocks("d", block_files(tmp_path, ["b0"]), unlocked=1.0)
        mechanism = {"kind": "gaussian", "sigma": 2.0}
        plan = client.dry_run(
            {"name": "p", "dataset": "d", "blocks": ["b0"], "mechanism": mechanism, "job": {"function": "tests.service_jobs:spend_half"}}
        )
        submitted = client.submit(
            {"name": "p", "dataset": "d", "blocks": ["b0"], "mechanism": mechanism, "job": {"function": "tests.service_jobs:spend_half"}}
        )
        shown = readout(submitted.info.demands["b0"], client.dataset("d"))
    assert (plan.epsilon, plan.delta) == (shown.epsilon, shown.delta) and plan.delta == 1e-7
    assert plan.verdict == "fits now" and plan.exit_code == 0


def test_a_teams_quota_makes_a_demand_wait_or_never_fit_through_the_api(server: Server):
    with ps.connect(server.db) as local:
        local.set_quota("reviews", "blue", 0.3)
    alice, bob = (ps.connect(server.url, token=server.tokens[user]) for user in ("alice", "bob"))
    with Ledger(server.db) as ledger:
        ledger.grant([bob.submit(spec("held", blocks=["b0"], epsilon=0.2)).id])  # blue holds 0.2 of 0.3 on b0
    before = dump_database(server.db)
    waits = alice.dry_run(spec(blocks=["b0"], epsilon=0.2))
    assert (waits.verdict, waits.exit_code, waits.reason) == (
        "waits",
        3,
        "quota: team blue holds too much of its quota (0.3) on block 'b0'",
    )
    never = alice.dry_run(spec(blocks=["b1"], epsilon=0.4))
    assert (never.verdict, never.exit_code) == ("can never fit", 4)
    assert never.reason == "its demand exceeds what team blue's quota (0.3) leaves on block 'b1' in ε or δ"
    assert (
        ps.connect(server.url, token=server.tokens["rita"]).dry_run(spec(blocks=["b0"], epsilon=0.2)).verdict == "fits now"
    )  # red: no quota
    status, answer = server.call("POST", "/v1/pipelines/dry-run", {"spec": spec(blocks=["b1"], epsilon=0.4)}, user="alice")
    assert status == 200 and (answer["verdict"], answer["reason"]) == ("can never fit", never.reason)
    assert dump_database(server.db) == before

"""Why a pending pipeline waits, through the API, the remote client and the command line:
the block and dimension it falls shortest at, by how much, and its rank."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import privsched as ps
from privsched.budgets.exact import units
from privsched.ledger import Ledger
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture


def test_a_pending_pipeline_names_the_block_it_falls_short_on_and_its_rank(server: Server):
    remote = ps.connect(server.url, token=server.tokens["alice"])
    first = remote.submit(spec(blocks=["b0"], epsilon=0.6))
    with Ledger(server.db) as ledger:
        assert ledger.grant([first.id]) == [first.id]
    short = remote.submit(spec(blocks=["b1", "b0"], epsilon=0.7))
    fits = remote.submit(spec(blocks=["b1"], epsilon=0.1))
    reasons = remote.reasons("reviews")
    assert set(reasons) == {first.id, short.id, fits.id}
    assert reasons[first.id].code == "compute"  # granted: it waits for a scheduler to start its job
    why = reasons[short.id]
    assert (why.code, why.block, why.dimension, why.rank, why.pending, why.order) == ("budget", "b0", "ε", 1, 2, "arrival")
    assert (why.demand, why.unlocked, why.shortfall) == pytest.approx((0.7, 0.4, 0.3))
    assert (reasons[fits.id].code, reasons[fits.id].rank) == ("turn", 2)
    assert "block b0 ε needs 0.7, unlocked 0.4 (short 0.3)" in why.text()
    status, answer = server.call("GET", "/v1/reasons?dataset=secret", user="alice")
    assert status == 403


def test_list_and_status_show_the_reason(server: Server, run_cli):
    remote = ps.connect(server.url, token=server.tokens["alice"])
    run = remote.submit(spec(blocks=["b2"], epsilon=0.9))
    with Ledger(server.db) as ledger:
        ledger.grant([run.id])
    waiting = remote.submit(spec(blocks=["b2"], epsilon=0.5))
    env = {"PRIVSCHED_DB": str(server.db), "COLUMNS": "200"}
    listed = run_cli("list", env=env).stdout
    assert "budget b2 ε short 0.4" in listed
    shown = run_cli("status", waiting.id, env=env).stdout
    assert "budget: block b2 ε needs 0.5, unlocked 0.1 (short 0.4); rank 1/1 (arrival)" in shown


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.floats(0.01, 0.99), st.sets(st.sampled_from(["b0", "b1", "b2", "b3"]), min_size=1)), min_size=1, max_size=6),
    st.floats(0.0, 1.0),
)
def test_a_reason_says_turn_exactly_when_the_pipeline_fits_now(tmp_path_factory, demands, unlocked):
    path = tmp_path_factory.mktemp("w") / "p.db"
    with ps.connect(path) as client:
        client.create_dataset("d", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("d", ["b0", "b1", "b2", "b3"], unlocked=unlocked)
        runs = [
            client.submit(
                {
                    "name": "p",
                    "dataset": "d",
                    "blocks": sorted(keys),
                    "epsilon": epsilon,
                    "job": {"function": "tests.service_jobs:spend_half"},
                }
            )
            for epsilon, keys in demands
        ]
        reasons = client.reasons("d")
        assert sorted(r.rank for r in reasons.values()) == list(range(1, len(runs) + 1))
        for run, (epsilon, _) in zip(runs, demands):
            why = reasons[run.id]
            fits = units(epsilon, up=True) <= units(unlocked, up=False)  # exact quanta, rounding refuses
            assert (why.code == "turn") == fits
            if not fits:
                assert why.shortfall == pytest.approx(epsilon - unlocked, abs=2e-12)  # demand and budget in quanta


def test_a_dry_run_shows_the_demand_and_the_fit_of_each_block_and_writes_nothing(server: Server, run_cli, tmp_path):
    from tests.conftest import dump_database

    remote = ps.connect(server.url, token=server.tokens["alice"])
    with Ledger(server.db) as ledger:
        ledger.grant([remote.submit(spec(blocks=["b1"], epsilon=0.5)).id])
    before = dump_database(server.db)
    plan = remote.dry_run(spec(blocks=["b0", "b1"], epsilon=0.7))
    assert (plan.epsilon, plan.labels, [b.fits_now for b in plan.blocks]) == (0.7, ["ε", "δ"], [True, False])
    assert (plan.blocks[1].dimension, plan.blocks[1].shortfall) == ("ε", pytest.approx(0.2))
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ndataset: reviews\nblocks: [b0, b1]\nepsilon: 0.7\njob: {function: 'tests.service_jobs:spend_half'}\n")
    here = run_cli("submit", path, "--dry-run", env={"PRIVSCHED_DB": str(server.db)})
    there = run_cli("submit", path, "--dry-run", env={"PRIVSCHED_SERVER": server.url, "PRIVSCHED_TOKEN": server.tokens["alice"]})
    assert here.returncode == there.returncode == 3  # waits
    assert (
        here.stdout
        == there.stdout
        == (
            "pipeline p on reviews: demand ε=0.7 at δ=0\nε = 0.7 → 70 % of block b0: fits now\n"
            "ε = 0.7 → 70 % of block b1: does not fit now: ε short 0.2\n"
            "waits: budget: block b1 ε short 0.2 of the unlocked budget\n"
        )
    )
    assert dump_database(server.db) == before

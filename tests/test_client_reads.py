"""What the clients read for people and how a scheduler is configured: every block's
balances and a pipeline's demand per block read as (ε, δ) (``budget show``, ``status``),
and :class:`ServeOptions`, the one set of serve options that the command line, the client
and :func:`serve_options` take."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import privsched as ps
from privsched.budgets.curves import rdp_to_epsilon
from privsched.client import Client
from privsched.ledger import LedgerError
from privsched.ledger.models import PipelineRequest
from privsched.readouts import Readout
from privsched.service.serve import ServeOptions


@pytest.fixture
def client(tmp_db: Path) -> Client:
    client = ps.connect(tmp_db)
    client.create_dataset("stats", epsilon=1.0, delta=1e-6, accounting="basic")
    client.add_blocks("stats", ["d1", "d2"], unlocked=0.5)
    client.create_dataset("reviews", epsilon=10.0, delta=1e-7, accounting="rdp")
    client.add_blocks("reviews", ["r1"], unlocked=1.0)
    yield client
    client.close()


def test_basic_balances_are_the_blocks_own_epsilon_delta(client: Client):
    pid = client.ledger.submit(PipelineRequest("p", "stats", ["d1"], demand=np.array([0.25, 1e-7])))
    client.ledger.grant([pid])
    (stats,) = client.balances("stats")
    assert stats.dataset.name == "stats" and [row.block.key for row in stats.blocks] == ["d1", "d2"]
    d1 = stats.blocks[0]
    assert d1.allocated == Readout(0.25, 1e-7)
    assert d1.unlocked == Readout(pytest.approx(0.25), pytest.approx(0.5e-6 - 1e-7))
    assert d1.locked == Readout(0.5, 0.5e-6) and d1.consumed == Readout(0.0, 0.0)
    assert d1.remaining == Readout(pytest.approx(0.75), pytest.approx(1e-6 - 1e-7))


def test_an_rdp_balance_reads_as_the_epsilon_its_curve_guarantees_at_delta_g(client: Client):
    (reviews,) = client.balances("reviews")
    info, row = reviews.dataset, reviews.blocks[0]
    live = info.accounting.live(info.capacity)
    expected, _ = rdp_to_epsilon(row.block.unlocked[live], np.asarray(info.accounting.alphas)[live], info.delta)
    assert row.unlocked == Readout(pytest.approx(expected, rel=1e-12), info.delta)
    assert row.locked == Readout(0.0, info.delta)  # nothing locked: no live order is positive
    assert sorted(entry.dataset.name for entry in client.balances()) == ["reviews", "stats"]


def test_grants_read_a_pipelines_demand_per_block_and_nothing_consumed_before_it_ends(client: Client):
    pid = client.ledger.submit(PipelineRequest("p", "stats", ["d1", "d2"], demand=np.array([0.1, 0.0])))
    info, dataset, grants = client.grants(pid)
    assert (info.id, dataset.name) == (pid, "stats")
    assert [(g.key, g.demand, g.consumed) for g in grants] == [("d1", Readout(0.1, 0.0), None), ("d2", Readout(0.1, 0.0), None)]


def test_balances_of_an_unknown_dataset_are_refused(client: Client):
    with pytest.raises(LedgerError, match="nope"):
        client.balances("nope")


@given(st.integers(min_value=1, max_value=10**6))
def test_serve_options_read_a_tick_in_milliseconds_as_seconds(ms: int):
    assert ServeOptions.parse(tick=f"{ms}ms").tick == pytest.approx(ms / 1000)


def test_serve_options_read_durations_and_sizes_as_text_and_keep_numbers():
    options = ServeOptions.parse(policy="dpf-t", lifetime="2h", tick=0.5, memory="1GiB")
    assert (options.policy, options.lifetime, options.tick, options.memory) == ("dpf-t", 7200.0, 0.5, 2**30)
    assert options.policy_spec().policy is not None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tick": "soon"}, "invalid duration"),
        ({"memory": "lots"}, "invalid memory size"),
        ({"polcy": "fcfs"}, "unknown serve option 'polcy'"),
        ({"policy": "dpf-n"}, "n"),
        ({"policy": "nope"}, "unknown policy"),
        ({"tick": 0}, "duration"),
        ({"cpus": 0}, "CPUs"),
    ],
)
def test_bad_serve_options_are_refused_before_anything_starts(options, message):
    with pytest.raises(ValueError, match=message):
        ServeOptions.parse(**options).check()


def test_options_built_directly_are_checked_too():
    with pytest.raises(ValueError, match="tick must be a positive duration"):
        ServeOptions(tick=0).check()


def test_client_serve_takes_options_or_keywords_but_not_both(tmp_path: Path):
    with ps.connect(tmp_path / "one.db") as client:
        client.create_dataset("stats", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("stats", ["d1"])
        with pytest.raises(TypeError, match="not both"):
            client.serve(ServeOptions(), tick=0.1)
        summary = client.serve(ServeOptions(until_idle=True, tick=0.05, cpus=1, gpus=0, sandbox="none"))
    assert summary.ticks >= 1 and summary.pending == 0

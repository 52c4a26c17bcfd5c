"""Budgets in people's terms: each block's budget as shares of its capacity consumed,
allocated and left, which add up to 100 % on every row printed, and a demand as
"ε = … → … % of block K"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import privsched as ps
from privsched.ledger import Ledger, PipelineRequest
from privsched.readouts import block_shares, demand_share, demand_text, tenths
from tests.cli_inprocess import invoke
from tests.support.blockdata import block_files

fractions = st.lists(st.floats(0.0, 1.0), min_size=2, max_size=5).filter(lambda parts: sum(parts) > 1e-9)


@given(fractions)
def test_tenths_of_parts_sum_to_exactly_a_thousand(parts: list[float]):
    assert sum(tenths(tuple(p / sum(parts) for p in parts))) == 1000


@given(fractions)
def test_each_rounded_part_is_within_a_tenth_of_a_percent_of_its_value(parts: list[float]):
    total = sum(parts)
    for rounded, part in zip(tenths(tuple(p / total for p in parts)), parts):
        assert abs(rounded - 1000 * part / total) < 1 + 1e-9


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """An RDP dataset with three blocks: one with a pipeline's demand allocated, one with it
    consumed, one untouched; and a basic dataset with one block a third consumed."""
    path = tmp_path / "s.db"
    with ps.connect(path) as client:
        client.create_dataset("rdp", epsilon=3.0, delta=1e-6)
        client.add_blocks("rdp", block_files(tmp_path, ["a", "b", "c"]), unlocked=0.7)
        client.create_dataset("basic", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("basic", block_files(tmp_path, ["x"]), unlocked=1.0)
        curve = client.dataset("rdp").capacity * 0.137
    with Ledger(path) as ledger:
        held = ledger.submit(PipelineRequest("held", "rdp", ["a"], demand=curve))
        spent = ledger.submit(PipelineRequest("spent", "rdp", ["b"], demand=curve * 2))
        third = ledger.submit(PipelineRequest("third", "basic", ["x"], demand=np.array([1 / 3, 1e-7])))
        ledger.grant([held, spent, third])
        for done, demand in ((spent, curve * 2), (third, np.array([1 / 3, 1e-7]))):
            ledger.mark_running(done, {})
            ledger.complete(done, demand)
    return path


def rows(page: str) -> list[list[str]]:
    """The body rows of every table printed, as cells."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in page.splitlines() if line.startswith("│")]


def test_consumed_allocated_and_left_add_up_to_100_percent_on_every_row_printed(db: Path):
    done = invoke("budget", "show", db=db)
    assert done.code == 0, done.stderr
    printed = rows(done.stdout)
    assert len(printed) == 4
    for cells in printed:
        consumed, allocated, left = (float(cell.removesuffix(" %")) for cell in cells[2:5])
        assert round(consumed + allocated + left, 1) == 100.0, cells


def test_the_shares_printed_are_those_of_the_ledgers_vectors(db: Path):
    by_key = {cells[0]: cells[2:6] for cells in rows(invoke("budget", "show", db=db).stdout)}
    assert by_key["a"] == ["0.0 %", "13.7 %", "86.3 %", "56.3 %"]  # 0.7 unlocked, less 0.137 allocated
    assert by_key["b"][:3] == ["27.4 %", "0.0 %", "72.6 %"]
    assert by_key["c"] == ["0.0 %", "0.0 %", "100.0 %", "70.0 %"]
    assert by_key["x"][:3] == ["33.3 %", "0.0 %", "66.7 %"]


def test_a_blocks_shares_are_read_where_it_has_the_most_left_under_rdp(db: Path):
    with ps.connect(db) as client:
        dataset = client.dataset("rdp")
        block = next(b for b in client.blocks("rdp") if b.key == "b")
    shares = block_shares(block, dataset)
    live = dataset.capacity > 0
    assert shares.left == pytest.approx(np.max((block.remaining / np.where(live, dataset.capacity, 1))[live]))


def test_detail_shows_each_live_orders_budget(db: Path):
    done = invoke("budget", "show", "rdp", "--detail", db=db)
    with ps.connect(db) as client:
        dataset = client.dataset("rdp")
    live = [f"α={a:g}" for a, c in zip(dataset.accounting.alphas, dataset.capacity) if c > 0]
    orders = [cells[0] for cells in rows(done.stdout) if cells[0].startswith("α=")]
    assert orders == live * 3


def test_a_demand_reads_as_its_epsilon_and_its_share_of_the_block():
    assert demand_text(0.1, 0.011, "2026-11-08") == "ε = 0.1 → 1.1 % of block 2026-11-08"


def test_status_shows_each_demand_as_a_share_of_its_block(db: Path):
    with ps.connect(db) as client:
        info = client.status(1)
        share = demand_share(info.demands["a"], client.dataset("rdp"))
    assert share == pytest.approx(0.137)
    done = invoke("status", "1", db=db)
    assert "→ 14 % of block a" in done.stdout

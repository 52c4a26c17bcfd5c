"""Jobs read their blocks only through privsched: ``ctx.read(columns=..., as_=...)`` over
Parquet blocks (from a path or an open file) and the older ``.npz`` blocks; and a block whose
data changed since it was registered is never handed to a job."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from privsched import connect
from privsched.budgets import Accounting
from privsched.jobs.context import BlockAccessError, BlockGrant, JobContext
from privsched.jobs.records import read_block_files, read_table
from tests.conftest import REPO
from tests.support.tables import event_rows, write_csv


def parquet_block(path: Path, amounts: list[float]) -> str:
    pq.write_table(pa.table({"amount": amounts, "country": ["A"] * len(amounts)}), str(path))
    return str(path)


def context(blocks: dict[str, str]) -> JobContext:
    grants = {key: BlockGrant(key, location, np.array([1.0, 1e-9])) for key, location in blocks.items()}
    return JobContext(1, "job", "events", Accounting.basic(), 1e-9, grants)


def test_a_parquet_block_reads_from_a_path_or_an_open_file(tmp_path: Path):
    path = parquet_block(tmp_path / "b.parquet", [1.0, 2.0, 3.0])
    with open(path, "rb") as handle:
        from_file = read_block_files([handle])
    from_path = read_block_files([path])
    np.testing.assert_array_equal(from_path["amount"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(from_file["amount"], from_path["amount"])
    assert list(from_file["country"]) == ["A", "A", "A"]


def test_npz_blocks_keep_working_from_a_path_or_an_open_file(tmp_path: Path):
    np.savez(tmp_path / "b.npz", rating=np.array([1.0, 4.0]), tokens=np.ones((2, 3)), vocab_size=np.asarray(9))
    with open(tmp_path / "b.npz", "rb") as handle:
        records = read_block_files([io.BytesIO(handle.read())])
    assert records["tokens"].shape == (2, 3) and int(records["vocab_size"]) == 9
    table = read_table([tmp_path / "b.npz"])
    assert table.column_names == ["rating", "tokens"] and table.column("tokens").type.list_size == 3


def test_ctx_read_gives_the_granted_blocks_in_order_as_arrow_numpy_or_a_clear_error(tmp_path: Path):
    ctx = context({"a": parquet_block(tmp_path / "a.parquet", [1.0, 2.0]), "b": parquet_block(tmp_path / "b.parquet", [5.0])})
    table = ctx.read(columns=["amount"])
    assert isinstance(table, pa.Table) and table.column_names == ["amount"]
    assert table.column("amount").to_pylist() == [1.0, 2.0, 5.0]
    np.testing.assert_array_equal(ctx.read(as_="numpy", keys=["b"])["amount"], [5.0])
    with pytest.raises(ValueError, match="as_ must be"):
        ctx.read(as_="polars")


def test_ctx_read_as_pandas_gives_a_frame_or_says_pandas_is_missing(tmp_path: Path):
    ctx = context({"a": parquet_block(tmp_path / "a.parquet", [1.0, 2.0])})
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="needs pandas"):
            ctx.read(as_="pandas")
    else:
        assert list(ctx.read(as_="pandas")["amount"]) == [1.0, 2.0]


def test_ctx_read_refuses_a_block_outside_the_grant_before_reading_anything(tmp_path: Path):
    ctx = context({"a": parquet_block(tmp_path / "a.parquet", [1.0])})
    with pytest.raises(BlockAccessError, match="not granted block 'z'"):
        ctx.read(keys=["a", "z"])
    assert not ctx.touched_data


def test_ctx_read_names_an_unknown_column(tmp_path: Path):
    ctx = context({"a": parquet_block(tmp_path / "a.parquet", [1.0])})
    with pytest.raises(ValueError, match="price"):
        ctx.read(columns=["price"])


@pytest.fixture
def imported(tmp_path: Path) -> Path:
    db = tmp_path / "p.db"
    with connect(db) as client:
        client.create_dataset("events", epsilon=10, delta=1e-7)
        client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(3, 50)), by="day", bounds={"amount": (0, 250)}, unlocked=1)
    return db


def test_a_confined_user_job_reads_imported_blocks_through_its_context(imported: Path):
    with connect(imported) as client:
        run = client.submit(
            {
                "name": "reader",
                "dataset": "events",
                "blocks": {"last": 2},
                "epsilon": 0.5,
                "job": {"function": "tests.import_jobs:reads_amounts", "pythonpath": [str(REPO)]},
            }
        )
        client.run_until_idle()
        assert run.status == "completed", run.message
        assert run.result is not None and run.result.metrics["records"] == 100


def test_a_statistic_runs_on_imported_blocks_with_the_declared_bounds(imported: Path):
    with connect(imported) as client:
        spec = {"name": "mean", "dataset": "events", "blocks": {"last": 3}, "epsilon": 5.0}
        run = client.submit({**spec, "job": {"kind": "statistic", "params": {"query": "mean", "column": "amount"}}})
        client.run_until_idle()
        assert run.status == "completed", run.message
        assert run.result is not None and 0 < run.result.metrics["value"] < 250


def test_a_block_whose_file_changed_is_not_handed_to_a_job_and_costs_nothing(imported: Path):
    with connect(imported) as client:
        block = client.blocks("events")[-1]
        Path(block.location).chmod(0o600)
        pq.write_table(pa.table({"day": ["2026-10-03"], "amount": [1e6], "country": ["A"]}), block.location)  # rewritten in place
        spec = {"name": "count", "dataset": "events", "blocks": [block.key], "epsilon": 1.0}
        run = client.submit({**spec, "job": {"kind": "statistic", "params": {"query": "count"}}})
        client.run_until_idle()
        assert run.status == "failed"
        assert f"block '{block.key}': its data changed since it was registered" in (run.message or "")
        assert run.consumed is not None and not np.any(run.consumed[block.key])

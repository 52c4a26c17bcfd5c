"""The job context: block scoping, spent-budget reporting, and its JSON round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from privsched.budgets import Accounting, Composed, EpsilonDelta, Laplace, SubsampledGaussian
from privsched.jobs.context import BlockAccessError, BlockGrant, JobContext


def make_context(accounting: Accounting, grants: dict[str, list[float]]) -> JobContext:
    return JobContext(
        pipeline_id=7,
        name="train",
        dataset="reviews",
        accounting=accounting,
        delta=1e-9,
        blocks={key: BlockGrant(key, f"/data/{key}.npz", np.asarray(g)) for key, g in grants.items()},
        params={"kind": "dpsgd"},
    )


def test_a_granted_block_opened_in_process_is_read_only_and_marks_data_touched(tmp_path: Path):
    ctx = make_context(Accounting.basic(), {"d1": [1.0, 1e-9]})
    ctx.blocks["d1"].location = str(tmp_path / "d1.npz")
    (tmp_path / "d1.npz").write_bytes(b"records")
    assert not ctx.touched_data
    with ctx.open_block("d1") as stream:
        assert stream.read() == b"records" and not stream.writable()
    assert ctx.touched_data


def test_a_folder_block_is_read_as_its_files_by_name_within_the_block(tmp_path: Path):
    ctx = make_context(Accounting.basic(), {"d1": [1.0, 1e-9]})
    ctx.blocks["d1"].location = str(tmp_path)
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "b.parquet").write_bytes(b"b")
    (tmp_path / "a.parquet").write_bytes(b"a")
    files = ctx.block_files("d1")
    assert {name: stream.read() for name, stream in files.items()} == {"a.parquet": b"a", "part/b.parquet": b"b"}
    with pytest.raises(ValueError, match="holds 2 files"):
        ctx.open_block("d1")


def test_block_outside_the_grant_is_refused_without_touching_data():
    ctx = make_context(Accounting.basic(), {"d1": [1.0, 1e-9]})
    with pytest.raises(BlockAccessError, match="not granted block 'd2'"):
        ctx.open_block("d2")
    assert not ctx.touched_data


def test_budget_is_the_elementwise_minimum_over_blocks():
    ctx = make_context(Accounting.rdp([2.0, 4.0]), {"a": [1.0, 3.0], "b": [2.0, 1.0]})
    np.testing.assert_allclose(ctx.budget, [1.0, 1.0])


def test_report_spent_accepts_at_most_the_grant_in_every_dimension():
    ctx = make_context(Accounting.rdp([2.0, 4.0]), {"a": [1.0, 3.0]})
    ctx.report_spent([1.0, 2.5])
    np.testing.assert_allclose(ctx.spent, [1.0, 2.5])
    with pytest.raises(ValueError, match="exceeds the grant"):
        ctx.report_spent([0.5, 3.5])


@pytest.mark.parametrize("bad", [[1.0], [float("nan"), 0.0], [-0.1, 0.0]])
def test_report_spent_rejects_malformed_vectors(bad):
    ctx = make_context(Accounting.basic(), {"a": [1.0, 1e-6]})
    with pytest.raises(ValueError, match="finite non-negative"):
        ctx.report_spent(bad)
    assert ctx.spent is None


def test_json_round_trip_preserves_grant_and_scope():
    ctx = make_context(Accounting.rdp([1.5, 3.0]), {"a": [0.1, 0.2], "b": [0.3, 0.4]})
    copy = JobContext.from_json(ctx.to_json())
    assert copy.accounting == ctx.accounting
    assert copy.block_keys == ["a", "b"]
    np.testing.assert_allclose(copy.blocks["b"].grant, [0.3, 0.4])
    assert copy.params == {"kind": "dpsgd"}
    with pytest.raises(BlockAccessError):
        copy.open_block("c")


@pytest.mark.parametrize(
    "plan",
    [
        None,
        Laplace(scale=10.0),
        Composed(parts=[SubsampledGaussian(sample_rate=0.05, noise_multiplier=1.3, steps=40), EpsilonDelta(epsilon=0.1)]),
    ],
    ids=["none", "laplace", "dpsgd"],
)
def test_json_round_trip_preserves_the_typed_plan_and_what_it_was_planned_with(plan):
    ctx = make_context(Accounting.basic(), {"a": [0.5, 1e-9]})
    ctx.plan, ctx.epsilon, ctx.max_runtime = plan, 0.5, 90.0
    copy = JobContext.from_json(ctx.to_json())
    assert copy.plan == plan and type(copy.plan) is type(plan)
    assert (copy.epsilon, copy.delta, copy.max_runtime) == (0.5, 1e-9, 90.0)

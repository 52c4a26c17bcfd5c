"""Built-in DP-SGD on a table: features scaled with public bounds, categories one-hot from
declarations, a classification or regression head, layer-list models; every size of the
model comes from the job, never from the records, and no record can fail a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from privsched.budgets import Accounting, demand_vector, leq
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.runner import JobResult
from privsched.service.preflight import input_problem
from privsched.trainers.builtin import plan_mechanism, run_builtin
from privsched.trainers.dpsgd import expected_batch_size, initial_model, shape_only
from privsched.trainers.plans import parse_job
from privsched.trainers.tabular import codes, encode, resolve_schema, scaled

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-6
CLICKS = {
    "kind": "dpsgd",
    "model": "mlp",
    "sample_rate": 0.1,
    "epochs": 1,
    "lr": 0.05,
    "optimizer": "adam",
    "features": ["amount", "country"],
    "label": "clicked",
    "bounds": {"amount": [0, 200]},
    "categories": {"country": ["fr", "de", "us"]},
    "hidden": [8],
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def events(n: int, seed: int, **override) -> dict[str, np.ndarray]:
    """A click table: a click is likelier above 100 and outside "us"."""
    rng = np.random.default_rng(seed)
    amount = rng.uniform(0, 200, n)
    country = rng.choice(np.array(["fr", "de", "us"]), n)
    clicked = ((amount > 100) ^ (country == "us")).astype(np.int64)
    return {"amount": amount, "country": country, "clicked": clicked, "spend": amount * 0.5, **override}


def write(folder: Path, tables: list[dict[str, np.ndarray]]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, table in enumerate(tables):
        path = folder / f"day-{i}.npz"
        np.savez(path, **table)
        paths.append(path)
    return paths


def context(paths: list[Path], job: dict, workdir: Path) -> JobContext:
    accounting = Accounting.rdp()
    mechanism = plan_mechanism(job, 2.0, DELTA, accounting)
    grant = demand_vector(mechanism, accounting)
    blocks = {p.stem: BlockGrant(p.stem, str(p), grant) for p in paths}
    return JobContext(1, "job", "events", accounting, DELTA, blocks, workdir=workdir, params=job, plan=mechanism, epsilon=2.0)


def test_a_tabular_mlp_trains_within_its_grant_and_saves_its_model(tmp_path):
    paths = write(tmp_path / "blocks", [events(200, 1), events(200, 2)])
    ctx = context(paths, CLICKS, tmp_path / "work")
    run_builtin(ctx)
    assert np.all(leq(ctx.spent, ctx.budget))
    assert ctx.metrics["model"] == "mlp" and ctx.metrics["grad_sample_mode"] == "ghost"
    state = torch.load(tmp_path / "work" / "model.pt")
    assert state["1.weight"].shape == (8, 1 + 4)  # one numeric feature, three countries and "unknown"
    assert state["3.weight"].shape == (2, 8)  # binary head


def test_the_models_shape_comes_from_the_job_whatever_the_records_hold(tmp_path):
    few = write(tmp_path / "a", [events(50, 1, country=np.array(["fr"] * 50))])
    many = write(tmp_path / "b", [events(300, 2, country=np.array(["xx", "yy", "us"] * 100))])
    shapes = []
    for paths, folder in ((few, "wa"), (many, "wb")):
        run_builtin(ctx := context(paths, CLICKS, tmp_path / folder))
        state = torch.load(ctx.workdir / "model.pt")
        shapes.append({k: tuple(v.shape) for k, v in state.items()})
    assert shapes[0] == shapes[1]


def test_a_regression_head_trains_on_a_bounded_label(tmp_path):
    job = {**CLICKS, "label": "spend", "task": "regression", "bounds": {"amount": [0, 200], "spend": [0, 100]}}
    paths = write(tmp_path / "blocks", [events(200, 3)])
    run_builtin(ctx := context(paths, job, tmp_path / "work"))
    assert torch.load(ctx.workdir / "model.pt")["3.weight"].shape == (1, 8)
    assert 0.0 <= ctx.metrics["heldout_accuracy"] <= 1.0


def test_a_layer_list_model_trains_and_is_checked_by_opacus(tmp_path):
    layers = [{"type": "linear", "out": 8}, {"type": "layernorm"}, {"type": "gelu"}, {"type": "dropout", "p": 0.1}]
    job = {**CLICKS, "model": {"layers": layers}}
    paths = write(tmp_path / "blocks", [events(200, 4)])
    run_builtin(ctx := context(paths, job, tmp_path / "work"))
    assert ctx.metrics["model"] == "layers" and ctx.metrics["grad_sample_mode"] == "opacus-ghost"
    assert np.all(leq(ctx.spent, ctx.budget))


def test_a_layer_list_of_only_linear_layers_trains_with_single_pass_ghost_clipping(tmp_path):
    job = {**CLICKS, "model": {"layers": [{"type": "linear", "out": 6}, {"type": "relu"}]}}
    paths = write(tmp_path / "blocks", [events(120, 5)])
    run_builtin(ctx := context(paths, job, tmp_path / "work"))
    assert ctx.metrics["grad_sample_mode"] == "ghost"


def test_a_convolution_over_tokens_with_pooling_builds_and_one_without_is_refused_at_submit():
    text = {"kind": "dpsgd", "sample_rate": 0.1, "epochs": 1, "lr": 0.1, "vocab_size": 50}
    pooled = [{"type": "embedding", "dim": 8}, {"type": "conv1d", "out": 4}, {"type": "groupnorm", "groups": 2}, {"type": "maxpool"}]
    model = initial_model(parse_job({**text, "model": {"layers": pooled}}), shape_only(parse_job({**text, "model": {"layers": pooled}})))
    assert model(torch.randint(0, 50, (3, 20))).shape == (3, 2)
    flat = [{"type": "embedding", "dim": 8}, {"type": "conv1d", "out": 4}, {"type": "flatten"}]
    with pytest.raises(ValueError, match="do not fit|sequence length"):
        plan_mechanism({**text, "model": {"layers": flat}}, 1.0, DELTA, Accounting.rdp())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": {"layers": [{"type": "batchnorm1d"}]}}, "batch norm"),
        ({"classes": [1]}, "two distinct classes"),
        ({"model": "lstm"}, "reads token ids"),
        ({"label": None}, "names its 'label'"),
        ({"features": ["amount", "amount"]}, "listed twice"),
        ({"bounds": {"amount": [5, 1]}}, "lo < hi"),
        ({"categories": {"country": []}}, "non-empty"),
        ({"model": {"layers": [{"type": "linear", "out": 4}, {"type": "groupnorm", "groups": 3}]}}, "groupnorm"),
        ({"task": "regression", "classes": [0, 1]}, "bounds, not classes"),
    ],
)
def test_bad_tabular_jobs_are_refused_at_submit_with_one_line(change, message):
    with pytest.raises(ValueError) as info:
        plan_mechanism({**CLICKS, **change}, 1.0, DELTA, Accounting.rdp())
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"features": ["amount", "colour"], "categories": {"colour": ["red"]}}, "no column 'colour'"),
        ({"label": "converted"}, "no column 'converted'"),
        ({"categories": {}, "bounds": {"amount": [0, 200], "country": [0, 1]}}, "'country' holds text: declare its categories"),
    ],
)
def test_inputs_a_block_cannot_give_fail_the_preflight_check_before_any_data_is_read(tmp_path, change, message):
    paths = write(tmp_path, [events(20, 6)])
    problem = input_problem({"kind": "dpsgd", "params": {**CLICKS, **change}}, {"b": paths[0].name}, tmp_path)
    assert problem is not None and message in problem


def test_a_feature_without_declared_bounds_or_categories_fails_before_any_block_is_opened(tmp_path):
    job = {**CLICKS, "bounds": {}}
    ctx = context([tmp_path / "missing.npz"], {**CLICKS}, tmp_path / "work")
    ctx.params = job
    with pytest.raises(ValueError, match="neither declared bounds"):
        run_builtin(ctx)
    assert not ctx.touched_data


def test_the_datasets_declared_bounds_and_categories_serve_a_job_that_declares_none():
    job = parse_job({**CLICKS, "bounds": {}, "categories": {}})
    schema = resolve_schema(job, {"amount": {"bounds": [0, 50]}, "country": {"categories": ["fr", "us"]}})
    assert schema.numeric == {"amount": (0.0, 50.0)} and schema.categorical == {"country": ["fr", "us"]}


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=50))
def test_numeric_features_are_clamped_to_their_bounds_and_scaled_to_the_unit_interval(values):
    x = scaled(np.array(values), (-3.0, 5.0))
    assert np.all((0 <= x) & (x <= 1))
    assert np.all(x[np.isnan(values)] == 0.0)


def test_unknown_categories_get_their_own_code_and_numbers_match_declared_integers():
    assert codes(np.array(["fr", "it", "us"]), ["fr", "de", "us"]).tolist() == [0, 3, 2]
    assert codes(np.array([1.0, 2.0, 7.0]), [2, 1]).tolist() == [1, 0, 2]


def test_a_record_whose_label_is_not_a_class_is_dropped_and_no_other():
    job = parse_job(CLICKS)
    table = events(10, 7)
    table["clicked"] = np.array([0, 1, 2, 1, -1, 0, 1, 0, 1, 0])
    inputs, labels = encode(table, resolve_schema(job))
    assert len(labels) == 8 and set(labels.tolist()) <= {0, 1}


def test_the_expected_batch_size_is_the_jobs_or_comes_from_the_public_row_count_not_the_training_records():
    job = parse_job(CLICKS)
    assert expected_batch_size(job, 1000) == round(0.1 * 0.8 * 1000)
    assert expected_batch_size(parse_job({**CLICKS, "expected_batch_size": 17}), 1000) == 17


def run_supervised(tmp_path: Path, job: dict, paths: list[Path]) -> JobResult:
    """The job run by ``python -m privsched.jobs.runner`` in its own process, as the scheduler runs it."""
    ctx = context(paths, job, tmp_path / "work")
    document = {**json.loads(ctx.to_json()), "job": {"kind": "dpsgd"}}
    (tmp_path / "context.json").write_text(json.dumps(document))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "privsched.jobs.runner", "context.json", "result.json", "--sandbox", "none"]
    assert subprocess.run(command, cwd=tmp_path, env=env, timeout=600).returncode in (0, 1)
    return JobResult.from_json((tmp_path / "result.json").read_text())


def test_a_tabular_job_given_malformed_records_ends_completed(tmp_path):
    table = events(150, 8)
    table["clicked"] = table["clicked"].copy()
    table["clicked"][3] = 9  # a label out of range
    table["amount"][4], table["amount"][5] = np.nan, 1e300  # no number, out of bounds
    table["country"][6] = "atlantis"  # not a declared category
    result = run_supervised(tmp_path, CLICKS, write(tmp_path / "blocks", [table]))
    assert result.completed, result.message


def test_a_text_job_given_a_token_and_a_label_out_of_range_ends_completed(tmp_path):
    from workloads.reviews import write_blocks

    path = write_blocks(tmp_path / "reviews", days=1, per_day=120, seed=1)[0]
    with np.load(path) as data:
        table = {name: data[name].copy() for name in data.files}
    table["tokens"][0, 0] = 10**6  # beyond the declared vocabulary
    table["tokens"][1, 0] = -5
    table["sentiment"][2] = 7  # not a class
    np.savez(path, **table)
    job = {"kind": "dpsgd", "model": "text", "sample_rate": 0.2, "epochs": 1, "lr": 0.1}
    result = run_supervised(tmp_path, job, [path])
    assert result.completed, result.message


def test_a_text_job_needs_a_declared_vocabulary_before_its_data_is_read(tmp_path):
    np.savez(tmp_path / "b.npz", tokens=np.ones((5, 3), dtype=np.int64), sentiment=np.zeros(5, dtype=np.int64))
    job = {"kind": "dpsgd", "params": {"model": "text", "sample_rate": 0.2, "epochs": 1, "lr": 0.1}}
    assert "vocab_size" in (input_problem(job, {"b": "b.npz"}, tmp_path) or "")
    job["params"]["vocab_size"] = 10
    assert input_problem(job, {"b": "b.npz"}, tmp_path) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": {"layers": [{"type": "linear", "out": 4}, {"type": "BatchNorm1d"}]}}, "batch norm"),
        ({"classes": ["yes"]}, "two distinct classes"),
    ],
)
def test_the_command_line_refuses_a_bad_tabular_job_at_submit_with_one_line_and_writes_nothing(tmp_path, dump_db, change, message):
    from tests.cli_inprocess import invoke, ledger_with_one_block

    db = ledger_with_one_block(tmp_path)
    before = dump_db(db)
    spec = tmp_path / "p.json"
    job = {"kind": "dpsgd", "params": {**{k: v for k, v in CLICKS.items() if k != "kind"}, **change}}
    spec.write_text(json.dumps({"name": "p", "dataset": "events", "blocks": ["d1"], "epsilon": 1.0, "delta": 1e-8, "job": job}))
    refused = invoke("submit", spec, db=db)
    assert refused.code == 1 and message in refused.stderr and refused.stderr.count("\n") == 1
    assert dump_db(db) == before


def test_opacus_module_validator_refuses_a_model_with_batch_norm_in_one_line():
    from privsched.trainers.networks import check_private

    with pytest.raises(ValueError) as info:
        check_private(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)))
    assert "Opacus cannot train this model privately" in str(info.value) and "\n" not in str(info.value)


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.one_of(st.integers(), st.lists(st.floats(allow_nan=True), max_size=3)), max_size=2),
)


@given(
    st.dictionaries(st.sampled_from(["features", "label", "bounds", "categories", "classes", "task", "hidden", "model", "text"]), HOSTILE)
)
def test_any_tabular_parameters_parse_or_are_refused_with_one_line(params):
    try:
        parse_job({**CLICKS, **params})
    except ValueError as exc:
        assert "\n" not in str(exc)

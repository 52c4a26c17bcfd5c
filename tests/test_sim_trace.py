"""Trace files: the format, its validation (one error naming the entry), and save/load."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from privsched.budgets import Accounting, gaussian_curve, gaussian_sigma, laplace_curve
from privsched.simulation.trace import TraceError, load_trace, parse_trace, save_trace

BASIC = {
    "accounting": "basic",
    "blocks": [
        {"id": "b0", "arrival": 0.0, "epsilon": 1.0, "delta": 1e-6},
        {"id": "b1", "arrival": 10.0, "epsilon": 1.0, "delta": 1e-6},
        {"id": "b2", "arrival": 20.0, "epsilon": 2.0, "delta": 1e-6},
    ],
    "pipelines": [
        {"id": "p0", "arrival": 1.0, "blocks": ["b0"], "epsilon": 0.1, "timeout": 30, "class": "mice"},
        {"id": "p1", "arrival": 25.0, "blocks": {"last": 2}, "epsilon": 0.2, "demands": {"b2": 0.5}},
    ],
}


def rejected(mutate) -> str:
    data = copy.deepcopy(BASIC)
    mutate(data)
    with pytest.raises(TraceError) as error:
        parse_trace(data)
    return str(error.value)


def test_pipelines_compile_to_edges_with_per_block_demands():
    instance = parse_trace(BASIC).instance
    assert list(instance.edge_start) == [0, 1, 3]
    assert list(instance.block_ids[instance.edge_block]) == ["b0", "b1", "b2"]
    assert instance.edge_demand[:, 0].tolist() == [0.1, 0.2, 0.5]
    assert instance.timeout.tolist() == [30.0, np.inf]
    assert instance.klass.tolist() == ["mice", ""]


def test_last_k_selects_the_most_recent_blocks_existing_at_arrival():
    data = copy.deepcopy(BASIC)
    data["pipelines"] = [{"id": "p", "arrival": 15.0, "blocks": {"last": 5}, "epsilon": 0.1}]
    instance = parse_trace(data).instance
    assert list(instance.block_ids[instance.edge_block]) == ["b0", "b1"]


def test_unknown_block_is_named():
    message = rejected(lambda d: d["pipelines"][0].update(blocks=["b9"]))
    assert "pipelines[0] 'p0'" in message and "'b9'" in message


def test_negative_epsilon_is_named():
    message = rejected(lambda d: d["pipelines"][1].update(epsilon=-0.5))
    assert "pipelines[1] 'p1'" in message and "epsilon" in message


def test_pipeline_arriving_before_its_block_is_rejected():
    message = rejected(lambda d: d["pipelines"][0].update(blocks=["b2"]))
    assert "'p0'" in message and "before its block 'b2'" in message


def test_pipeline_arriving_before_any_block_is_rejected():
    message = rejected(lambda d: d["pipelines"][0].update(arrival=-1.0, blocks={"last": 1}))
    assert "before any block exists" in message


def test_unknown_mechanism_is_named():
    message = rejected(lambda d: d["pipelines"][0].update(mechanism="cauchy"))
    assert "'p0'" in message and "unknown mechanism 'cauchy'" in message


def test_duplicate_ids_are_rejected():
    assert "duplicate block id" in rejected(lambda d: d["blocks"][1].update(id="b0"))
    assert "duplicate pipeline id" in rejected(lambda d: d["pipelines"][1].update(id="p0"))


def test_mechanism_needing_rdp_is_rejected_under_basic():
    message = rejected(lambda d: d["pipelines"][0].update(mechanism={"kind": "gaussian", "sigma": 2.0}))
    assert "'p0'" in message and "rdp" in message


def test_malformed_json_is_one_clear_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"accounting": "basic", "blocks": [')
    with pytest.raises(TraceError, match=r"invalid JSON at line 1, column 36"):
        load_trace(path)


def test_rdp_demands_follow_the_named_mechanism():
    data = {
        "accounting": "rdp",
        "alphas": [2.0, 8.0, 32.0],
        "blocks": [{"id": "b", "epsilon": 1.0, "delta": 1e-6}],
        "pipelines": [
            {"id": "g", "arrival": 0, "blocks": ["b"], "epsilon": 0.5, "delta": 1e-9},
            {"id": "l", "arrival": 0, "blocks": ["b"], "epsilon": 0.5, "mechanism": "laplace"},
            {"id": "c", "arrival": 0, "blocks": ["b"], "curve": [0.1, 0.2, 0.3]},
            {"id": "m", "arrival": 0, "blocks": ["b"], "mechanism": {"kind": "gaussian", "sigma": 3.0}},
        ],
    }
    demand = parse_trace(data).instance.edge_demand
    alphas = Accounting.rdp(data["alphas"]).alphas
    np.testing.assert_allclose(demand[0], gaussian_curve(gaussian_sigma(0.5, 1e-9), alphas))
    np.testing.assert_allclose(demand[1], laplace_curve(2.0, alphas))
    np.testing.assert_allclose(demand[2], [0.1, 0.2, 0.3])
    np.testing.assert_allclose(demand[3], gaussian_curve(3.0, alphas))


def test_save_then_load_round_trips(tmp_path):
    path = tmp_path / "trace.json"
    save_trace(parse_trace(BASIC), path)
    again = load_trace(path)
    assert again.to_dict() == parse_trace(BASIC).to_dict()
    assert json.loads(path.read_text())["pipelines"][0]["class"] == "mice"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]

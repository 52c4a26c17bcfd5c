"""Specification and trace files are read strictly and within bounds: every bad file is one
line of error, found without blocking, expanding or recursing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from privsched.budgets.mechanisms import parse_mechanism
from privsched.spec import (
    MAX_DURATION,
    MAX_MEMORY,
    MAX_SPEC_BYTES,
    PipelineSpec,
    SpecError,
    load_spec,
    parse_duration,
    parse_memory,
)
from privsched.simulation.trace import TraceError, load_trace, parse_trace
from privsched.trainers.plans import parse_job

from .conftest import REPO

BASE = {"name": "p", "dataset": "d", "blocks": ["b"], "epsilon": 0.5, "job": {"function": "m:f"}}
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8)
)


def one_line_error(call, error=SpecError) -> str:
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and message
    return message


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    outcome: list[str] = []
    reader = threading.Thread(target=lambda: outcome.append(one_line_error(lambda: load_spec(fifo))), daemon=True)
    reader.start()
    reader.join(60)  # a blocked open would never return; the join only keeps a regression from hanging the suite
    if reader.is_alive():  # unblock the reader, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO blocked")
    assert "not a regular file" in outcome[0]


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "."])
def test_devices_and_folders_are_not_specifications(path):
    assert "not a regular file" in one_line_error(lambda: load_spec(path))


def test_a_symlink_loop_is_one_line(tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    assert "cannot read" in one_line_error(lambda: load_spec(tmp_path / "a.yaml"))


def test_a_specification_over_one_mebibyte_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: p\n" + "#" * MAX_SPEC_BYTES)
    assert "limit" in one_line_error(lambda: load_spec(big))


def test_yaml_aliases_are_refused(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 1024
    assert "aliases" in one_line_error(lambda: load_spec(bomb))


@pytest.mark.parametrize(
    "suffix, text",
    [
        (".yaml", "name: p\nname: q\n"),
        (".json", '{"name": "p", "name": "q"}'),
        (".yaml", "job: {function: 'm:f', function: 'm:g'}\n"),
    ],
)
def test_duplicate_keys_are_refused(tmp_path, suffix, text):
    path = tmp_path / f"dup{suffix}"
    path.write_text(text)
    assert "duplicate key" in one_line_error(lambda: load_spec(path))


@pytest.mark.parametrize(
    "suffix, text",
    [
        (".yaml", "name: " + "[" * 1000 + "]" * 1000 + "\n"),
        (".json", '{"name": ' + "[" * 1000 + "]" * 1000 + "}"),
        (".json", '{"name": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ],
)
def test_deep_nesting_is_refused(tmp_path, suffix, text):
    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    assert "levels deep" in one_line_error(lambda: load_spec(path))


def test_deep_nesting_given_as_data_is_refused():
    deep: dict = {"function": "m:f"}
    for _ in range(1000):
        deep = {"params": deep}
    assert "levels deep" in one_line_error(lambda: PipelineSpec.parse({**BASE, "job": deep}))
    mechanism: dict = {"kind": "explicit", "values": [1.0]}
    for _ in range(1000):
        mechanism = {"kind": "composed", "parts": [mechanism]}
    assert "invalid mechanism" in one_line_error(lambda: parse_mechanism(mechanism), ValueError)


@pytest.mark.parametrize(
    "field, value, bound",
    [
        ("epsilon", True, "number"),
        ("epsilon", 5e-324, "[1e-06, 1e+06]"),
        ("epsilon", float("inf"), "finite"),
        ("delta", 1e-320, "1e-300"),
        ("timeout", True, "duration"),
        ("timeout", 10**400, "10 years"),
        ("max_runtime", "99999999999d", "3.1536e+08]"),
        ("weight", float("nan"), "finite"),
        ("resources", {"memory": 10**400}, str(MAX_MEMORY)),
        ("resources", {"memory": True}, "number"),
        ("resources", {"cpus": 1e-9}, "[0.01, 4096]"),
        ("resources", {"cpus": float("nan")}, "finite"),
        ("resources", {"gpus": 10**30}, "[0, 1024]"),
        ("resources", {"gpus": True}, "number"),
        ("blocks", {"last": 10**400}, "[1, 1000000]"),
    ],
)
def test_numbers_out_of_bounds_name_the_bound(field, value, bound):
    assert bound in one_line_error(lambda: PipelineSpec.parse({**BASE, field: value}))


@pytest.mark.parametrize(
    "mechanism, bound",
    [
        ({"kind": "gaussian", "sigma": 1e-300}, "[1e-06, 1e+12]"),
        ({"kind": "gaussian", "sigma": 1.0, "sensitivity": 1e200}, "[1e-09, 1e+06]"),
        ({"kind": "laplace", "scale": True}, "number"),
        ({"kind": "subsampled_gaussian", "sample_rate": 0.1, "noise_multiplier": 1.0, "steps": 10**20}, "10000000"),
        ({"kind": "explicit", "values": [float("inf")]}, "finite"),
    ],
)
def test_mechanism_numbers_out_of_bounds_name_the_bound(mechanism, bound):
    assert bound in one_line_error(lambda: parse_mechanism(mechanism), ValueError)


@pytest.mark.parametrize(
    "params, bound",
    [
        ({"epochs": 1e300}, "10000"),
        ({"epochs": float("inf")}, "finite"),
        ({"epochs": 5, "sample_rate": 1e-9}, "noisy steps"),
        ({"seed": 10**30}, "9223372036854775807"),
    ],
)
def test_training_plans_that_could_never_be_calibrated_are_refused(params, bound):
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": 0.01, "epochs": 1, "lr": 0.1, **params}
    assert bound in one_line_error(lambda: parse_job(job), ValueError)


@given(st.one_of(st.integers(), st.floats(), st.booleans(), st.text(max_size=30)))
def test_durations_parse_within_bounds_or_fail_with_a_value_error(value):
    try:
        seconds = parse_duration(value)
    except ValueError:
        return
    assert 0 < seconds <= MAX_DURATION and not isinstance(value, bool)


@given(st.one_of(st.integers(), st.floats(), st.booleans(), st.text(max_size=30)))
def test_memory_sizes_parse_within_bounds_or_fail_with_a_value_error(value):
    try:
        size = parse_memory(value)
    except ValueError:
        return
    assert 0 <= size <= MAX_MEMORY and isinstance(size, int) and not isinstance(value, bool)


def test_traces_are_read_strictly(tmp_path):
    trace = {
        "accounting": "basic",
        "blocks": [{"id": "b", "epsilon": 1.0}],
        "pipelines": [{"id": "p", "arrival": 0.0, "blocks": ["b"], "epsilon": 0.1}],
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace)[:-1] + ', "accounting": "rdp"}')
    assert "duplicate key" in one_line_error(lambda: load_trace(path), TraceError)
    path.write_text(json.dumps(trace).replace("0.1", "NaN"))
    assert "not a number" in one_line_error(lambda: load_trace(path), TraceError)
    os.mkfifo(tmp_path / "fifo.json")
    assert "not a regular file" in one_line_error(lambda: load_trace(tmp_path / "fifo.json"), TraceError)
    for bad, bound in (
        ({"epsilon": True}, "number"),
        ({"weight": 1e300}, "1e+06"),
        ({"timeout": 0}, "0.001"),
        ({"class": "\x1b[2J"}, "control"),
    ):
        entry = {**trace["pipelines"][0], **bad}
        assert bound in one_line_error(lambda: parse_trace({**trace, "pipelines": [entry]}), TraceError)
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    assert "levels deep" in one_line_error(lambda: parse_trace({**trace, "alphas": deep}), TraceError)


def test_the_stored_size_of_a_pipeline_is_bounded(tmp_path):
    import numpy as np

    from privsched.ledger import Ledger, LedgerError, PipelineRequest

    with Ledger(tmp_path / "p.db", create=True) as ledger:
        ledger.create_dataset("d", 1.0, 1e-6, accounting="basic")
        ledger.add_blocks("d", ["b"])
        huge = {"params": ["x" * 1000] * 2000}
        request = PipelineRequest("p", "d", ["b"], demand=np.array([0.1, 0.0]), job=huge)
        assert "byte limit" in one_line_error(lambda: ledger.submit(request), LedgerError)
        deep: list = []
        for _ in range(100_000):
            deep = [deep]
        request = PipelineRequest("p", "d", ["b"], demand=np.array([0.1, 0.0]), job={"params": deep})
        assert "JSON" in one_line_error(lambda: ledger.submit(request), LedgerError)
        assert ledger.list_pipelines() == []


READ_IMPORTS = """
import sys
from privsched.spec_files import read_spec
data = read_spec(sys.argv[1])
print(data["name"], sorted(m for m in ("yaml", "pydantic") if m in sys.modules))
"""


@pytest.mark.parametrize(("suffix", "loaded"), [(".json", "[]"), (".yaml", "['yaml']")])
def test_reading_a_specification_loads_yaml_only_for_yaml_and_never_pydantic(tmp_path, suffix, loaded):
    path = tmp_path / f"p{suffix}"
    path.write_text(json.dumps(BASE))  # JSON is YAML
    done = subprocess.run([sys.executable, "-c", READ_IMPORTS, str(path)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"p {loaded}\n"

"""Pipeline specifications: loading, block selectors, and refusal of impossible values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privsched.spec import (
    JobSpec,
    Last,
    PipelineSpec,
    Range,
    SpecError,
    load_spec,
    parse_duration,
    parse_memory,
    select_blocks,
)

BASE = {"name": "train", "dataset": "reviews", "blocks": {"last": 3}, "epsilon": 1.0, "delta": 1e-9, "job": {"function": "pkg.mod:train"}}


def spec(**changes) -> dict:
    return {**BASE, **changes}


def test_yaml_file_loads_every_field(tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: lstm\ndataset: reviews\nblocks: {from: 2026-01-01, to: 2026-01-31}\nepsilon: 0.5\ndelta: 1.0e-9\n"
        "job: {kind: dpsgd, params: {model: lstm}}\nresources: {gpus: 1, cpus: 2, memory: 4GiB}\n"
        "timeout: 2h\nmax_runtime: 30m\nweight: 2\nowner: ana\n"
    )
    loaded = load_spec(path)
    assert loaded.blocks == Range("2026-01-01", "2026-01-31")
    assert loaded.resources.memory == 4 * 2**30 and loaded.resources.gpus == 1
    assert (loaded.timeout, loaded.max_runtime, loaded.weight, loaded.owner) == (7200.0, 1800.0, 2.0, "ana")
    assert loaded.job == JobSpec(kind="dpsgd", params={"model": "lstm"})


def test_json_file_round_trips_through_to_dict(tmp_path: Path):
    original = PipelineSpec.parse(spec(mechanism={"kind": "laplace", "scale": 10}, epsilon=None, delta=None))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(original.to_dict()))
    assert load_spec(path) == original


@pytest.mark.parametrize(
    "blocks, expected",
    [(["b", "a"], ["b", "a"]), ({"last": 2}, ["c", "d"]), ({"from": "b", "to": "c"}, ["b", "c"]), ({"to": "a"}, ["a"])],
)
def test_block_selectors_pick_the_intended_keys(blocks, expected):
    selector = PipelineSpec.parse(spec(blocks=blocks)).blocks
    assert select_blocks(selector, ["a", "b", "c", "d"], ["a", "b", "c", "d"]) == expected


def test_last_counts_only_active_blocks_in_order_of_addition():
    assert select_blocks(Last(2), ["z", "a", "m"], ["z", "m"]) == ["z", "m"]


def test_last_more_blocks_than_the_dataset_has_is_an_error():
    with pytest.raises(SpecError, match="has 2 active blocks, the pipeline asks for the last 3"):
        select_blocks(Last(3), ["a", "b"], ["a", "b"])


def test_range_matching_no_block_is_an_error():
    with pytest.raises(SpecError, match="no block of the dataset matches"):
        select_blocks(Range("x", "y"), ["a", "b"], ["a", "b"])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"blocks": {"last": 0}}, "blocks: last: must be in [1, 1000000], got 0"),
        ({"blocks": {"from": "b", "to": "a"}}, "block range is empty"),
        ({"blocks": []}, "the list of block keys is empty"),
        ({"blocks": ["a", "a"]}, None),
        ({"epsilon": 0}, "epsilon: must be in [1e-06, 1e+06], got 0"),
        ({"delta": 1.0}, "delta: must be 0 or in [1e-300, 1), got 1.0"),
        ({"epsilon": None, "delta": None}, "no privacy demand"),
        ({"mechanism": {"kind": "laplace", "scale": 1}}, "not both"),
        ({"job": {"kind": "dpsgd", "function": "a:b"}}, "exactly one of 'kind'"),
        ({"job": {"function": "no_colon"}}, "must look like 'module:function'"),
        ({"resources": {"gpus": -1}}, "resources.gpus"),
        ({"resources": {"memory": "lots"}}, "invalid memory size 'lots'"),
        ({"timeout": "-5m"}, "invalid duration"),
        ({"weight": 0}, "weight"),
    ],
)
def test_invalid_specification_is_one_clear_line(changes, message):
    if message is None:  # duplicate keys are refused when blocks are selected
        with pytest.raises(SpecError, match="listed twice"):
            select_blocks(PipelineSpec.parse(spec(**changes)).blocks, ["a"], ["a"])
        return
    with pytest.raises(SpecError) as caught:
        PipelineSpec.parse(spec(**changes))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_malformed_yaml_names_the_file_and_line(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nblocks: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad.yaml: invalid YAML at line \d+"):
        load_spec(path)


def test_a_yaml_list_is_not_a_specification(tmp_path: Path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(path)


def test_missing_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    "text, seconds", [(90, 90.0), ("90", 90.0), ("30s", 30.0), ("5m", 300.0), ("1.5h", 5400.0), ("1d", 86400.0), ("250ms", 0.25)]
)
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text, size", [(1024, 1024), ("512M", 512 * 2**20), ("4GiB", 4 * 2**30), ("2G", 2 * 2**30), ("1.5K", 1536), ("0", 0)]
)
def test_memory_sizes_parse_to_bytes(text, size):
    assert parse_memory(text) == size


def test_selectors_build_positionally_as_in_the_python_api():
    assert Last(10).last == 10
    assert Range("2026-01-01").start == "2026-01-01" and Range("2026-01-01").end is None

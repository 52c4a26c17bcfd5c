"""The compute pool: detection, refusal of impossible jobs, placement with backfilling."""

from __future__ import annotations

import json

import pytest

from privsched.service.resources import FreeCompute, Pool, detect_gpus, make_pool
from privsched.service.rundirs import RunDirs
from privsched.spec import Resources

POOL = Pool(("0", "1"), cpus=4.0, memory=8 * 2**30)


def test_visible_devices_name_the_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert detect_gpus() == ("2", "5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == ()


def test_declared_sizes_override_detection():
    pool = make_pool(gpus=3, cpus=2, memory=2**30)
    assert pool == Pool(("0", "1", "2"), 2.0, 2**30)


@pytest.mark.parametrize(
    "sizes, bound",
    [
        ({"gpus": -1}, r"\[0, 1024\]"),
        ({"gpus": 10**30}, r"\[0, 1024\]"),
        ({"cpus": float("nan")}, "finite"),
        ({"cpus": 1e-9}, r"\[0.01, 4096\]"),
        ({"memory": 10**400}, "memory"),
    ],
)
def test_pool_sizes_out_of_bounds_are_refused_naming_the_bound(sizes, bound):
    with pytest.raises(ValueError, match=bound):
        make_pool(**sizes)


def test_a_job_larger_than_the_pool_is_refused_with_the_reason():
    assert POOL.refusal(Resources(gpus=2, cpus=4)) is None
    assert POOL.refusal(Resources(gpus=3)) == "the job asks for 3 GPU(s) but the pool has 2"
    assert "memory" in POOL.refusal(Resources(memory="9G"))


def test_placement_hands_out_distinct_gpus_and_returns_them():
    free = FreeCompute(POOL)
    first = free.place(1, Resources(gpus=1))
    second = free.place(2, Resources(gpus=1))
    assert {first.gpus, second.gpus} == {("0",), ("1",)}
    assert free.place(3, Resources(gpus=1)) is None
    free.release(1)
    assert free.place(3, Resources(gpus=1)).gpus == first.gpus


def test_cpu_and_memory_are_shared_out_until_exhausted():
    free = FreeCompute(POOL)
    assert free.place(1, Resources(cpus=3, memory="6G")) is not None
    assert free.place(2, Resources(cpus=2)) is None  # 1 CPU left
    assert free.place(3, Resources(cpus=1, memory="3G")) is None  # 2 GiB left
    assert free.place(4, Resources(cpus=1, memory="2G")) is not None


def test_the_recorded_pool_is_read_again_whenever_its_file_changes(tmp_path):
    runs = RunDirs(tmp_path / "a.db")
    assert runs.recorded_pool() is None
    first, second = Pool(("0",), cpus=4.0, memory=1 << 30), Pool((), cpus=2.0, memory=0)
    runs.record_pool(first)
    assert runs.recorded_pool() == first
    assert runs.recorded_pool() == first  # unchanged: the kept copy
    runs.record_pool(second)  # replaced whole: a new file
    assert runs.recorded_pool() == second
    path = runs.root / "pool.json"
    path.write_text(json.dumps({**second.to_dict(), "cpus": 16.0}))  # edited in place
    assert runs.recorded_pool() == Pool((), cpus=16.0, memory=0)
    path.unlink()
    assert runs.recorded_pool() is None

"""Generated workloads compiled in bulk: the arrays of the same workload validated as a trace."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workloads
from privsched.simulation.compile import compile_trace
from privsched.simulation.generated import GeneratedTrace
from privsched.simulation.instance import Instance
from privsched.simulation.limits import TraceError
from privsched.simulation.trace import parse_trace

REPO = Path(__file__).resolve().parents[1]


def assert_same_instance(fast: Instance, validated: Instance) -> None:
    assert fast.accounting == validated.accounting
    for field in dataclasses.fields(Instance):
        if field.name == "accounting":
            continue
        mine, theirs = getattr(fast, field.name), getattr(validated, field.name)
        if mine is None or theirs is None:  # team quotas, absent from generated workloads
            assert mine is None and theirs is None, field.name
            continue
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, field.name
        assert np.array_equal(mine, theirs), field.name


def assert_generated_equals_validated(generated: GeneratedTrace) -> None:
    validated = parse_trace(generated.document())
    assert_same_instance(generated.instance, compile_trace(validated))
    assert generated.to_dict() == validated.to_dict()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["single-block", "single-block-rdp", "multi-block", "multi-block-rdp"]),
    seed=st.integers(0, 2**32),
    duration=st.floats(0.5, 40.0),
    timeout=st.floats(0.01, 1e4),
)
def test_a_generated_microbenchmark_compiles_to_the_arrays_of_its_validated_trace(name, seed, duration, timeout):
    assert_generated_equals_validated(workloads.generate(name, seed=seed, duration=duration, timeout=timeout))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    initial_blocks=st.integers(1, 5),
    block_interval=st.floats(0.5, 20.0),
    many=st.integers(1, 30),
    p_one=st.floats(0.0, 1.0),
)
def test_multi_block_with_any_shape_compiles_to_the_arrays_of_its_validated_trace(seed, initial_blocks, block_interval, many, p_one):
    generated = workloads.generate(
        "multi-block", seed=seed, duration=30.0, initial_blocks=initial_blocks, block_interval=block_interval, many=many, p_one=p_one
    )
    assert_generated_equals_validated(generated)


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
@pytest.mark.parametrize("name", ["macro", "macro-rdp"])
def test_the_generated_macrobenchmark_compiles_to_the_arrays_of_its_validated_trace(name):
    assert_generated_equals_validated(workloads.generate(name, seed=4, days=5, pipelines_per_day=60))


def small(**changes) -> GeneratedTrace:
    fields = dict(
        accounting="basic",
        block_ids=["b0", "b1"],
        block_arrival=np.array([0.0, 5.0]),
        block_epsilon=np.array([1.0, 1.0]),
        block_delta=np.array([1e-6, 1e-6]),
        pipeline_ids=["p0", "p1", "p2"],
        arrival=np.array([1.0, 6.0, 7.0]),
        last=np.array([1, 2, 1]),
        demand=np.array([0, 1, 0]),
        demands=({"epsilon": 0.1, "delta": 0.0}, {"epsilon": 0.2, "delta": 1e-9}),
        timeout=np.array([10.0, 10.0, 10.0]),
        klass=np.array([0, 0, 0]),
        classes=("mice",),
    )
    return GeneratedTrace(**{**fields, **changes})


def test_a_small_generated_workload_compiles_like_its_trace():
    assert_generated_equals_validated(small())
    assert_generated_equals_validated(small(accounting="rdp"))


def test_a_small_generated_workload_with_block_lists_and_curves_compiles_like_its_trace():
    lists = (np.array([0, 1, 3, 4]), np.array([0, 1, 0, 1]))
    curves = np.array([[0.3, 1e-8], [0.0, 0.0]])
    timeout = np.array([10.0, np.inf, 10.0])
    assert_generated_equals_validated(small(last=None, block_lists=lists, demand=np.array([2, 3, 0]), curves=curves, timeout=timeout))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pipeline_ids": ["p0", "p1", "p0"]}, r"pipelines\[2\] 'p0': duplicate pipeline id"),
        ({"block_ids": ["b0", "b0"]}, r"blocks\[1\] 'b0': duplicate block id"),
        ({"arrival": np.array([1.0, -1.0, 7.0])}, r"pipelines\[1\] 'p1': arrives at -1 before any block exists"),
        ({"arrival": np.array([1.0, np.nan, 7.0])}, r"pipelines\[1\] 'p1': arrival must be in"),
        ({"timeout": np.array([10.0, 0.0, 10.0])}, r"pipelines\[1\] 'p1': timeout must be in"),
        ({"last": np.array([1, 0, 1])}, r"pipelines\[1\] 'p1': asks for no block"),
        ({"demands": ({"epsilon": 0.1, "delta": 0.0}, {"epsilon": -2.0, "delta": 0.0})}, r"pipelines\[1\] 'p1': epsilon must be"),
        ({"block_epsilon": np.array([1.0, 0.0])}, r"blocks\[1\] 'b1'"),
        ({"accounting": "zcdp"}, "accounting must be 'basic' or 'rdp'"),
        ({"classes": ("mice\n",)}, "not a printable name"),
        ({"last": None, "block_lists": (np.array([0, 1, 1, 2]), np.array([0, 0]))}, r"pipelines\[1\] 'p1': asks for no block"),
        ({"last": None, "block_lists": (np.array([0, 1, 3, 4]), np.array([0, 1, 1, 0]))}, r"pipelines\[1\] 'p1': lists a block twice"),
        ({"last": None, "block_lists": (np.array([0, 1, 2, 3]), np.array([1, 0, 0]))}, r"pipelines\[0\] 'p0': arrives before one"),
        ({"last": None, "block_lists": (np.array([0, 1, 2, 3]), np.array([0, 2, 0]))}, r"pipelines\[1\] 'p1': asks for an unknown block"),
        ({"demand": np.array([0, 2, 0]), "curves": np.array([[0.1, -1.0]])}, r"pipelines\[1\] 'p1': explicit demand values"),
        ({"demand": np.array([0, 3, 0])}, r"pipelines\[1\] 'p1': names no generated demand"),
    ],
)
def test_a_generated_workload_that_no_trace_could_hold_is_refused_naming_the_entry(changes, message):
    with pytest.raises(TraceError, match=message):
        small(**changes).instance  # noqa: B018 (compiling checks it)


def test_simulating_a_generated_microbenchmark_imports_no_trace_model_nor_another_policy():
    code = (
        "import sys; from privsched.simulation import simulate\n"
        "result = simulate('multi-block', 'dpf-n', n=50, duration=20.0)\n"
        "print(result.summary()['granted'] > 0, 'pydantic' in sys.modules, 'privsched.simulation.trace' in sys.modules,\n"
        "      sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('privsched.policies.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.split(" ", 3) == ["True", "False", "False", "['admission', 'base', 'dpf', 'fcfs', 'registry', 'unlock']\n"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    selection=st.sampled_from(["latest", "random"]),
    demands=st.sampled_from(["mechanism", "scaled", "bent"]),
    timeout=st.none() | st.floats(0.01, 1e4),
)
def test_the_generated_heterogeneous_workload_compiles_to_the_arrays_of_its_validated_trace(seed, selection, demands, timeout):
    scaled = {"size_mean": 0.05, "size_std": 0.01}
    sizes = {"mechanism": {}, "scaled": scaled, "bent": {**scaled, "range_mean": 0.05, "range_std": 0.03}}
    generated = workloads.generate(
        "heterogeneous",
        seed=seed,
        duration=40.0,
        tasks_per_block=8,
        initial_blocks=2,
        blocks_mean=3,
        max_blocks=6,
        block_selection=selection,
        timeout=timeout,
        **sizes[demands],
    )
    assert_generated_equals_validated(generated)


def test_generating_the_default_heterogeneous_workload_imports_no_scipy():
    code = (
        "import sys, workloads\n"
        "instance = workloads.generate('heterogeneous', duration=30.0).instance\n"
        "print(instance.n_pipelines > 0, 'scipy' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.split() == ["True", "False"]

"""Workload parameters (``-p KEY=VALUE``) are checked against the generator's signature
before it runs: unknown names, wrong types (a boolean is not a number), non-finite values
and values outside a declared range are refused in one line naming the limit, and naming a
workload imports only its own generator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privsched.simulation.params import declared_params
from privsched.simulation.registry import generate_workload
from privsched.simulation.instance import Instance
from tests.cli_inprocess import invoke
from tests.conftest import REPO
from workloads import WORKLOADS

HOSTILE = [True, False, None, 0, -1, 3, 1.5, 5e-324, 1e-300, 1e300, float("inf"), float("nan"), 10**400, 2**63, "x", "[/]", [1], {"a": 1}]


@pytest.mark.parametrize(
    "workload, param, reason",
    [
        ("heterogeneous", "max_blocks=1e9", "max_blocks must be an integer in [1, 100000], got 1000000000.0"),
        ("heterogeneous", "max_blocks=1000000000", "max_blocks must be an integer in [1, 100000], got 1000000000"),
        ("heterogeneous", "initial_blocks=" + "9" * 400, "initial_blocks must be an integer in [0, 100000], got an integer of 400 digits"),
        ("heterogeneous", "tasks_per_block=1e7", "tasks_per_block must be a number in [0, 1e+06]"),
        ("heterogeneous", "blocks_mean=NaN", "blocks_mean must be a number in [1, 100000], got nan"),
        ("heterogeneous", "block_selection=3", "block_selection must be a string, got 3"),
        ("heterogeneous", "bogus=1", "takes no parameter 'bogus'"),
        ("multi-block", "rate=true", "rate must be a number (finite), got True"),
        ("multi-block", "p_one=2", "p_one must be a number in [0, 1], got 2"),
        ("multi-block", "many=false", "many must be an integer in [1, 100000], got False"),
        ("single-block", "timeout=Infinity", "timeout must be a number (finite), got inf"),
        ("macro", "days=true", "days must be an integer in [1, 100000], got True"),
        ("macro", "pipelines_per_day=1e7", "pipelines_per_day must be a number in [0, 1e+06]"),
        ("macro", 'accounting="basic"', "takes no parameter 'accounting'"),
    ],
)
def test_a_parameter_out_of_its_type_or_range_is_refused_naming_the_limit(tmp_path: Path, workload, param, reason):
    outcome = invoke("simulate", workload, "--out", tmp_path / "s", "--policy", "fcfs", "-p", param)
    assert outcome.code != 0 and outcome.stderr.count("\n") == 1, outcome.stderr
    assert reason in outcome.stderr
    assert not (tmp_path / "s").exists()


def test_a_parameter_in_range_is_accepted():
    trace = generate_workload(
        WORKLOADS,
        "heterogeneous",
        0,
        {"max_blocks": 3, "blocks_mean": 2.0, "duration": 5.0, "alpha_std": float("inf"), "block_selection": "random"},
    )
    assert max(len(p.blocks) if isinstance(p.blocks, list) else p.blocks.last for p in trace.pipelines) <= 3


def test_naming_a_workload_imports_only_its_own_generator():
    code = (
        "import sys; from privsched.simulation.registry import generate_workload, workload_generators\n"
        "try: generate_workload(workload_generators(), 'multi-block', 0, {'rate': True})\n"
        "except ValueError as exc: print(exc)\n"
        "print(sorted(m for m in sys.modules if m.startswith('workloads.') or m == 'scipy'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.splitlines() == ["workload 'multi-block': rate must be a number (finite), got True", "['workloads.microbenchmarks']"]


CASES = [(name, key) for name, generator in WORKLOADS.items() for key in declared_params(generator)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), value=st.sampled_from(HOSTILE))
def test_any_value_of_any_parameter_generates_or_is_refused_in_one_line(case, value):
    name, key = case
    params = {key: value} if key == "duration" else {key: value, "duration": 5.0}
    try:
        instance = generate_workload(WORKLOADS, name, 0, params).instance  # a generated workload is checked as it compiles
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
    else:
        assert isinstance(instance, Instance)

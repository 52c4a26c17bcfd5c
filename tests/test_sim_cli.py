"""The ``simulate``, ``sweep`` and ``trace`` commands: outputs, and bad input that changes nothing."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from privsched.cli import app
from privsched.simulation import SimulationResult

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_simulate_writes_result_summary_and_plots_when_asked(tmp_path):
    out = tmp_path / "run"
    result = invoke("simulate", "single-block", "--policy", "dpf-n", "--n", "150", "--out", out, "--plots")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    # 100 mice of ε = 0.01 fill the block exactly: 100 × 0.01 is above 1.0 in float, but
    # admission adds decimal quanta exactly (docs/design.md §3.3)
    assert summary["granted"] == 100 and summary["by_class"]["mice"]["granted"] == 100
    saved = SimulationResult.from_json((out / "result.json").read_text())
    assert saved.granted == 100
    assert {p.name for p in out.glob("*.png")} == {"delay_cdf.png", "budget_over_time.png", "granted_by_class.png"}
    assert "mice" in result.output


def test_simulate_draws_no_plots_unless_asked(tmp_path):
    out = tmp_path / "run"
    result = invoke("simulate", "single-block", "--policy", "fcfs", "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["result.json", "summary.json"]


def test_a_saved_trace_simulates_like_the_generated_workload(tmp_path):
    trace = tmp_path / "multi.json"
    assert invoke("trace", "multi-block", "--seed", "4", "--duration", "30", "--out", trace).exit_code == 0
    by_trace = invoke("simulate", trace, "--policy", "fcfs", "--out", tmp_path / "a")
    by_name = invoke("simulate", "multi-block", "--seed", "4", "--duration", "30", "--policy", "fcfs", "--out", tmp_path / "b")
    assert by_trace.exit_code == 0 and by_name.exit_code == 0
    a, b = (json.loads((tmp_path / d / "result.json").read_text())["pipelines"] for d in "ab")
    assert a == b


def test_an_invalid_trace_is_one_error_line_and_writes_nothing(tmp_path):
    trace = tmp_path / "bad.json"
    trace.write_text(
        json.dumps(
            {
                "accounting": "basic",
                "blocks": [{"id": "b0", "epsilon": 1.0}],
                "pipelines": [{"id": "p7", "arrival": 1.0, "blocks": ["b5"], "epsilon": 0.1}],
            }
        )
    )
    out = tmp_path / "out"
    result = invoke("simulate", trace, "--policy", "fcfs", "--out", out)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["error: invalid trace: pipelines[0] 'p7': asks for unknown block 'b5'"]
    assert not out.exists()


def test_a_missing_policy_parameter_is_rejected_before_running(tmp_path):
    result = invoke("simulate", "single-block", "--policy", "dpf-t", "--out", tmp_path / "out")
    assert result.exit_code == 1 and "needs lifetime" in result.output
    assert not (tmp_path / "out").exists()


def test_sweep_runs_the_grid_in_worker_processes_and_draws_the_figures(tmp_path):
    out = tmp_path / "sweep"
    result = invoke(
        "sweep", "single-block", "--policies", "fcfs,dpf-n,dpf-t", "--n", "50,150", "--lifetime", "100", "--workers", "2", "--out", out
    )
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "sweep.json").read_text())
    assert [(r["policy"], r["n"], r["lifetime"]) for r in rows] == [
        ("fcfs", None, None),
        ("dpf-n", 50, None),
        ("dpf-n", 150, None),
        ("dpf-t", None, 100.0),
    ]
    assert rows[2]["granted"] == 100  # as above
    names = {p.name for p in out.glob("*.png")}
    assert {"granted_single-block.png", "delay_cdf_single-block.png", "budget_single-block_dpf-n.png"} <= names
    assert "| single-block | dpf-n | 150 |" in (out / "summary.md").read_text()


def test_sweep_with_an_unknown_policy_writes_nothing(tmp_path):
    result = invoke("sweep", "single-block", "--policies", "fcfs,lottery", "--out", tmp_path / "out")
    assert result.exit_code == 1 and "unknown policy 'lottery'" in result.output
    assert not (tmp_path / "out").exists()

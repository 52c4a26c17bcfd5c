"""The end-to-end demonstration, run small through the CLI: real data files, real DP
statistics and DP-SGD jobs in their own processes, DPF, the ledger audit."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_demo_schedules_trains_reports_and_leaves_an_audited_ledger(run_cli, tmp_path):
    out = tmp_path / "demo"
    done = run_cli("demo", "--out", out, "--days", 3, "--reviews-per-day", 200, "--limit", 4, "--n", 4)
    assert done.returncode == 0, done.stderr[-2000:]
    text = done.stdout
    assert "submitted 4 pipelines" in text
    for name in ("daily-count", "sentiment-text-e1", "greedy-text-e8", "mean-rating-3d"):
        assert name in text
    assert "accuracy" in text and "non-private accuracy" in text
    assert "ledger audit: ok" in text
    assert (out / "budget.png").stat().st_size > 10_000

    import privsched as ps

    with ps.connect(out / "privsched.db", create=False) as client:
        states = {p.name: p.state for p in client.list()}
    assert states["daily-count"] == states["sentiment-text-e1"] == states["mean-rating-3d"] == "completed"
    # the greedy model asks for ε = 8 on every day; DPF serves it last, if at all
    assert states["greedy-text-e8"] in ("completed", "pending")


def test_demo_refuses_to_clear_a_folder_it_did_not_write(run_cli, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    done = run_cli("demo", "--out", out)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: {out} exists and was not written by the demo: choose another --out"]
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("days", [3651, 10**12])
def test_demo_refuses_more_days_than_it_writes_in_one_line(run_cli, tmp_path, days):
    done = run_cli("demo", "--out", tmp_path / "demo", "--days", days)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip().splitlines() == [f"error: --days must be from 2 to 3650, got {days}"]
    assert not (tmp_path / "demo").exists()


def test_demo_says_in_one_line_when_it_cannot_make_its_folder(run_cli, tmp_path):
    done = run_cli("demo", "--out", "/dev/null/x")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip().splitlines() == ["error: cannot write the demo's folder /dev/null/x: Not a directory"]

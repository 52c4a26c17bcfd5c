"""``benchmarks/elastic.py`` runs end to end on a small macrobenchmark: one fixed row and one
row per top-up rule, each measured against the fixed one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "elastic.py"


def test_the_table_compares_every_top_up_rule_with_fixed_demands_on_the_same_trace() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--days", "4", "--pipelines-per-day", "30", "--n", "30"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| dpf-n | 30 |")]
    assert [r[2] for r in rows] == [
        "fixed",
        "elastic, top-up: fair share (kept)",
        "elastic, top-up: unbounded",
        "elastic, top-up: minimum only",
    ]
    assert rows[0][4] == "1.000×" and rows[0][7] == "1.000"
    fractions = [float(r[7]) for r in rows[1:]]  # mean fraction granted
    assert all(0 < f <= 1 for f in fractions) and fractions[2] == min(fractions)

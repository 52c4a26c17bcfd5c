"""``benchmarks/policies.py`` runs end to end on small snapshots with its layout options (its
own check that the naive DPF walk agrees with the vectorised pass runs along), and refuses
bad ones with an error line and exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "policies.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_blocks_scale_with_the_queue_and_k_is_passed_on():
    done = run("--sizes", "200,400", "--pipelines-per-block", "20", "--k", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pending / 20 blocks, DPack k = 3\n")
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 200 |") or line.startswith("| 400 |")]
    assert len(rows) == 2
    assert rows[1].endswith("|") and "n^" in rows[1]


@pytest.mark.parametrize(
    "args",
    [("--blocks", "0"), ("--k", "0"), ("--pipelines-per-block", "0"), ("--blocks", "10", "--pipelines-per-block", "5")],
)
def test_bad_layouts_are_refused(args):
    done = run("--sizes", "100", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].startswith("policies.py: error:")

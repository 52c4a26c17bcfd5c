"""The README's import example (a CSV to a DP mean over the last 7 days) runs as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def import_example() -> str:
    section = (REPO / "README.md").read_text().split("### Data in: importing a table", 1)[1]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[:1]
    return block


@pytest.mark.slow
def test_the_readme_import_example_runs_and_releases_a_mean_over_seven_days(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "privsched").write_text(f'#!/bin/sh\nexec {sys.executable} -m privsched "$@"\n')
    (bin_dir / "privsched").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PRIVSCHED_DB"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=str(REPO))
    done = subprocess.run(["bash", "-euc", import_example()], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported 100000 rows into 30 new block(s) of events" in done.stdout
    metrics = json.loads((tmp_path / "runs/privsched/1/work/metrics.json").read_text())
    assert metrics["query"] == "mean" and metrics["blocks"] == 7
    assert 0 <= metrics["value"] <= 200

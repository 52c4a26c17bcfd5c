"""The README's worked example runs as written and prints what the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from workloads.reviews import write_blocks

REPO = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(# example\.py\n.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "the README has one example.py block"
    return blocks[0]


def test_the_readme_python_example_runs_and_touches_only_its_own_database(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "example.py").write_text(readme_example())
    write_blocks(tmp_path / "data", days=2, per_day=500)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PRIVSCHED_DB", None)
    done = subprocess.run([sys.executable, "code/example.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    status, rate = done.stdout.splitlines()[0].split()
    assert status == "completed" and 0.3 < float(rate) < 0.7
    assert "audit ok: True" in done.stdout
    # the job process imported example.py (and its connect call) without opening a database
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.db")) == [Path("ledger/privsched.db")]

"""Fixtures shared by the test suite: a database path, the CLI in a subprocess, and a
content dump of a database for before/after comparisons; and the Hypothesis profile every
property test runs under (:mod:`tests.support.profiles`)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import profiles

profiles.load()

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tmp_db(tmp_path: Path) -> Path:
    """Path of a privsched database file that does not exist yet."""
    return tmp_path / "privsched.db"


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """``run_cli(*args, env=None, cwd=None)`` runs ``python -m privsched *args`` in a
    subprocess (working directory ``tmp_path`` unless ``cwd`` is given; ``PRIVSCHED_DB``
    unset unless ``env`` sets it) and returns the CompletedProcess, text captured."""

    def run(*args: object, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
        environment = {k: v for k, v in os.environ.items() if k != "PRIVSCHED_DB"}
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environment.get("PYTHONPATH")]))
        environment.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "privsched", *map(str, args)],
            cwd=cwd or tmp_path,
            env=environment,
            capture_output=True,
            text=True,
        )

    return run


def dump_database(path: Path) -> list[str]:
    """Every table's content as SQL text (``iterdump``), for "nothing changed" checks."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture
def dump_db() -> Callable[[Path], list[str]]:
    """``dump_db(path)``: a database's content as SQL lines (see :func:`dump_database`)."""
    return dump_database


@pytest.fixture(scope="module")
def one_torch_thread():
    """Jobs run with one torch thread per CPU they were placed on (one by default)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

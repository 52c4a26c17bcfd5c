"""Running the real ``privsched`` entry point (:func:`privsched.cli.main`) inside the test
process, for tests that run many command lines: the same code path as the console script,
without a Python start-up per case."""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

from privsched.cli import main


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str


def invoke(*args: object, db: Path | None = None) -> Outcome:
    """Run ``privsched *args`` (with ``--db`` appended when given) and capture its output."""
    argv = ["privsched", *map(str, args), *(["--db", str(db)] if db is not None else [])]
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = saved
    return Outcome(code, out.getvalue(), err.getvalue())


def ledger_with_one_block(folder: Path) -> Path:
    """A ledger made through the command line: dataset ``events`` (ε_G = 10, δ_G = 1e-7)
    holding one registered block ``d1``."""
    db = folder / "ledger.db"
    invoke("init", db=db)
    invoke("dataset", "create", "events", "--epsilon", "10", "--delta", "1e-7", db=db)
    invoke("blocks", "add", "events", "d1", db=db)
    return db

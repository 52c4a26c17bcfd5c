"""One error vocabulary: every refusal is a PrivschedError with a one-line message and a
status code; the command line prints refusals as one line and anything else as a bug."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel, ValidationError

from privsched.cli.common import errors
from privsched.errors import (
    BadInput,
    BudgetRefused,
    Conflict,
    Forbidden,
    NotFound,
    PrivschedError,
    validation_message,
)
from privsched.jobs.context import BlockAccessError
from privsched.ledger import LedgerError
from privsched.service.serve import ServiceError
from privsched.simulation.trace import TraceError
from privsched.spec import SpecError


def test_each_kind_of_refusal_has_its_status_code() -> None:
    codes = {cls: cls.status for cls in (BadInput, Forbidden, NotFound, Conflict, BudgetRefused)}
    assert codes == {BadInput: 400, Forbidden: 403, NotFound: 404, Conflict: 409, BudgetRefused: 422}


@pytest.mark.parametrize(
    ("error", "kind", "builtin"),
    [
        (LedgerError, BadInput, ValueError),
        (SpecError, BadInput, ValueError),
        (TraceError, BadInput, ValueError),
        (BlockAccessError, Forbidden, PermissionError),
        (ServiceError, Conflict, RuntimeError),
    ],
)
def test_existing_errors_are_privsched_errors_and_keep_their_builtin_base(error, kind, builtin) -> None:
    assert issubclass(error, kind) and issubclass(error, PrivschedError) and issubclass(error, builtin)


def test_messages_are_one_line() -> None:
    assert str(NotFound("no dataset\n  'x'\n")) == "no dataset; 'x'"


def test_a_pydantic_error_flattens_to_one_line_naming_each_field() -> None:
    class Point(BaseModel):
        x: int
        y: int

    with pytest.raises(ValidationError) as caught:
        Point.model_validate({"x": "a", "y": None})
    message = validation_message(caught.value)
    assert "\n" not in message and message.startswith("x: ") and "; y: " in message


def test_the_cli_prints_a_refusal_as_one_line_and_exits_1(capsys) -> None:
    with pytest.raises(typer.Exit) as stopped, errors():
        raise NotFound("unknown pipeline 7")
    assert stopped.value.exit_code == 1
    assert capsys.readouterr().err == "error: unknown pipeline 7\n"


def test_the_cli_lets_a_bug_through_as_a_bug() -> None:
    with pytest.raises(TypeError), errors():
        raise TypeError("not a refusal")


REPO = Path(__file__).resolve().parents[1]
PROGRAM = """
import sys
from privsched.cli import app, main
from privsched.errors import Conflict

@app.command("boom")
def boom(kind: str) -> None:
    raise Conflict("already\\nrunning") if kind == "refusal" else KeyError("a bug")

sys.argv = ["privsched", "boom", sys.argv[1]]
main()
"""


@pytest.mark.parametrize(
    ("kind", "status", "last_line"),
    [
        ("refusal", 1, "error: already; running"),
        ("bug", 70, "error: internal error in privsched (a bug; the traceback above says where)"),
    ],
)
def test_the_command_line_exits_1_on_a_refusal_and_70_with_a_traceback_on_a_bug(kind, status, last_line) -> None:
    result = subprocess.run([sys.executable, "-c", PROGRAM, kind], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == status
    assert result.stderr.splitlines()[-1] == last_line
    assert ("Traceback" in result.stderr) == (kind == "bug")

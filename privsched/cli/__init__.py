"""The ``privsched`` command line: a thin layer over the Python API.

Each command group lives in its own module and registers itself on :data:`app`. Command
modules import heavy libraries (torch, opacus, ray) only inside command bodies, so that
``privsched --help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(
    name="privsched",
    help="Privacy-budget-aware job scheduler for differentially private machine learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

#: Command modules, each registering its commands on ``app`` when imported.
_COMMAND_MODULES = (
    "privsched.cli.remote_option",
    "privsched.cli.ledger_cmds",
    "privsched.cli.sim_cmds",
    "privsched.cli.service_cmds",
    "privsched.cli.demo_cmds",
    "privsched.cli.user_cmds",
)

for _name in _COMMAND_MODULES:
    importlib.import_module(_name)


def main() -> None:
    """Run the CLI. A usage error (an unknown command or option, a value that does not
    parse) is reported like every other bad input: one ``error:`` line on stderr."""
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # click's usage and parameter errors
        message = " ".join((exc.format_message() if hasattr(exc, "format_message") else str(exc)).split())
        if message:  # empty after the help printed for a bare `privsched`
            print(f"error: {message}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)

"""The ``privsched`` Typer application and which module registers each command on it.

Command modules import :data:`app` from here and register their commands when imported;
:func:`load_commands` imports only the module of the command a command line names, so a
command pays for its own imports and no other's.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import typer

app = typer.Typer(
    name="privsched",
    help="Privacy-budget-aware job scheduler for differentially private machine learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_LEDGER, _SIMULATION, _SERVICE, _DEMO = (
    "privsched.cli.ledger_cmds",
    "privsched.cli.sim_cmds",
    "privsched.cli.service_cmds",
    "privsched.cli.demo_cmds",
)

#: Command (or command group) name -> the module that registers it on :data:`app`.
COMMANDS: dict[str, str] = {
    "init": _LEDGER, "dataset": _LEDGER, "blocks": _LEDGER, "budget": _LEDGER, "audit": _LEDGER,
    "simulate": _SIMULATION, "sweep": _SIMULATION, "trace": _SIMULATION,
    "submit": _SERVICE, "list": _SERVICE, "status": _SERVICE, "cancel": _SERVICE, "logs": _SERVICE,
    "serve": _SERVICE,
    "demo": _DEMO,
}


def load_commands(argv: Sequence[str] | None = None) -> None:
    """Register the command ``argv`` names (its first word), or every command when it names
    none that is known (no arguments, ``--help``, a misspelt command: the help and the error
    list them all)."""
    name = argv[0] if argv else None
    modules = [COMMANDS[name]] if name in COMMANDS else dict.fromkeys(COMMANDS.values())
    for module in modules:
        importlib.import_module(module)

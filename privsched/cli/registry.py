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
    add_completion=True,
)

#: The module of the options every command takes (``--server``), always registered.
GLOBAL_OPTIONS = "privsched.cli.remote_option"

_LEDGER, _SIMULATION, _SUBMIT, _SERVICE, _DEMO, _USERS, _RESULTS = (
    "privsched.cli.ledger_cmds",
    "privsched.cli.sim_cmds",
    "privsched.cli.submit_cmds",
    "privsched.cli.service_cmds",
    "privsched.cli.demo_cmds",
    "privsched.cli.user_cmds",
    "privsched.cli.result_cmds",
)

#: Command (or command group) name -> the module that registers it on :data:`app`.
COMMANDS: dict[str, str] = {
    "init": _LEDGER,
    "dataset": _LEDGER,
    "blocks": _LEDGER,
    "budget": _LEDGER,
    "audit": _LEDGER,
    "simulate": _SIMULATION,
    "sweep": _SIMULATION,
    "trace": _SIMULATION,
    "submit": _SUBMIT,
    "list": _SERVICE,
    "status": _SERVICE,
    "cancel": _SERVICE,
    "logs": _SERVICE,
    "result": _RESULTS,
    "download": _RESULTS,
    "serve": _SERVICE,
    "demo": _DEMO,
    "user": _USERS,
    "quota": _USERS,
}

#: Global options that take a value (the word after them is not a command).
_VALUED_OPTIONS = ("--server", "--db", "--output", "-o")


def load_commands(argv: Sequence[str] | None = None) -> None:
    """Register the global options and the command ``argv`` names (its first word after the
    global options), or every command when it names none that is known (no arguments,
    ``--help``, a misspelt command: the help and the error list them all)."""
    name = command_name(argv or [])
    modules = [COMMANDS[name]] if name in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in [GLOBAL_OPTIONS, *modules]:
        importlib.import_module(module)


def command_name(argv: Sequence[str]) -> str | None:
    """The command word of a command line: the first word that is neither a global option
    nor its value (None when an option such as ``--help`` comes first, or there is none)."""
    words = iter(argv)
    for word in words:
        if word in _VALUED_OPTIONS:
            next(words, None)
        elif not any(word.startswith(option + "=") for option in _VALUED_OPTIONS):
            return None if word.startswith("-") else word
    return None

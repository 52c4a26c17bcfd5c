"""The ``privsched`` command line: a thin layer over the Python API.

Each command group lives in its own module and registers itself on :data:`app`. Command
modules import heavy libraries (torch, opacus, ray) only inside command bodies, so that
``privsched --help`` stays fast.
"""

from __future__ import annotations

import importlib

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
    "privsched.cli.ledger_cmds",
    "privsched.cli.sim_cmds",
    "privsched.cli.service_cmds",
    "privsched.cli.demo_cmds",
)

for _name in _COMMAND_MODULES:
    importlib.import_module(_name)


def main() -> None:
    app()

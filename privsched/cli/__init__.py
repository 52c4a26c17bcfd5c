"""The ``privsched`` command line: a thin layer over the Python API.

Each command group lives in its own module and registers itself on the Typer application
of :mod:`privsched.cli.registry`. :func:`main` imports only the module of the command it
runs, and command modules import heavy libraries (torch, opacus, ray, matplotlib, scipy,
even the ledger) only inside command bodies, so that each command pays only for what it
uses. ``privsched.cli.app`` is the application with every command registered.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
import warnings
from typing import Any, NoReturn

import typer

from privsched.cli.registry import command_name, load_commands
from privsched.errors import PrivschedError
from privsched.text import printable


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module 'privsched.cli' has no attribute {name!r}")
    from privsched.cli.registry import app

    load_commands()
    return app


def main() -> None:
    """Run the CLI. A usage error (an unknown command or option, a value that does not
    parse) is reported like every other bad input: one ``error:`` line on stderr; so is any
    :class:`~privsched.errors.PrivschedError`. Any other exception is a bug: its traceback,
    then one ``error:`` line saying so, exit status 70. Warnings raised by libraries (NumPy,
    Opacus) are held back: shown as one line each after a command that succeeded, dropped
    when it failed, so an error is always the only line."""
    from privsched.cli.registry import app

    global _skipping_teardown
    argv = sys.argv[1:]
    load_commands(argv)
    # Without a command word only the help (or a usage error) is printed: nothing to close.
    _skipping_teardown = command_name(argv) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            code = app(standalone_mode=False, prog_name="privsched")  # its name under `python -m` too: completion binds it
        except typer.TyperException as exc:  # click's usage and parameter errors
            message = " ".join((exc.format_message() if hasattr(exc, "format_message") else str(exc)).split())
            if message:  # empty after the help printed for a bare `privsched`
                print(f"error: {printable(message)}", file=sys.stderr)
            sys.exit(getattr(exc, "exit_code", 2))
        except typer.Abort:
            print("aborted", file=sys.stderr)
            sys.exit(130)
        except PrivschedError as exc:  # a refusal no command turned into a message itself
            print(f"error: {printable(' '.join(str(exc).split()))}", file=sys.stderr)
            sys.exit(1)
        except Exception:  # a bug, not bad input: show it as one
            traceback.print_exc()
            print("error: internal error in privsched (a bug; the traceback above says where)", file=sys.stderr)
            sys.exit(70)
    code = code if isinstance(code, int) else 0
    if code == 0:
        for line in dict.fromkeys(f"{w.category.__name__}: {' '.join(str(w.message).split())}" for w in caught):
            print(f"warning: {printable(line)}", file=sys.stderr)
    _exit(code)


def skip_teardown() -> None:
    """Called by a command whose results are written and closed by the time it returns: the
    interpreter's teardown of every module's objects costs CPU that nothing needs (0.1–0.3 s
    after a simulation, for its large arrays and DPack's Numba kernels; 15–40 ms after a
    command that loaded NumPy and pydantic). :func:`main` then ends the process after its
    exit handlers, without it, if the command succeeded (it has no effect otherwise)."""
    global _skipping_teardown
    _skipping_teardown = True


#: Whether the running command called :func:`skip_teardown`.
_skipping_teardown = False


def _exit(code: int) -> NoReturn:
    """End the process with ``code``; after a successful command that called
    :func:`skip_teardown`, in the ``privsched`` program itself (not a host calling
    :func:`main`) with no other thread left, run the exit handlers and flush the standard
    streams as at a normal exit, then end without the interpreter's teardown."""
    if code == 0 and _skipping_teardown and threading.active_count() == 1 and _is_program():
        atexit._run_exitfuncs()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # a closed pipe: Python's own exit status when its final flush fails
            os._exit(120)
        os._exit(0)
    sys.exit(code)


def _is_program() -> bool:
    """Whether the process's main program is this entry point: the console script and
    ``python -m privsched`` both run ``main`` imported into ``__main__``."""
    return getattr(sys.modules.get("__main__"), "main", None) is main

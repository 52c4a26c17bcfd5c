"""User and quota commands: ``user add``, ``user list``, ``user revoke``, ``user allow-code``,
``user deny-code`` and ``quota set`` (on the local database, or through ``--server`` with an
admin's token): each is the client method ``add_user``, ``users``, ``revoke_user``,
``set_code_rights``, ``quota_usage`` or ``set_quota``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from privsched.cli import skip_teardown
from privsched.cli.common import DEFAULT_DB, DbOption, add_row, errors, fail, new_table, say, show
from privsched.cli.output import Format, OutputOption, chosen, emit
from privsched.cli.registry import app
from privsched.cli.remote_option import open_client

user_app = typer.Typer(help="Users of the HTTP API: roles, teams and bearer tokens.", no_args_is_help=True)
app.add_typer(user_app, name="user")


@user_app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="User name.")],
    role: Annotated[str, typer.Option(help="admin, submitter or viewer.")],
    team: Annotated[Optional[str], typer.Option(help="The user's team (datasets may be limited to teams).")] = None,
    code: Annotated[bool, typer.Option("--code", help="A submitter that may submit code jobs (function:); admins always may.")] = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Create a user and print its bearer token (shown only this once; only its hash is kept)."""
    skip_teardown()
    with open_client(db) as client, errors():
        token = client.add_user(name, role, team, code=code)
    say(token)


@user_app.command("list")
def user_list(db: DbOption = DEFAULT_DB) -> None:
    """List users with their role, team and whether their token is revoked."""
    skip_teardown()
    with open_client(db) as client, errors():
        users = client.users()
    table = new_table("name", "role", "team", "code", "created", "revoked")
    for user in users:
        revoked = user["revoked_at"]
        code = "yes" if user["role"] == "admin" or user.get("code") else "no"
        add_row(
            table,
            user["name"],
            user["role"],
            user["team"] or "-",
            code,
            _when(user["created_at"]),
            "-" if revoked is None else _when(revoked),
        )
    show(table)


@user_app.command("revoke")
def user_revoke(
    name: Annotated[str, typer.Argument(help="User name.")],
    db: DbOption = DEFAULT_DB,
) -> None:
    """Revoke a user's token: every request with it is refused from now on."""
    skip_teardown()
    with open_client(db) as client, errors():
        client.revoke_user(name)
    say(f"user {name} revoked")


@user_app.command("allow-code")
def user_allow_code(
    name: Annotated[str, typer.Argument(help="A submitter's name.")],
    db: DbOption = DEFAULT_DB,
) -> None:
    """Let a submitter submit code jobs (function:), whose own code reads the data."""
    _set_code(name, True, db)


@user_app.command("deny-code")
def user_deny_code(
    name: Annotated[str, typer.Argument(help="A submitter's name.")],
    db: DbOption = DEFAULT_DB,
) -> None:
    """Take a submitter's right to submit code jobs away (its pipelines already submitted stay)."""
    _set_code(name, False, db)


def _set_code(name: str, allowed: bool, db: Path) -> None:
    skip_teardown()
    with open_client(db) as client, errors():
        client.set_code_rights(name, allowed)
    say(f"user {name} {'may' if allowed else 'may no longer'} submit code jobs")


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).isoformat(sep=" ", timespec="seconds")


quota_app = typer.Typer(help="Team quotas: the share of each block's capacity a team may hold.", no_args_is_help=True)
app.add_typer(quota_app, name="quota")


@quota_app.command("list")
def quota_list(
    dataset: Annotated[Optional[str], typer.Argument(help="Only this dataset's quotas.")] = None,
    output: OutputOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Per dataset and team: the quota (a share of each block's capacity), what the team holds
    (granted, running and consumed) and what it consumed for good, each as the largest share of
    a block's capacity (through --server: a user who is not an admin sees its own team's)."""
    skip_teardown()
    fmt = chosen(output)
    with open_client(db) as client, errors():
        usage = client.quota_usage(dataset)
    if fmt is not Format.text:
        emit([vars(row) for row in usage], fmt)
        return
    table = new_table("dataset", "team", "quota", "held", "consumed", caption="shares of a block's capacity (the fullest block)")
    for row in usage:
        add_row(table, row.dataset, row.team, *(f"{100 * v:.3g} %" for v in (row.share, row.held, row.consumed)))
    show(table)


@quota_app.command("set")
def quota_set(
    dataset: Annotated[str, typer.Argument(help="Dataset.")],
    team: Annotated[str, typer.Argument(help="Team.")],
    share: Annotated[str, typer.Argument(help="Share of each block's capacity in [0, 1], or 'none' to lift it.")],
    db: DbOption = DEFAULT_DB,
) -> None:
    """Cap what a team may hold (allocated plus consumed) on each block of a dataset."""
    skip_teardown()
    try:
        value = None if share == "none" else float(share)
    except ValueError:
        fail(f"share must be a number in [0, 1] or 'none', got {share!r}")
    with open_client(db) as client, errors():
        client.set_quota(dataset, team, value)
    say(f"quota of team {team} on {dataset}: {'none' if value is None else f'{value:g} of each block'}")

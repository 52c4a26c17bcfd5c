"""The user and quota commands on a local database, through the client's methods: a
token that authenticates, a revocation that stops it, a quota that the ledger records,
and bad input refused in one line with nothing changed."""

from __future__ import annotations

from pathlib import Path

from privsched import connect
from privsched.ledger.identities import Identities

from .cli_inprocess import invoke


def make_dataset(db: Path) -> None:
    with connect(db) as client:
        client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")


def test_a_user_added_locally_gets_a_token_that_authenticates_until_revoked(tmp_path: Path):
    db = tmp_path / "p.db"
    make_dataset(db)
    added = invoke("user", "add", "alice", "--role", "submitter", "--team", "blue", db=db)
    assert added.code == 0, added.stderr
    token = added.stdout.strip()
    with Identities(db) as identities:
        user = identities.authenticate(token)
        assert user is not None and (user.name, user.role, user.team) == ("alice", "submitter", "blue")
    listed = invoke("user", "list", db=db)
    assert listed.code == 0 and "alice" in listed.stdout and "submitter" in listed.stdout
    revoked = invoke("user", "revoke", "alice", db=db)
    assert (revoked.code, revoked.stdout) == (0, "user alice revoked\n")
    with Identities(db) as identities:
        assert identities.authenticate(token) is None


def test_a_quota_set_locally_is_recorded_and_lifted(tmp_path: Path):
    db = tmp_path / "p.db"
    make_dataset(db)
    done = invoke("quota", "set", "reviews", "blue", "0.25", db=db)
    assert (done.code, done.stdout) == (0, "quota of team blue on reviews: 0.25 of each block\n"), done.stderr
    with connect(db) as client:
        assert client.set_quota("reviews", "red", 0.5) == {"blue": 0.25, "red": 0.5}
    lifted = invoke("quota", "set", "reviews", "blue", "none", db=db)
    assert (lifted.code, lifted.stdout) == (0, "quota of team blue on reviews: none\n")
    with connect(db) as client, Identities(db) as identities:
        assert identities.quotas(client.dataset("reviews").id) == {"red": 0.5}


def test_a_quota_on_an_unknown_dataset_or_out_of_range_is_one_line_and_changes_nothing(tmp_path: Path):
    db = tmp_path / "p.db"
    make_dataset(db)
    for args in (["nope", "blue", "0.5"], ["reviews", "blue", "1.5"], ["reviews", "blue", "half"]):
        refused = invoke("quota", "set", *args, db=db)
        assert refused.code == 1 and refused.stdout == "", args
        assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1, refused.stderr
    with connect(db) as client, Identities(db) as identities:
        assert identities.quotas(client.dataset("reviews").id) == {}


def test_user_commands_on_a_missing_database_fail_in_one_line_and_create_nothing(tmp_path: Path):
    db = tmp_path / "missing.db"
    for args in (["user", "add", "alice", "--role", "admin"], ["user", "list"], ["user", "revoke", "alice"]):
        refused = invoke(*args, db=db)
        assert refused.code == 1 and refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1, args
    assert not db.exists()

"""The Ray executor against a real one-machine Ray cluster with token authentication on
(``RAY_AUTH_MODE=token``): it sends the operator's token, refuses a missing or wrong one with
one line, and no job ever sees the token."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from privsched import connect
from privsched.service.executors.ray import RayExecutor
from privsched.service.executors.ray_local import local_cluster
from tests.support.ray import db, ended, serving, user_job, wait_until  # noqa: F401 -- db: the fixture

TOKEN = secrets.token_hex(32)
#: How :func:`local_cluster` says that ``ray start`` failed (its only ``RuntimeError``).
RAY_START_FAILED = "ray start failed"


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    """A Ray head with 2 CPUs that answers only to ``TOKEN``; the tests are skipped only if
    ``ray start`` itself fails (this Ray cannot start such a cluster here), never for an
    error once it runs."""
    with ExitStack() as stack:
        try:
            address = stack.enter_context(local_cluster(cpus=2, token=TOKEN))
        except RuntimeError as exc:
            if not str(exc).startswith(RAY_START_FAILED):
                raise
            pytest.skip(f"a Ray cluster cannot start here: {exc}")
        yield address


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Ray token anywhere: neither variable, and a home without ~/.ray/auth_token."""
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def test_a_cluster_that_wants_a_token_and_gets_none_is_a_one_line_error(address: str, no_token: None):
    with pytest.raises(ValueError) as refused:
        RayExecutor(address)
    message = str(refused.value)
    assert message == (
        f"the Ray cluster at {address} requires an authentication token: set RAY_AUTH_TOKEN or "
        "RAY_AUTH_TOKEN_PATH, or write it to ~/.ray/auth_token"
    )


def test_a_wrong_token_is_a_one_line_error_that_does_not_show_it(
    address: str, no_token: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run_cli
):
    wrong = secrets.token_hex(32)
    monkeypatch.setenv("RAY_AUTH_TOKEN", wrong)
    with pytest.raises(ValueError, match="^the Ray cluster at .* refused the Ray token: it is invalid or incorrect$"):
        RayExecutor(address)
    with connect(tmp_path / "p.db"):
        pass
    served = run_cli(
        "serve",
        "--executor",
        "ray",
        "--ray-address",
        address,
        "--until-idle",
        "--sandbox",
        "none",
        env={"PRIVSCHED_DB": str(tmp_path / "p.db"), "RAY_AUTH_TOKEN": wrong, "HOME": str(tmp_path)},
    )
    assert served.returncode == 1 and served.stdout == ""
    assert served.stderr == f"error: the Ray cluster at {address} refused the Ray token: it is invalid or incorrect\n"


def test_an_unreadable_token_file_is_a_one_line_error(no_token: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="^cannot read the Ray token file '.*missing': .*No such file"):
        RayExecutor("http://127.0.0.1:1")


def test_with_the_token_from_its_file_jobs_run_and_none_sees_the_token(
    address: str,
    no_token: None,
    db: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
):
    token_file = tmp_path / "ray-token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token_file))
    assert "Bearer" not in repr(RayExecutor(address))
    with serving(db, address) as check, connect(db) as client:
        run = client.submit(user_job("secrets", "tests.ray_jobs:reports_secret_variables", blocks=1))
        wait_until(ended(client, run.id), check)
        assert run.status == "completed", run.message
        assert run.metrics["environ"] == [] and run.metrics["proc"] == [], run.metrics
        folder = client.runs.folder(run.id)
    written = b"".join(path.read_bytes() for path in folder.rglob("*") if path.is_file())
    assert TOKEN.encode() not in written and b"RAY_AUTH_TOKEN" not in written

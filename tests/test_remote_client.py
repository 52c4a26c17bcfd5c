"""``ps.connect(url, token=...)``: the local client's methods over the HTTP API, answers
equal to the local client's, concurrent clients that never over-spend, no heavy imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import privsched as ps
from privsched.client import Client
from privsched.ledger import Ledger
from privsched.remote import RemoteClient, RemoteError
from privsched.spec import SpecError
from tests.conftest import REPO
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture
from tests.support.blockdata import block_files

#: Client methods a remote client has too (the rest run a scheduler in-process or read files).
SHARED_METHODS = (
    "create_dataset",
    "datasets",
    "dataset",
    "add_blocks",
    "blocks",
    "unlock",
    "submit",
    "submit_many",
    "run",
    "list",
    "status",
    "wait_for_change",
    "cancel",
    "log_chunk",
    "logs",
    "result",
    "download",
    "scheduler",
    "audit",
)


def test_connect_with_an_address_gives_a_remote_client_with_the_local_methods(server: Server):
    client = ps.connect(server.url, token=server.tokens["admin"])
    assert isinstance(client, RemoteClient)
    for name in SHARED_METHODS:
        assert callable(getattr(Client, name)) and callable(getattr(client, name)), name


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def test_remote_answers_equal_the_local_clients(server: Server):
    remote = ps.connect(server.url, token=server.tokens["admin"])
    run = remote.submit(spec(blocks=["b0", "b1"]))
    remote.create_dataset("rdp", epsilon=10, delta=1e-7, teams=["red"])
    remote.add_blocks("rdp", block_files(server.db.parent, ["d1"], ".npz"), unlocked=0.5)
    with ps.connect(server.db) as local:
        for field in ("id", "name", "state", "owner", "block_keys", "demands", "job", "resources", "message"):
            assert same(getattr(local.status(run.id), field), getattr(remote.status(run.id), field)), field
        for mine, theirs in zip(local.blocks(), remote.blocks(), strict=True):
            assert all(
                same(getattr(mine, f), getattr(theirs, f))
                for f in ("key", "dataset", "capacity", "locked", "unlocked", "allocated", "consumed")
            )
        assert same(local.dataset("rdp").capacity, remote.dataset("rdp").capacity)
        assert local.dataset("rdp").accounting == remote.dataset("rdp").accounting
        assert remote.audit().ok and remote.audit().events == local.audit().events


def test_a_refusal_raises_a_one_line_value_error_with_its_status(server: Server):
    remote = ps.connect(server.url, token=server.tokens["bob"])
    with pytest.raises(RemoteError) as refused:
        remote.create_dataset("x", epsilon=1, delta=1e-6)
    assert refused.value.status == 403 and isinstance(refused.value, ValueError)
    with pytest.raises(RemoteError, match="unknown pipeline 99"):
        remote.status(99)
    with pytest.raises(RemoteError, match="cannot reach"):
        RemoteClient("http://127.0.0.1:9", "t").datasets()


@pytest.mark.parametrize("user", ["alice", "vera"])
def test_an_invalid_specification_gets_the_local_error_and_writes_nothing(server: Server, tmp_path, user):
    bad = {**spec(blocks=["b0"]), "epsilon": -1.0, "colour": "red"}
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(bad))  # JSON is YAML
    remote = ps.connect(server.url, token=server.tokens[user])
    with Ledger(server.db) as ledger:
        before = ledger.list_pipelines()
    with Client(server.db) as local:
        for candidate in (bad, path):
            with pytest.raises(SpecError) as here:
                local.submit(candidate)
            with pytest.raises(SpecError) as there:
                remote.submit(candidate)
            assert str(there.value) == str(here.value)
    with Ledger(server.db) as ledger:
        assert ledger.list_pipelines() == before


def test_an_unreachable_server_names_an_invalid_specification_first(tmp_path):
    unreachable = RemoteClient("http://127.0.0.1:9", "t")
    with pytest.raises(SpecError, match="epsilon"):
        unreachable.submit({**spec(blocks=["b0"]), "epsilon": -1.0})
    with pytest.raises(RemoteError, match="cannot reach"):
        unreachable.submit(spec(blocks=["b0"]))


def test_eight_concurrent_remote_clients_never_over_spend(server: Server):
    """Submitters and cancellers race a granting loop; the ledger stays within capacity."""
    stop = threading.Event()
    errors: list[BaseException] = []  # what went wrong in any thread, asserted empty at the end

    def collecting(target, *args) -> threading.Thread:
        def body() -> None:
            try:
                target(*args)
            except BaseException as exc:
                errors.append(exc)

        return threading.Thread(target=body)

    def grant() -> None:
        with Ledger(server.db) as ledger:
            while not stop.is_set():
                ledger.grant([p.id for p in ledger.list_pipelines(states=["pending"])])

    def work(user: str, n: int) -> None:
        client = ps.connect(server.url, token=server.tokens[user])
        for i in range(6):
            run = client.submit(spec(name=f"{user}{n}-{i}", blocks=[f"b{(n + i) % 4}", f"b{(n + i + 1) % 4}"], epsilon=0.15))
            if i % 2:
                try:
                    run.cancel()
                except RemoteError as exc:  # already granted and running is fine; anything else is not
                    if "has already ended" not in str(exc):
                        raise

    granter = collecting(grant)
    granter.start()
    workers = [collecting(work, user, n) for n, user in enumerate(["alice", "bob"] * 4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stop.set()
    granter.join()
    assert errors == []
    with Ledger(server.db) as ledger:
        assert len(ledger.list_pipelines()) == 48
        assert ledger.audit().ok
        for block in ledger.list_blocks("reviews"):
            assert np.all(block.allocated + block.consumed <= block.capacity + 1e-12)


def test_the_remote_command_line_imports_no_torch_opacus_ray_numpy_pydantic_or_sqlite(server: Server, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: t\ndataset: reviews\nblocks: [b0]\nepsilon: 0.5\ndelta: 1e-8\n"
        "job: {kind: dpsgd, params: {model: mlp, sample_rate: 0.1, epochs: 1, lr: 0.1}}\n"
    )
    code = (
        "import sys\nfrom privsched import cli\nsys.argv = ['privsched', 'submit', sys.argv[1]]\n"
        "try:\n    cli.main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'opacus', 'ray', 'numpy', 'pydantic', 'sqlite_utils', 'sqlite3'}))"
    )
    env = {**os.environ, "PRIVSCHED_SERVER": server.url, "PRIVSCHED_TOKEN": server.tokens["alice"], "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    pipeline_id, imported = done.stdout.splitlines()
    assert imported == "[]"
    with Ledger(server.db) as ledger:  # the server computed the DP-SGD demand
        assert ledger.get_pipeline(int(pipeline_id)).mechanism is not None

"""Results out: what a pipeline released and the files its job left, read back locally, over
the HTTP API and on the command line, by whoever may read them (a code job's by its
submitter and admins only)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import privsched as ps
from privsched.client import Client
from privsched.errors import BadInput, NotFound
from privsched.ledger.identities import Identities
from privsched.remote import RemoteClient, RemoteError
from privsched.server.runner import Listen, http_api
from privsched.service.rundirs import RunDirs
from tests.conftest import REPO
from workloads.reviews import write_blocks

STATISTIC = {"kind": "statistic", "params": {"query": "count"}}
MODEL = {"kind": "dpsgd", "params": {"model": "logreg", "sample_rate": 0.1, "epochs": 1, "lr": 0.5}}
CODE = {"function": "tests.sandbox_jobs:counts_then_stops", "pythonpath": [str(REPO)], "params": {"epsilon": 0.2, "too_much": 5.0}}


@dataclass
class Served:
    url: str
    db: Path
    tokens: dict[str, str]
    ids: dict[str, int]  # pipeline name -> id

    def remote(self, user: str) -> RemoteClient:
        return RemoteClient(self.url, self.tokens[user])

    def get(self, path: str, user: str) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.tokens[user]}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    """A database of two days of synthetic reviews (basic accounting, ε_G = 10, δ_G = 1e-6),
    where alice submitted, through the server, a count, a DP-SGD model and a code job that
    counts through a primitive, all run to their end."""
    folder = tmp_path_factory.mktemp("results")
    db = folder / "p.db"
    paths = write_blocks(folder / "data", days=2, per_day=200, seed=5)
    with ps.connect(db) as client:
        client.create_dataset("reviews", epsilon=10.0, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", [(f"b{i}", str(p)) for i, p in enumerate(paths)], unlocked=1.0)
    with Identities(db) as identities:
        tokens = {
            "admin": identities.add_user("admin", "admin"),
            "alice": identities.add_user("alice", "submitter", "blue", code=True),
            "bob": identities.add_user("bob", "submitter", "blue"),
            "vera": identities.add_user("vera", "viewer", "blue"),
        }
    with http_api(db, Listen("127.0.0.1", 0)) as bound:
        with RemoteClient(bound.url, tokens["alice"]) as alice:
            ids = {
                name: alice.submit({"name": name, "dataset": "reviews", "blocks": ["b0", "b1"], "epsilon": eps, **extra, "job": job}).id
                for name, eps, extra, job in (
                    ("count", 0.5, {}, STATISTIC),
                    ("model", 2.0, {"delta": 1e-7}, MODEL),
                    ("code", 0.5, {}, CODE),
                )
            }
        with ps.connect(db) as client:
            client.run_until_idle()
            assert {client.status(i).state for i in ids.values()} == {"completed"}, [client.status(i).message for i in ids.values()]
        yield Served(bound.url, db, tokens, ids)


def test_a_statistic_result_holds_its_released_value_and_its_charge_per_block(served: Served):
    with ps.connect(served.db) as client:
        result = client.result(served.ids["count"])
    assert (result.state, result.job, result.reason, result.declarative) == ("completed", "statistic", None, True)
    assert result.metrics["query"] == "count" and isinstance(result.metrics["value"], float)
    assert result.charged == {"b0": 0.5, "b1": 0.5} and result.epsilon == 0.5 and result.delta == 1e-6
    assert result.first_access is not None and [a.name for a in result.artifacts] == ["metrics.json"]


def test_a_code_jobs_result_holds_each_value_its_primitives_released(served: Served):
    with ps.connect(served.db) as client:
        result = client.result(served.ids["code"])
    assert [(r["query"], r["epsilon"]) for r in result.releases] == [("count", 0.2)]  # the refused one released nothing
    assert result.releases[0]["value"] == result.metrics["count"]
    assert result.charged == {"b0": 0.2, "b1": 0.2} and not result.declarative


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_downloaded_model_loads_into_its_named_architecture_with_weights_only(served: Served, tmp_path: Path, where: str):
    import torch

    from privsched.trainers.models import build_model

    client = ps.connect(served.db) if where == "local" else served.remote("alice")
    with client:
        run = client.run(served.ids["model"])
        written = run.download(tmp_path)
        architecture = run.metrics["architecture"]
    assert sorted(p.name for p in written) == ["metrics.json", "model.pt"]
    model = build_model(**architecture)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    assert architecture["name"] == "logreg" and sum(p.numel() for p in model.parameters()) > 0


def test_a_remote_result_equals_the_local_one(served: Served):
    with ps.connect(served.db) as local, served.remote("alice") as remote:
        for pipeline_id in served.ids.values():
            assert remote.result(pipeline_id) == local.result(pipeline_id)


def test_a_viewer_reads_a_declarative_jobs_result_and_artifacts(served: Served):
    status, body = served.get(f"/v1/pipelines/{served.ids['count']}/result", "vera")
    assert status == 200 and json.loads(body)["metrics"]["query"] == "count"
    status, body = served.get(f"/v1/pipelines/{served.ids['model']}/artifacts/model.pt", "vera")
    assert status == 200 and len(body) > 0


@pytest.mark.parametrize("user", ["vera", "bob"])
def test_only_its_submitter_and_admins_read_a_code_jobs_result_or_artifacts(served: Served, user: str):
    code = served.ids["code"]
    for path in (f"/v1/pipelines/{code}/result", f"/v1/pipelines/{code}/artifacts/anything"):
        status, body = served.get(path, user)
        assert status == 403 and "only its submitter and admins" in json.loads(body)["error"]
        assert b"count" not in body
    for reader in ("alice", "admin"):
        assert served.get(f"/v1/pipelines/{code}/result", reader)[0] == 200


@pytest.mark.parametrize("name", ["..%2Fp.db", "%2E%2E/%2E%2E/p.db", ".hidden", "a//b", "model.pt%00"])
def test_an_artifact_name_outside_the_work_folder_is_refused(served: Served, name: str):
    status, body = served.get(f"/v1/pipelines/{served.ids['model']}/artifacts/{name}", "alice")
    assert status in (400, 404) and "error" in json.loads(body)


def test_a_link_the_job_left_in_its_work_folder_is_neither_listed_nor_served(tmp_path: Path):
    runs = RunDirs(tmp_path / "p.db")
    work = runs.workdir(1)
    work.mkdir(parents=True)
    (tmp_path / "secret").write_text("ledger")
    (work / "link").symlink_to(tmp_path / "secret")
    (work / "folder").symlink_to(tmp_path)
    (work / "model.pt").write_bytes(b"weights")
    assert [a.name for a in runs.artifacts(1)] == ["model.pt"]
    for name in ("link", "folder/secret"):
        with pytest.raises(NotFound):
            runs.open_artifact(1, name)
    with pytest.raises(BadInput, match="not an artifact name"):
        runs.open_artifact(1, "../secret")


def test_result_prints_text_and_json_and_download_writes_the_files(served: Served, run_cli, tmp_path: Path):
    local = {"PRIVSCHED_DB": str(served.db)}
    text = run_cli("result", served.ids["count"], env=local)
    assert text.returncode == 0 and "charged: ε 0.5 at δ=1e-06 (b0 0.5, b1 0.5)" in text.stdout
    assert 'metric query: "count"' in text.stdout
    remote = {"PRIVSCHED_SERVER": served.url, "PRIVSCHED_TOKEN": served.tokens["alice"]}
    answer = run_cli("result", served.ids["code"], "-o", "json", env=remote)
    assert answer.returncode == 0 and json.loads(answer.stdout)["releases"][0]["query"] == "count"
    fetched = run_cli("download", served.ids["model"], "--out", tmp_path / "out", "--name", "model.pt", env=remote)
    assert fetched.returncode == 0 and (tmp_path / "out" / "model.pt").stat().st_size > 0
    refused = run_cli("result", served.ids["code"], env={**remote, "PRIVSCHED_TOKEN": served.tokens["vera"]})
    assert refused.returncode == 1 and refused.stderr.startswith("error: pipeline") and refused.stderr.count("\n") == 1


def test_status_shows_what_a_completed_pipeline_released(served: Served, run_cli):
    shown = run_cli("status", served.ids["count"], env={"PRIVSCHED_DB": str(served.db)})
    assert shown.returncode == 0 and 'metric query: "count"' in shown.stdout and "artifact metrics.json" in shown.stdout
    remote = {"PRIVSCHED_SERVER": served.url, "PRIVSCHED_TOKEN": served.tokens["vera"]}
    hidden = run_cli("status", served.ids["code"], env=remote)  # another user's code job: no result, no error
    assert hidden.returncode == 0 and "metric" not in hidden.stdout and "released" not in hidden.stdout


def test_a_pipeline_that_has_not_ended_lists_and_serves_no_artifact(tmp_path: Path):
    paths = write_blocks(tmp_path / "data", days=1, per_day=20, seed=1)
    with Client(tmp_path / "p.db") as client:
        client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", [("b0", str(paths[0]))], unlocked=1.0)
        run = client.submit({"name": "p", "dataset": "reviews", "blocks": ["b0"], "epsilon": 0.1, "job": STATISTIC})
        client.runs.workdir(run.id).mkdir(parents=True)
        (client.runs.workdir(run.id) / "early.txt").write_text("not yet")
        assert run.result.artifacts == [] and run.metrics == {}
        with pytest.raises(NotFound, match="has not ended"):
            client.open_artifact(run.id, "early.txt")


def test_a_remote_download_of_a_missing_artifact_raises_the_servers_refusal(served: Served, tmp_path: Path):
    with served.remote("alice") as client, pytest.raises(RemoteError, match="no artifact") as caught:
        client.download(served.ids["model"], tmp_path, ["nothing.pt"])
    assert caught.value.status == 404 and not os.listdir(tmp_path)


def test_an_artifact_over_the_size_limit_is_listed_but_not_served(tmp_path: Path):
    from privsched.results import MAX_ARTIFACT

    runs = RunDirs(tmp_path / "p.db")
    runs.workdir(1).mkdir(parents=True)
    with open(runs.workdir(1) / "huge.bin", "wb") as stream:
        stream.truncate(MAX_ARTIFACT + 1)  # sparse: no disk used
    assert [a.size for a in runs.artifacts(1)] == [MAX_ARTIFACT + 1]
    with pytest.raises(BadInput, match="over the"):
        runs.open_artifact(1, "huge.bin")


@given(st.text(alphabet=st.sampled_from("ab./_-\\\x00~"), max_size=12) | st.text(max_size=12))
@settings(max_examples=300, deadline=None)
def test_an_accepted_artifact_name_always_names_a_file_below_its_folder(name: str):
    from privsched.results import check_artifact_name

    try:
        check_artifact_name(name)
    except BadInput:
        return
    root = Path("/runs/p/1/work")
    parts = name.split("/")
    assert all(part and not part.startswith(".") for part in parts)
    assert os.path.normpath(root / name).startswith(str(root) + "/")

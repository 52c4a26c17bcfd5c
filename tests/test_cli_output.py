"""``-o text|json|yaml``: the listings as documents for programs, in the HTTP API's shapes,
given before or after the command word; a value that is not a format is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import privsched as ps
from privsched.server.models import BlockOut, BudgetOut, DatasetOut, PipelineOut
from tests.cli_inprocess import invoke
from tests.support.blockdata import block_files


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """An RDP dataset ``taxi`` with two half-unlocked blocks and one pending count on both."""
    path = tmp_path / "o.db"
    with ps.connect(path) as client:
        client.create_dataset("taxi", epsilon=10.0, delta=1e-6)
        client.add_blocks("taxi", block_files(tmp_path, ["2026-11-08", "2026-11-09"]), unlocked=0.5)
        client.submit(count("c", 0.1))
    return path


def count(name: str, epsilon: float, owner: str | None = None) -> dict:
    spec = {"name": name, "dataset": "taxi", "blocks": ["2026-11-08", "2026-11-09"], "epsilon": epsilon}
    return {**spec, "job": {"kind": "statistic", "params": {"query": "count"}}, **({"owner": owner} if owner else {})}


def document(db: Path, *args: str) -> object:
    done = invoke(*args, db=db)
    assert done.code == 0 and done.stderr == "", done.stderr
    return json.loads(done.stdout) if "json" in args else yaml.safe_load(done.stdout)


def test_list_as_json_holds_each_pipeline_as_the_api_answers_it(db: Path):
    (pipeline,) = document(db, "list", "-o", "json")
    assert PipelineOut.model_validate(pipeline).name == "c" and pipeline["state"] == "pending"


def test_output_given_before_the_command_word_applies_to_it(db: Path):
    assert document(db, "-o", "yaml", "list") == document(db, "list", "--output", "json")


def test_output_after_the_command_word_wins_over_one_before_it(db: Path):
    done = invoke("-o", "yaml", "dataset", "list", "-o", "json", db=db)
    assert [d["name"] for d in json.loads(done.stdout)] == ["taxi"]


def test_status_as_yaml_is_the_pipeline_as_the_api_answers_it(db: Path):
    assert PipelineOut.model_validate(document(db, "status", "1", "-o", "yaml")).block_keys == ["2026-11-08", "2026-11-09"]


def test_dataset_and_blocks_lists_as_json_are_the_api_models(db: Path):
    (dataset,) = document(db, "dataset", "list", "-o", "json")
    assert DatasetOut.model_validate(dataset).epsilon == 10.0
    blocks = document(db, "blocks", "list", "-o", "json")
    assert [BlockOut.model_validate(b).key for b in blocks] == ["2026-11-08", "2026-11-09"]


def test_budget_show_as_json_gives_each_block_its_shares_and_epsilon_at_delta_g(db: Path):
    (entry,) = document(db, "budget", "show", "-o", "json")
    block = BudgetOut.model_validate(entry).blocks[0]
    shares = block.shares
    assert shares.consumed + shares.allocated + shares.left == pytest.approx(1.0)
    assert shares.unlocked == pytest.approx(0.5) and block.delta == 1e-6 and block.detail is None


def test_budget_show_detail_as_yaml_adds_each_blocks_vectors(db: Path):
    (entry,) = document(db, "budget", "show", "--detail", "-o", "yaml")
    with ps.connect(db) as client:
        capacity = client.dataset("taxi").capacity.tolist()
    assert [block["detail"]["capacity"] for block in entry["blocks"]] == [capacity, capacity]


@pytest.mark.parametrize("args", [["list", "-o", "xml"], ["-o", "csv", "list"], ["budget", "show", "--output", "table"]])
def test_an_output_that_is_not_a_format_is_one_line_and_exit_2(db: Path, args: list[str]):
    done = invoke(*args, db=db)
    assert done.code == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: ") and "text" in done.stderr


def test_a_misspelt_dataset_gets_the_closest_name_in_its_error(db: Path):
    done = invoke("budget", "show", "taxy", db=db)
    assert done.code == 1 and done.stderr == "error: unknown dataset 'taxy'; did you mean 'taxi'?\n"


def test_a_dataset_name_far_from_every_other_gets_no_suggestion(db: Path):
    assert invoke("blocks", "list", "weather", db=db).stderr == "error: unknown dataset 'weather'\n"


def test_list_keeps_only_the_owner_asked_for(db: Path):
    with ps.connect(db) as client:
        client.submit(count("b", 0.1, owner="bob"))
    assert [p["owner"] for p in document(db, "list", "--owner", "bob", "-o", "json")] == ["bob"]


def test_list_mine_keeps_only_the_local_users_pipelines(db: Path):
    import getpass

    with ps.connect(db) as client:
        client.submit(count("b", 0.1, owner="someone-else"))
    assert {p["owner"] for p in document(db, "list", "--mine", "-o", "json")} == {getpass.getuser()}


def test_list_limit_keeps_the_most_recent(db: Path):
    with ps.connect(db) as client:
        later = [client.submit(count(f"p{i}", 0.1)).id for i in range(3)]
    assert [p["id"] for p in document(db, "list", "--limit", "2", "-o", "json")] == later[1:]


def test_list_watch_without_a_terminal_is_one_line_and_exit_2(db: Path):
    done = invoke("list", "--watch", db=db)
    assert done.code == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1


def test_list_mine_and_owner_together_are_refused(db: Path):
    done = invoke("list", "--mine", "--owner", "bob", db=db)
    assert done.code == 1 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "suggested"),
    [(["lsit"], "Did you mean 'list'"), (["budget", "shw"], "Did you mean 'show'"), (["list", "--stat", "pending"], "--state")],
)
def test_a_misspelt_command_or_option_gets_the_closest_names_in_one_line(db: Path, args: list[str], suggested: str):
    done = invoke(*args, db=db)
    assert done.code == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1 and suggested in done.stderr


def test_list_watch_on_a_terminal_redraws_until_interrupted_and_exits_0(db: Path):
    import os
    import pty
    import select
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[1]
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "200"}
    watching = subprocess.Popen(
        [sys.executable, "-m", "privsched", "list", "--watch", "--db", str(db)], stdout=follower, stderr=subprocess.PIPE, env=env
    )
    os.close(follower)
    seen, deadline = b"", time.monotonic() + 120
    try:
        while seen.count(b"\x1b[H\x1b[2J") < 2 or seen.count(b"pending") < 2:  # drawn twice, in place
            assert time.monotonic() < deadline, f"no redraw within 120 s: {seen!r}"
            if select.select([leader], [], [], 1.0)[0]:
                seen += os.read(leader, 65536)
    finally:
        watching.send_signal(signal.SIGINT)
        _, err = watching.communicate(timeout=60)
        os.close(leader)
    assert watching.returncode == 0 and err == b""

"""The dashboard's pages as JSON: every pipeline reachable through filters and pages, budgets
as shares of capacity that add up, teams and their quotas, results as tables."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.client import Client
from privsched.dashboard import views
from privsched.ledger import BlockInfo
from tests.server_fixtures import Server, server, spec  # noqa: F401
from tests.support.dashboard import populated_client, request

#: Pipelines the paging tests add to the populated ledger's five.
EXTRA = 31


def everything(dataset) -> bool:
    return True


def no_message(info) -> str | None:
    return info.message


def no_metrics(info) -> dict | None:
    return {}


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Iterator[Client]:
    """The populated ledger with :data:`EXTRA` more pending pipelines of owner ``cy``."""
    client = populated_client(tmp_path_factory.mktemp("pages") / "p.db")
    for i in range(EXTRA):
        client.ledger.submit(request(f"extra-{i}", ["d2"], 0.01, owner="cy"), now=100 + i)
    yield client
    client.close()


def page_of(client: Client, **filters) -> dict:
    return views.pipelines_page(client, everything, no_message, no_metrics, **filters)


@settings(max_examples=25, deadline=None)
@given(per_page=st.integers(1, 40))
def test_every_pipeline_is_reachable_through_the_pages_exactly_once(many: Client, per_page: int):
    first = page_of(many, per_page=per_page)
    seen = [row["id"] for page in range(1, first["pages"] + 1) for row in page_of(many, per_page=per_page, page=page)["rows"]]
    assert seen == sorted((info.id for info in many.list()), reverse=True)
    assert first["total"] == EXTRA + 5 and first["pages"] == -(-(EXTRA + 5) // per_page)


def test_a_page_past_the_last_shows_the_last(many: Client):
    assert page_of(many, page=99)["page"] == page_of(many)["pages"] == 2


@pytest.mark.parametrize(
    ("filters", "names"),
    [
        ({"state": "cancelled"}, ["stop"]),
        ({"owner": "bo[/]<b>"}, ["wait"]),
        ({"dataset": "reviews"}, []),
        ({"search": "EXTRA-30"}, ["extra-30"]),
        ({"search": "d1"}, ["wait", "done"]),  # a block key
        ({"state": "pending", "owner": "cy", "search": "extra-1"}, [f"extra-{i}" for i in (19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 1)]),
    ],
)
def test_the_pipelines_page_filters_by_state_owner_dataset_and_search(many: Client, filters: dict, names: list[str]):
    page = page_of(many, per_page=50, **filters)
    assert [row["name"] for row in page["rows"]] == names and page["total"] == len(names)


def test_the_filters_offer_every_state_owner_and_readable_dataset(many: Client):
    choices = views.pipelines_page(many, lambda d: d.name == "stats", no_message, no_metrics)["choices"]
    assert choices == {
        "state": ["cancelled", "completed", "granted", "pending", "running"],
        "owner": ["ana", "bo[/]<b>", "cy"],
        "dataset": ["stats"],
    }


def test_the_result_column_shows_the_headline_metrics_or_that_they_are_withheld(many: Client):
    released = {"epochs": 2, "column": None, "loss": 0.3, "architecture": {"name": "logreg"}, "accuracy": 0.91234567}
    page = views.pipelines_page(many, everything, no_message, lambda info: released, state="completed")
    assert page["rows"][0]["result"] == "accuracy = 0.912346, loss = 0.3, epochs = 2 (+1 more)"  # headline first, unset left out
    withheld = views.pipelines_page(many, everything, no_message, lambda info: None, state="completed")
    assert withheld["rows"][0]["result"] == "(shown to its submitter and admins)"
    assert page_of(many, state="cancelled")["rows"][0]["result"] == "cancelled while waiting for a grant"  # an end's reason
    assert page_of(many, state="pending")["rows"][0]["result"] == ""


def test_metrics_become_rows_of_names_and_values_not_json():
    metrics = {"value": 3.0, "architecture": {"name": "mlp", "hidden": [64, 32]}, "per_class": [{"f1": 0.5}, {"f1": 0.25}]}
    assert views.metric_rows(metrics) == [
        ("value", "3"),
        ("architecture.name", "mlp"),
        ("architecture.hidden", "64, 32"),
        ("per_class[0].f1", "0.5"),
        ("per_class[1].f1", "0.25"),
    ]


def test_a_placement_reads_as_words():
    assert views.placement_text({"executor": "local", "gpus": ["0", "1"], "host_name": "h1"}) == "executor local; gpus 0, 1; host name h1"


def block(consumed: float, allocated: float, unlocked: float) -> BlockInfo:
    capacity = np.array([1.0, 1e-6])
    shares = np.array([[consumed, allocated, unlocked]]).T * capacity
    locked = capacity - shares.sum(axis=0)
    return BlockInfo(1, "stats", "b", None, "active", 0.0, capacity, locked, shares[2], shares[1], shares[0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=3, max_size=3).filter(lambda s: sum(s) <= 1))
def test_a_blocks_used_and_left_shares_add_up_to_100_as_printed(many: Client, shares: list[float]):
    shown = views.block_view(block(*shares), many.dataset("stats"))
    assert f"{shown['used_percent'] + shown['left_percent']:.1f}" == "100.0"
    assert shown["used_percent"] == pytest.approx(100 * (shares[0] + shares[1]), abs=0.05 + 1e-9)


def test_a_pipeline_page_shows_each_demand_as_a_share_of_its_block_and_what_the_block_has_left(tmp_db: Path):
    with populated_client(tmp_db) as client:
        done = next(info for info in client.list() if info.name == "done")
        page = views.pipeline_page(client, done, None, outputs=True, job_text=True)
    (d1,) = page["demands"]
    assert (d1["block"], d1["dimension"], d1["demand_percent"], d1["left_percent"], d1["consumed_percent"]) == ("d1", "ε", 40.0, 80.0, 20.0)
    assert d1["detail"] == [
        {"dimension": "ε", "demand": 0.4, "left": 0.8},
        {"dimension": "δ", "demand": 1e-7, "left": pytest.approx(9.5e-7)},
    ]


def test_the_teams_page_shows_each_teams_quota_and_the_share_it_holds(server: Server):  # noqa: F811
    from privsched import connect

    assert server.call("PUT", "/v1/datasets/reviews/quotas/blue", {"share": 0.5})[0] == 200
    status, submitted = server.call("POST", "/v1/pipelines", {"spec": spec("a", "reviews", ["b0", "b1"], 0.2)}, user="alice")
    assert status in (200, 201), submitted
    with connect(server.db, create=False) as client:
        client.ledger.grant([submitted["id"]])
    status, page = server.call("GET", "/v1/dashboard/teams", user="vera")
    assert status == 200
    assert {d["name"]: d["teams"] for d in page} == {
        "reviews": [{"team": "blue", "quota_percent": 50.0, "held_percent": 20.0, "consumed_percent": 0.0, "pipelines": 1}]
    }  # secret is team red's: vera (blue) does not see it


def test_the_page_loads_only_its_own_assets_and_ships_the_charts_licence():
    import re
    from importlib import resources

    from privsched.server.dashboard import ASSETS

    static = resources.files("privsched.dashboard").joinpath("static")
    page = static.joinpath("index.html").read_text(encoding="utf-8")
    loaded = re.findall(r'(?:src|href)="([^"#]*)"', page)
    assert sorted(loaded) == sorted(f"/dashboard/static/{name}" for name in ASSETS)  # nothing from elsewhere (CSP 'self')
    assert "<script>" not in page and " style=" not in page  # no inline script or style
    assert """<meta http-equiv="Content-Security-Policy" content="default-src 'self';""" in page
    assert static.joinpath("uPlot.iife.min.js").read_text(encoding="utf-8").startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert "MIT License" in static.joinpath("uPlot.LICENSE").read_text(encoding="utf-8")


def test_the_pipelines_view_lists_only_readable_datasets_and_refuses_a_page_below_one(server: Server):  # noqa: F811
    for name, dataset, user in (("mine", "reviews", "alice"), ("theirs", "secret", "rita")):
        assert server.call("POST", "/v1/pipelines", {"spec": spec(name, dataset, ["b0"], 0.1)}, user=user)[0] == 201
    status, page = server.call("GET", "/v1/dashboard/pipelines?per_page=1", user="vera")
    assert status == 200 and [row["name"] for row in page["rows"]] == ["mine"] and page["choices"]["dataset"] == ["reviews"]
    status, refused = server.call("GET", "/v1/dashboard/pipelines?page=0", user="vera")
    assert status == 422 and "\n" not in refused["error"]

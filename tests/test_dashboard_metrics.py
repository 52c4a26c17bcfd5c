"""The dashboard's JSON views and /metrics read the ledger exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from privsched.dashboard import metrics, views
from tests.support.dashboard import populated_client


@pytest.fixture
def client(tmp_db: Path):
    client = populated_client(tmp_db)
    yield client
    client.close()


def everything(dataset) -> bool:
    return True


def samples(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render(client, everything, client.reasons()).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_parse_and_count_pipelines_by_state(client):
    found = samples(client)
    for state, count in {"pending": 1, "granted": 1, "running": 1, "completed": 1, "cancelled": 1, "failed": 0}.items():
        assert found[("privsched_pipelines", (("state", state),))] == count
    assert found[("privsched_grants_total", ())] == 3
    assert found[("privsched_job_runs_total", (("outcome", "completed"),))] == 1
    assert found[("privsched_admission_wait_time_seconds_count", ())] == 3
    # done waited 10 − 1, busy 10 − 2, ready 10 − 3 seconds.
    assert found[("privsched_admission_wait_time_seconds_sum", ())] == pytest.approx(24.0)
    assert found[("privsched_pending_wait_time_seconds_count", ())] == 1
    # "wait" asks d1 for ε 0.9 where 0.8 is unlocked: it waits for budget.
    assert found[("privsched_pending_pipelines", (("reason", "budget"),))] == 1
    assert found[("privsched_pending_pipelines", (("reason", "turn"),))] == 0


def test_block_fractions_in_metrics_match_the_ledger(client):
    found = samples(client)

    def key(block, bucket):
        return (
            "privsched_block_budget_fraction",
            (("block", block), ("bucket", bucket), ("dataset", "stats")),
        )

    # d1: capacity ε 1, consumed 0.2 after the completed job; δ: 5e-8 of 1e-6 — ε binds.
    assert found[key("d1", "consumed")] == pytest.approx(0.2)
    assert found[key("d1", "unlocked")] == pytest.approx(0.8)
    assert found[key("d2", "allocated")] == pytest.approx(0.3)
    assert found[key("d3", "allocated")] == pytest.approx(0.2)
    events = {labels: value for (name, labels), value in found.items() if name == "privsched_ledger_events_total"}
    assert events[(("kind", "grant"),)] == len([e for e in client.events() if e.kind == "grant"])


def test_views_show_every_block_queue_and_pipeline(client):
    datasets = {d["name"]: d for d in views.blocks_page(client, everything)}
    assert [b["key"] for b in datasets["stats"]["blocks"]] == ["d1", "d2", "d3"]
    d1 = datasets["stats"]["blocks"][0]
    assert d1["bar"]["consumed"] == pytest.approx(0.2) and d1["remaining"]["epsilon"] == pytest.approx(0.8)
    history = datasets["stats"]["history"]
    assert history[-1]["consumed"] == pytest.approx(0.2 / 3)
    assert history[-1]["given_out"] == pytest.approx((0.2 + 0.3 + 0.2) / 3)
    queue = views.queue_page(client, everything, client.reasons(), lambda info: info.message)
    assert [p["name"] for p in queue["pending"]] == ["wait"]
    assert queue["pending"][0]["reason"].startswith("budget: block d1 ε needs 0.9, unlocked 0.8")
    assert queue["pending"][0]["owner"] == "bo[/]<b>"
    assert [p["name"] for p in queue["running"]] == ["busy"] and queue["running"][0]["placement"] == "cpus 1; gpus 0"
    assert [p["name"] for p in queue["recent"]] == ["stop", "done"]
    done = views.pipeline_page(client, client.status(queue["recent"][1]["id"]), None, outputs=True, job_text=True)
    assert done["demands"][0]["demand"]["epsilon"] == pytest.approx(0.4)
    assert done["demands"][0]["consumed"]["epsilon"] == pytest.approx(0.2)
    assert views.audit_page(client)["ok"] is True


def test_the_pipeline_page_withholds_the_metrics_and_log_a_reader_may_not_read(client):
    done = next(info for info in client.list() if info.name == "done")
    page = views.pipeline_page(client, done, None, outputs=False, job_text=False)
    assert page["result"] is None and page["log_tail"] is None
    shown = views.pipeline_page(client, done, None, outputs=True, job_text=True)
    assert shown["result"]["metrics"] == [] and shown["log_tail"] == ""


def test_only_readable_datasets_reach_the_metrics(client):
    text = metrics.render(client, lambda dataset: dataset.name == "reviews", client.reasons()).decode()
    assert 'dataset="stats"' not in text and 'dataset="reviews"' in text
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text) for s in family.samples}
    assert found[("privsched_pipelines", (("state", "pending"),))] == 0


def test_metrics_are_served_to_a_viewer_token_and_refused_without_one(tmp_db: Path):
    import urllib.error
    import urllib.request

    from privsched.ledger.identities import Identities
    from privsched.server.runner import Listen, http_api

    populated_client(tmp_db).close()
    with Identities(tmp_db) as identities:
        token = identities.add_user("scraper", "viewer")
    with http_api(tmp_db, Listen("127.0.0.1", 0)) as bound:
        request = urllib.request.Request(bound.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            families = {family.name for family in text_string_to_metric_families(response.read().decode())}
        assert {"privsched_pipelines", "privsched_block_budget_fraction", "privsched_grants"} <= families
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bound.url + "/metrics", timeout=30)
        assert refused.value.code == 401

"""Every ε shown for a charged curve (dry run, status, dashboard, demo) is the one the ledger's
curve converts to on the dataset's orders at the dataset's δ_G, not one computed on another
order grid or at the pipeline's own δ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import privsched as ps
from privsched.budgets import rdp_to_epsilon
from privsched.client import Client
from privsched.dashboard.views import pipeline_page
from privsched.demo import epsilon_of
from privsched.ledger import DatasetInfo
from tests.support.blockdata import block_file

#: A DP-SGD model asking for ε = 4 at δ = 1e-9, its noise calibrated on Opacus' fine order grid.
MODEL = {
    "name": "model",
    "dataset": "reviews",
    "blocks": {"last": 2},
    "epsilon": 4.0,
    "delta": 1e-9,
    "job": {"kind": "dpsgd", "params": {"model": "logreg", "sample_rate": 0.05, "epochs": 2, "lr": 0.05}},
}


@pytest.fixture
def client(tmp_db: Path) -> Client:
    client = ps.connect(tmp_db)
    client.create_dataset("reviews", epsilon=10, delta=1e-7, accounting="rdp")
    client.add_blocks("reviews", [(f"2026-01-{d:02d}", block_file(tmp_db.parent, str(d))) for d in range(1, 4)])
    yield client
    client.close()


def converted(curve, dataset: DatasetInfo) -> float:
    """The charged curve's ε: Balle et al. 2020's conversion over the dataset's live orders at δ_G."""
    live = dataset.accounting.live(dataset.capacity)
    return rdp_to_epsilon(np.asarray(curve)[live], np.asarray(dataset.accounting.alphas)[live], dataset.delta)[0]


def test_a_dry_run_shows_the_epsilon_of_the_curve_it_would_charge_at_the_datasets_delta(client: Client):
    plan, dataset = client.dry_run(MODEL), client.dataset("reviews")
    assert plan.delta == dataset.delta
    assert plan.epsilon == converted(plan.demand, dataset)
    assert plan.lines()[0] == f"pipeline model on reviews: demand ε={plan.epsilon:.4g} at δ=1e-07"
    charged = client.status(client.submit(MODEL).id).demands
    assert all(np.array_equal(curve, plan.demand) for curve in charged.values())


def test_status_shows_the_epsilon_the_ledgers_curve_converts_to(client: Client):
    info, dataset, grants = client.grants(client.submit(MODEL).id)
    assert [grant.demand.epsilon for grant in grants] == [converted(info.demands[key], dataset) for key in info.block_keys]
    assert {grant.demand.delta for grant in grants} == {dataset.delta}


def test_the_dashboard_shows_the_epsilon_the_ledgers_curve_converts_to(client: Client):
    info = client.status(client.submit(MODEL).id)
    dataset = client.dataset("reviews")
    shown = [demand["demand"] for demand in pipeline_page(client, info, None, outputs=True, job_text=True)["demands"]]
    assert shown == [{"epsilon": converted(info.demands[key], dataset), "delta": dataset.delta} for key in info.block_keys]


def test_the_demo_labels_a_model_with_the_epsilon_its_charged_curve_converts_to(client: Client):
    info = client.status(client.submit(MODEL).id)
    dataset = client.dataset("reviews")
    for curve in info.demands.values():
        assert epsilon_of(curve, dataset) == converted(curve, dataset)

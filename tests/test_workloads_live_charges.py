"""The reference workloads charge what the live scheduler charges: a pipeline drawn by a
generator has the demand that submitting the job it stands for to a real ledger records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import privsched as ps
import workloads
from privsched.budgets import parse_mechanism
from privsched.budgets.exact import quantize
from privsched.client import Client
from privsched.service.resources import Pool
from tests.support.blockdata import block_file
from workloads import heterogeneous as hetero
from workloads import macrobenchmark as macro

BLOCKS = 10


def connect(path: Path, accounting: str, epsilon: float, delta: float) -> Client:
    client = ps.connect(path)
    client.create_dataset("reviews", epsilon=epsilon, delta=delta, accounting=accounting)
    client.add_blocks("reviews", [(f"day{d:02d}", block_file(path.parent, str(d))) for d in range(BLOCKS)])
    client.runs.record_pool(Pool(("0",), cpus=4.0, memory=2**30))
    return client


def submitted_demand(client: Client, name: str, *, job: dict, **demand: object) -> np.ndarray:
    """The demand the ledger records for one block when the pipeline is submitted."""
    run = client.submit({"name": name, "dataset": "reviews", "blocks": {"last": 1}, "job": job, **demand})
    return np.asarray(run.info.demands[f"day{BLOCKS - 1:02d}"])


def builtin(job: dict) -> dict:
    kind, params = job["kind"], {k: v for k, v in job.items() if k != "kind"}
    return {"kind": kind, "params": params}


@pytest.mark.parametrize("accounting", ["basic", "rdp"])
def test_every_macrobenchmark_pipeline_is_charged_what_submitting_its_builtin_job_records(tmp_path, accounting):
    client = connect(tmp_path / "macro.db", accounting, macro.BLOCK_EPSILON, macro.BLOCK_DELTA)
    live = {"mice": [], "elephants": []}
    for epsilon in macro.MICE_EPSILONS:  # a Laplace count, pure epsilon-DP
        live["mice"].append(submitted_demand(client, f"mouse-{epsilon}", job=builtin(macro.MOUSE_JOB), epsilon=epsilon, delta=0.0))
    for label, model, _, rate, epochs in macro.MODELS:
        for epsilon in macro.ELEPHANT_EPSILONS:
            job = builtin(macro.elephant_job(model, rate, epochs))
            live["elephants"].append(submitted_demand(client, f"{label}-{epsilon}", job=job, epsilon=epsilon, delta=macro.ELEPHANT_DELTA))
    client.close()
    name = "macro-rdp" if accounting == "rdp" else "macro"
    instance = workloads.generate(name, seed=5, days=3, pipelines_per_day=60).instance
    seen = {"mice": set(), "elephants": set()}
    for i in range(instance.n_pipelines):
        klass = str(instance.klass[i])
        row = instance.edge_demand[instance.edge_start[i]]
        # The ledger records a demand on its grid of 10⁻¹² quanta, rounded up (docs/design.md §3.3).
        matches = [k for k, vector in enumerate(live[klass]) if np.array_equal(quantize(row, up=True), vector)]
        assert matches, f"pipeline {i} ({klass}) has a demand no live {klass} job is charged"
        seen[klass].add(row.tobytes())
    assert len(seen["mice"]) == 3 and len(seen["elephants"]) >= 3  # every epsilon drawn


def test_a_laplace_statistic_under_rdp_is_charged_the_pure_dp_curve_not_the_continuous_laplace_curve():
    alphas = np.asarray(hetero.RDP.alphas)
    curve = hetero.charged_curve(hetero.laplace(4.0))  # noise of scale 4: epsilon = 0.25
    np.testing.assert_array_equal(curve, np.minimum(0.25, alphas * 0.25**2 / 2))


def test_the_heterogeneous_zoo_charges_what_the_live_ledger_records_for_each_mechanism(tmp_path):
    client = connect(tmp_path / "zoo.db", "rdp", hetero.BLOCK_EPSILON, hetero.BLOCK_DELTA)
    zoo = hetero.zoo()
    function = {"function": "tests.service_jobs:spend_half"}
    for family in hetero.FAMILIES:
        k = zoo.families.index(family)
        mechanism = zoo.mechanisms[k]
        declared = submitted_demand(client, f"declared-{family}", job=function, mechanism=mechanism)
        np.testing.assert_array_equal(quantize(zoo.curves[k], up=True), declared)  # the ledger's grid, rounded up
        if family == "laplace":  # the same noise run as a built-in Laplace count at epsilon = 1/b
            epsilon = parse_mechanism(mechanism).epsilon
            statistic = submitted_demand(client, "count", job=builtin(macro.MOUSE_JOB), epsilon=epsilon, delta=0.0)
            np.testing.assert_array_equal(quantize(zoo.curves[k], up=True), statistic)
    client.close()

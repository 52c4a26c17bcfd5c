"""``ctx.dp_sgd`` for code jobs: the supervisor plans and charges the training before the
job trains (q, σ, steps from the grant, as Opacus' ``make_private_with_epsilon``
calibrates), the job trains that plan and saves its model, and the charge never rests on
what the job reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets import Accounting, EpsilonDelta, demand_vector, subsampled_gaussian_curve
from privsched.budgets.sgm import calibrate_noise_multiplier, subsampled_gaussian_epsilon
from privsched.budgets.elastic import granted_amount, granted_epsilon
from privsched.budgets.training_plan import fit_noise_multiplier, plan_training
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.runner import JobResult
from privsched.jobs.sandbox import abi_version

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-6
needs_landlock = pytest.mark.skipif(abi_version() == 0, reason="this kernel offers no Landlock sandbox")


def click_blocks(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    out = {}
    for day in range(2):
        n = 150
        amount = rng.uniform(0, 200, n)
        country = rng.choice(np.array(["fr", "de", "us"]), n)
        clicked = ((amount > 100) ^ (country == "us")).astype(np.int64)
        path = folder / f"d{day}.npz"
        np.savez(path, amount=amount, country=country, clicked=clicked, spend=amount / 2)
        out[f"d{day}"] = str(path)
    return out


def run_code_job(folder: Path, function: str, accounting: Accounting, grant: np.ndarray, epsilon: float | None, params: dict) -> JobResult:
    """The job run confined by ``python -m privsched.jobs.runner``, as the scheduler runs it."""
    blocks = click_blocks(folder / "blocks")
    ctx = JobContext(
        1,
        "job",
        "events",
        accounting,
        DELTA,
        {k: BlockGrant(k, v, grant) for k, v in blocks.items()},
        workdir=folder / "work",
        params=params,
        epsilon=epsilon,
    )
    document = {**json.loads(ctx.to_json()), "job": {"function": f"tests.dpsgd_jobs:{function}", "pythonpath": [str(REPO)]}}
    (folder / "context.json").write_text(json.dumps(document))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "privsched.jobs.runner", "context.json", "result.json"]
    assert subprocess.run(command, cwd=folder, env=env, timeout=600).returncode in (0, 1)
    return JobResult.from_json((folder / "result.json").read_text())


@needs_landlock
def test_a_code_job_is_charged_the_plan_its_supervisor_computed_not_what_it_reports(tmp_path):
    accounting = Accounting.rdp()
    grant = demand_vector(EpsilonDelta(epsilon=1.0), accounting)  # a pure-DP declaration, no mechanism
    result = run_code_job(tmp_path, "trains_clicks", accounting, grant, 1.0, {})
    assert result.completed, result.message
    plan = result.metrics["dp_sgd"]
    expected = subsampled_gaussian_curve(0.1, plan["noise_multiplier"], plan["steps"], accounting.alphas)
    assert plan["steps"] == 10 and result.metrics["returned_its_model"]
    for spent in result.spent.values():
        assert np.array_equal(np.asarray(spent), expected)  # charged exactly, the rest of the grant refunded
        assert np.all(np.asarray(spent) <= grant)
    state = torch.load(tmp_path / "work" / "model.pt")
    assert state["1.weight"].shape == (8, 5)


@needs_landlock
def test_a_code_job_granted_part_of_an_elastic_range_trains_within_the_grant_and_reports_the_epsilon_it_used(tmp_path):
    accounting = Accounting.rdp()
    grant = granted_amount(demand_vector(EpsilonDelta(epsilon=2.0), accounting), 0.5)  # half of [0.5, 2.0]'s max
    result = run_code_job(tmp_path, "trains_clicks", accounting, grant, granted_epsilon(grant, 0.5, 2.0, 0.0, accounting), {})
    assert result.completed, result.message
    plan = result.metrics["dp_sgd"]
    assert plan["epsilon_used"] == subsampled_gaussian_epsilon(0.1, plan["noise_multiplier"], plan["steps"], DELTA)
    assert all(np.all(np.asarray(spent) <= grant) for spent in result.spent.values())


@needs_landlock
def test_an_epsilon_above_the_grant_fails_the_job_before_it_gets_any_record(tmp_path):
    accounting = Accounting.basic()
    result = run_code_job(tmp_path, "trains_clicks", accounting, np.array([1.0, DELTA]), 1.0, {"epsilon": 3.0})
    assert not result.completed and "above the pipeline's grant" in result.message


@needs_landlock
def test_a_regression_with_its_own_loss_trains_under_basic_accounting(tmp_path):
    result = run_code_job(tmp_path, "trains_a_regression_with_its_own_loss", Accounting.basic(), np.array([2.0, DELTA]), 2.0, {})
    assert result.completed, result.message
    spent = result.spent["d0"]
    assert spent[1] == DELTA and 0 < spent[0] <= 2.0


def test_a_plan_for_an_epsilon_is_the_one_opacus_calibrates_under_basic_accounting():
    plan = plan_training(0.05, 2, 1.0, DELTA, np.array([3.0, DELTA]), Accounting.basic(), 3.0)
    assert plan.noise_multiplier == calibrate_noise_multiplier(0.05, 40, 1.0, DELTA, tolerance=0.01)
    assert plan.charge[0] == subsampled_gaussian_epsilon(0.05, plan.noise_multiplier, 40, DELTA) <= 1.0


@settings(max_examples=15, deadline=None)
@given(q=st.sampled_from([0.01, 0.05, 0.2]), epochs=st.floats(0.5, 3), epsilon=st.floats(0.3, 5))
def test_the_whole_grant_plan_fits_under_the_grant_at_every_order_and_less_noise_would_not(q, epochs, epsilon):
    accounting = Accounting.rdp()
    grant = demand_vector(EpsilonDelta(epsilon=epsilon), accounting)
    plan = plan_training(q, epochs, None, DELTA, grant, accounting, epsilon)
    assert np.all(plan.charge <= grant)
    tighter = subsampled_gaussian_curve(q, plan.noise_multiplier * 0.98, plan.steps, accounting.alphas)
    assert np.any(tighter > grant)


def test_nothing_left_at_some_order_refuses_any_plan():
    accounting = Accounting.rdp()
    left = demand_vector(EpsilonDelta(epsilon=1.0), accounting)
    left[3] = 0.0
    with pytest.raises(ValueError, match="nothing is left"):
        fit_noise_multiplier(0.1, 10, left, np.asarray(accounting.alphas))


def test_the_supervisor_charges_a_plan_before_it_hands_over_any_block_and_refuses_beyond_the_grant(tmp_path):
    from privsched.jobs.primitives import Account

    accounting = Accounting.basic()
    blocks = click_blocks(tmp_path / "blocks")
    ctx = JobContext(
        1, "job", "events", accounting, DELTA, {k: BlockGrant(k, v, np.array([1.0, 2 * DELTA])) for k, v in blocks.items()}, epsilon=1.0
    )
    account = Account(ctx)
    answer, fds = account._dpsgd_plan({"epsilon": 0.6, "sample_rate": 0.1, "epochs": 1})
    try:
        assert account.spent[0] == answer["charge"][0] <= 0.6 and not account.read_blocks
        assert answer["files"] == len(fds) == 2 and account.first_access is not None
        assert sorted(os.fstat(fd).st_size for fd in fds) == sorted(Path(p).stat().st_size for p in blocks.values())
    finally:
        for fd in fds:
            os.close(fd)
    with pytest.raises(ValueError, match="more than what is left"):
        account._dpsgd_plan({"epsilon": 0.6, "sample_rate": 0.1, "epochs": 1})
    assert account.spent[0] == answer["charge"][0]

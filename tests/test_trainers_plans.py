"""Built-in job plans: what a DP-SGD or DP statistic job is charged, and bad parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest
from opacus.accountants.utils import get_noise_multiplier

from privsched.budgets import (
    Accounting,
    Composed,
    EpsilonDelta,
    Gaussian,
    SubsampledGaussian,
    demand_vector,
    gaussian_sigma,
    rdp_to_epsilon,
)
from privsched.trainers.builtin import BUILTIN_KINDS, plan_mechanism
from privsched.trainers.models import INPUTS
from privsched.trainers.plans import MODEL_NAMES, DPSGDPlan, calibrate_noise, charged_plan, dpsgd_mechanism, parse_job
from privsched.statistics.release import noise_of

DPSGD = {"kind": "dpsgd", "model": "mlp", "sample_rate": 0.02, "epochs": 3, "lr": 0.1}


def test_builtin_kinds_are_dpsgd_and_statistic():
    assert BUILTIN_KINDS == ("dpsgd", "statistic")


def test_every_planned_model_is_in_the_zoo():
    assert set(MODEL_NAMES) == set(INPUTS)


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_dpsgd_plan_under_rdp_is_the_subsampled_gaussian_calibrated_by_opacus():
    plan = plan_mechanism(DPSGD, 1.0, 1e-6, Accounting.rdp())
    assert isinstance(plan, Composed)
    mechanism, accuracy = plan.parts
    assert isinstance(mechanism, SubsampledGaussian) and accuracy == EpsilonDelta(epsilon=0.1, delta=0.0)
    assert mechanism.steps == math.ceil(3 / 0.02) == 150
    expected = get_noise_multiplier(  # the training gets 90 % of ε, the held-out accuracy 10 %
        target_epsilon=0.9, target_delta=1e-6, sample_rate=0.02, steps=150, accountant="rdp", epsilon_tolerance=0.01
    )
    assert mechanism.noise_multiplier == pytest.approx(expected, rel=0.02)
    curve = demand_vector(plan, Accounting.rdp())
    epsilon, _ = rdp_to_epsilon(curve, Accounting.rdp().alphas, 1e-6)
    assert epsilon <= 1.0 * 1.25  # the coarse default grid converts a little looser than Opacus' own


def test_dpsgd_plan_under_basic_is_its_epsilon_delta():
    plan = plan_mechanism(DPSGD, 0.5, 1e-9, Accounting.basic())
    assert plan == Composed(parts=[EpsilonDelta(epsilon=0.45, delta=1e-9), EpsilonDelta(epsilon=0.05)])
    assert demand_vector(plan, Accounting.basic()) == pytest.approx([0.5, 1e-9])


def test_laplace_count_is_pure_dp_with_scale_one_over_epsilon():
    job = {"kind": "statistic", "query": "count"}
    mechanism = plan_mechanism(job, 0.1, 0.0, Accounting.basic())
    assert mechanism == EpsilonDelta(epsilon=0.1, delta=0.0)
    assert noise_of(mechanism, 1.0) == ("laplace", pytest.approx(10.0, rel=1e-15))


def test_clipped_sum_sensitivity_is_the_largest_bound_magnitude():
    job = {"kind": "statistic", "query": "sum", "column": "rating", "bounds": [-3, 2]}
    spec = parse_job(job)
    mechanism = plan_mechanism(job, 0.5, 0.0, Accounting.basic())
    assert spec.parts() == [("sum", 3.0)]
    assert noise_of(mechanism, 3.0) == ("laplace", pytest.approx(6.0, rel=1e-15))
    assert demand_vector(mechanism, Accounting.basic()) == pytest.approx([0.5, 0.0])


def test_mean_splits_its_budget_between_a_sum_and_a_count():
    job = {"kind": "statistic", "query": "mean", "column": "rating", "bounds": [1, 5], "noise": "gaussian"}
    basic = plan_mechanism(job, 1.0, 1e-6, Accounting.basic())
    assert basic == Composed(parts=[EpsilonDelta(epsilon=0.5, delta=5e-7)] * 2)
    assert demand_vector(basic, Accounting.basic()) == pytest.approx([1.0, 1e-6])
    rdp = plan_mechanism(job, 1.0, 1e-6, Accounting.rdp())
    assert rdp == Composed(
        parts=[
            Gaussian(sigma=5 * gaussian_sigma(0.5, 5e-7), sensitivity=5.0),
            Gaussian(sigma=gaussian_sigma(0.5, 5e-7), sensitivity=1.0),
        ]
    )


def test_histogram_has_sensitivity_one():
    job = {"kind": "statistic", "query": "histogram", "column": "rating", "bounds": [0, 5], "bins": 5}
    assert parse_job(job).parts() == [("histogram", 1.0)]
    assert plan_mechanism(job, 2.0, 0.0, Accounting.rdp()) == EpsilonDelta(epsilon=2.0, delta=0.0)


def test_the_charged_plan_of_an_rdp_dpsgd_job_is_read_without_calibrating_again():
    job = parse_job(DPSGD)
    charged = plan_mechanism(DPSGD, 1.0, 1e-6, Accounting.rdp())
    training, accuracy = charged.parts
    plan = charged_plan(job, charged, 1e-6)
    assert plan == DPSGDPlan(training.noise_multiplier, training.steps, 1e-6, accuracy.epsilon)
    doubled = Composed(parts=[training.model_copy(update={"noise_multiplier": 2 * training.noise_multiplier}), accuracy])
    assert charged_plan(job, doubled, 1e-6).noise_multiplier == 2 * training.noise_multiplier


def test_the_charged_plan_of_a_basic_dpsgd_job_is_calibrated_from_its_charged_epsilon_delta():
    job = parse_job(DPSGD)
    charged = plan_mechanism(DPSGD, 0.5, 1e-9, Accounting.basic())
    plan = charged_plan(job, charged, 1e-3)
    assert plan.delta == 1e-9 and plan.accuracy_epsilon == pytest.approx(0.05) and plan.steps == job.steps
    assert plan.noise_multiplier == calibrate_noise(job.sample_rate, job.steps, 0.45, 1e-9)


def test_a_basic_dpsgd_charge_needs_no_noise_multiplier_and_an_rdp_one_refuses_none():
    job = parse_job(DPSGD)
    assert dpsgd_mechanism(job, None, 0.5, 1e-9, Accounting.basic()) == plan_mechanism(DPSGD, 0.5, 1e-9, Accounting.basic())
    with pytest.raises(ValueError, match="noise multiplier"):
        dpsgd_mechanism(job, None, 0.5, 1e-9, Accounting.rdp())


@pytest.mark.parametrize(
    ("job", "epsilon", "delta", "message"),
    [
        ({"kind": "train"}, 1.0, 1e-6, "unknown built-in job kind"),
        ({**DPSGD, "model": "bert"}, 1.0, 1e-6, "model"),
        ({**DPSGD, "sample_rate": 0}, 1.0, 1e-6, "sample_rate"),
        ({**DPSGD, "epochs": -1}, 1.0, 1e-6, "epochs"),
        ({**DPSGD, "batch": 32}, 1.0, 1e-6, "batch"),
        ({k: v for k, v in DPSGD.items() if k != "lr"}, 1.0, 1e-6, "lr"),
        (DPSGD, 1.0, 0.0, "delta"),
        (DPSGD, -1.0, 1e-6, "epsilon"),
        ({"kind": "statistic", "query": "median", "column": "rating"}, 1.0, 0.0, "query"),
        ({"kind": "statistic", "query": "sum", "column": "rating"}, 1.0, 0.0, "bounds"),
        ({"kind": "statistic", "query": "sum", "column": "rating", "bounds": [5, 1]}, 1.0, 0.0, "lo < hi"),
        ({"kind": "statistic", "query": "histogram", "column": "rating", "bounds": [0, 5]}, 1.0, 0.0, "bins"),
        ({"kind": "statistic", "query": "count", "noise": "gaussian"}, 1.0, 0.0, "delta > 0"),
        ({"kind": "statistic", "query": "count", "column": "rating", "bounds": [1, 5]}, 1.0, 0.0, "no bounds"),
        ({"kind": "statistic", "query": "count", "mechanism": "laplace"}, 1.0, 0.0, "'noise'"),
        ("count", 1.0, 0.0, "dict"),
    ],
)
def test_bad_job_parameters_raise_a_one_line_value_error(job, epsilon, delta, message):
    with pytest.raises(ValueError) as info:
        plan_mechanism(job, epsilon, delta, Accounting.rdp())
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_plans_are_deterministic():
    first = plan_mechanism(DPSGD, 1.0, 1e-6, Accounting.rdp())
    assert np.array_equal(
        demand_vector(first, Accounting.rdp()),
        demand_vector(plan_mechanism(dict(DPSGD), 1.0, 1e-6, Accounting.rdp()), Accounting.rdp()),
    )

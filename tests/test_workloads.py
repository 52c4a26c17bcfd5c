"""Reference workload generators (docs/design.md §5): seeded, deterministic, shaped as specified."""

from __future__ import annotations

import numpy as np
import pytest

from opacus.accountants import RDPAccountant

import workloads
from privsched.trainers.plans import ACCURACY_SHARE, calibrate_noise, training_epsilon
from workloads.macrobenchmark import ELEPHANT_DELTA


def test_same_seed_same_workload_and_another_seed_another():
    first = workloads.generate("multi-block", seed=7, duration=30.0)
    assert first.to_dict() == workloads.generate("multi-block", seed=7, duration=30.0).to_dict()
    assert first.to_dict() != workloads.generate("multi-block", seed=8, duration=30.0).to_dict()


def test_single_block_mixes_mice_and_elephants_on_one_static_block():
    instance = workloads.generate("single-block", seed=1, duration=2000.0).instance
    assert instance.block_arrival.tolist() == [0.0]
    assert 2000 * 0.9 < instance.n_pipelines < 2000 * 1.1  # 1 pipeline/s
    mice = instance.klass == "mice"
    assert abs(mice.mean() - 0.75) < 0.03
    assert set(instance.edge_demand[mice, 0]) == {0.01} and set(instance.edge_demand[~mice, 0]) == {0.1}
    assert np.all(instance.timeout == 300.0)


def test_multi_block_adds_a_block_every_ten_seconds_and_asks_for_the_last_one_or_ten():
    instance = workloads.generate("multi-block", seed=1).instance
    assert instance.block_arrival.tolist() == [0.0] * 11 + [10.0 * k for k in range(1, 30)]
    counts = np.diff(instance.edge_start)
    assert set(counts) == {1, 10}
    assert abs((counts == 1).mean() - 0.75) < 0.03
    assert 12.8 * 300 * 0.95 < instance.n_pipelines < 12.8 * 300 * 1.05


def test_rdp_microbenchmarks_charge_calibrated_gaussians_at_their_higher_rate():
    basic = workloads.generate("multi-block", seed=2, duration=5.0).instance
    rdp = workloads.generate("multi-block-rdp", seed=2, duration=5.0).instance
    assert rdp.n_pipelines > 10 * basic.n_pipelines  # 234.4 against 12.8 pipelines/s
    alphas = np.asarray(rdp.accounting.alphas)
    ratio = rdp.edge_demand / alphas  # Gaussian: d(α) = α / (2σ²)
    np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones_like(ratio))


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_macrobenchmark_has_daily_blocks_and_elephant_curves_calibrated_to_their_epsilon():
    document = workloads.generate("macro-rdp", seed=3, days=4, pipelines_per_day=40)
    instance = document.instance
    assert instance.block_arrival.tolist() == [86400.0 * d for d in range(4)]
    assert np.all(instance.timeout == 5 * 86400.0)
    elephants = [p for p in document.pipelines if p.klass == "elephants"]
    assert elephants
    for p in elephants[:5]:
        plan, accuracy = p.mechanism.parts  # the DP-SGD job's training and its noisy accuracy
        accountant = RDPAccountant()
        accountant.history = [(plan.noise_multiplier, plan.sample_rate, plan.steps)]
        epsilon = accountant.get_epsilon(delta=ELEPHANT_DELTA)
        target = accuracy.epsilon / ACCURACY_SHARE
        assert target in (0.5, 1.0, 5.0) and accuracy.delta == 0
        # the training gets what the accuracy release leaves; Opacus' calibration stops within 1 % below it
        assert 0.98 * training_epsilon(target) <= epsilon <= training_epsilon(target)
        assert plan.noise_multiplier == calibrate_noise(plan.sample_rate, plan.steps, training_epsilon(target), ELEPHANT_DELTA)


def test_unknown_workload_or_parameter_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        workloads.generate("nope")
    with pytest.raises(ValueError, match="takes no parameter 'speed'"):
        workloads.generate("single-block", speed=3)

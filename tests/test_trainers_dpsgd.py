"""DP-SGD jobs: they stay within their grant, report what Opacus' accountant counts for
the steps they took, read only granted blocks, and learn something at ε = 1; their batches
are Opacus' Poisson samples, and the all-linear models' per-sample norms come from Opacus'
ghost clipping as exactly as from single-pass ghost clipping (tests/test_trainers_clipping.py)."""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from torch import nn
from torch.utils.data import TensorDataset

from privsched.budgets import Accounting, Composed, EpsilonDelta, demand_vector, leq, subsampled_gaussian_curve
from privsched.trainers.builtin import plan_mechanism, run_builtin
from privsched.jobs.context import BlockAccessError, BlockGrant, JobContext
from privsched.jobs.records import load_blocks
from privsched.budgets.bounds import MIN_SAMPLE_RATE
from privsched.budgets.elastic import granted_amount
from privsched.trainers.dpsgd import PoissonBatches, ShuffledBatches, inclusion_threshold, release_accuracy
from privsched.trainers.models import build_model, ghost_clipping_applies
from tests.support.devices import DEVICES
from workloads.reviews import write_blocks

DELTA = 1e-6


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def small_blocks(tmp_path_factory) -> list[Path]:
    return write_blocks(tmp_path_factory.mktemp("small"), days=2, per_day=100, seed=3)


@pytest.fixture(scope="module")
def large_blocks(tmp_path_factory) -> list[Path]:
    return write_blocks(tmp_path_factory.mktemp("large"), days=4, per_day=1000, seed=7)


def job_context(
    paths,
    job: dict,
    accounting: Accounting,
    workdir: Path,
    epsilon: float = 1.0,
    grant_scale: float = 1.0,
    device: str = "cpu",
) -> JobContext:
    """A granted job as the scheduler hands it over: its grant is the plan's demand (times
    ``grant_scale``) on every block, its plan the charged mechanism."""
    mechanism = plan_mechanism(job, epsilon, DELTA, accounting)
    grant = demand_vector(mechanism, accounting) * grant_scale
    blocks = {p.stem: BlockGrant(p.stem, str(p), grant) for p in paths}
    return JobContext(
        1, "job", "reviews", accounting, DELTA, blocks, device=device, workdir=workdir, params=job, plan=mechanism, epsilon=epsilon
    )


def expected_spent(accounting: Accounting, q: float, sigma: float, steps: int, epsilon: float = 1.0, accuracy: bool = True) -> np.ndarray:
    """What Opacus' RDP accountant says ``steps`` steps cost, plus the pure-DP held-out
    accuracy release at 10 % of ε (when the job released it)."""
    accuracy = demand_vector(EpsilonDelta(epsilon=0.1 * epsilon), accounting) * accuracy
    if accounting.is_rdp:
        return subsampled_gaussian_curve(q, sigma, steps, accounting.alphas) + accuracy
    if steps == 0:
        return accuracy
    accountant = RDPAccountant()
    accountant.history = [(sigma, q, steps)]
    return np.array([accountant.get_epsilon(delta=DELTA), DELTA]) + accuracy


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    q=st.sampled_from([0.05, 0.1, 0.25, 0.5]),
    epochs=st.floats(0.2, 2.0),
    rdp=st.booleans(),
    grant_scale=st.sampled_from([0.3, 0.7, 1.0]),
    max_steps=st.one_of(st.none(), st.integers(1, 8)),
)
def test_spent_budget_is_within_the_grant_and_what_opacus_counts(small_blocks, tmp_path, q, epochs, rdp, grant_scale, max_steps):
    accounting = Accounting.rdp() if rdp else Accounting.basic()
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": q, "epochs": epochs, "lr": 0.05, "optimizer": "adam"}
    if max_steps is not None:
        job["max_steps"] = max_steps
    ctx = job_context(small_blocks, job, accounting, tmp_path, grant_scale=grant_scale)
    run_builtin(ctx)
    steps, sigma = ctx.metrics["steps"], ctx.metrics["noise_multiplier"]
    accuracy = "heldout_accuracy" in ctx.metrics  # released only when the grant can pay for it
    assert accuracy == bool(np.all(leq(expected_spent(accounting, q, sigma, 0), ctx.budget)))
    assert np.all(leq(ctx.spent, ctx.budget))
    assert ctx.spent == pytest.approx(expected_spent(accounting, q, sigma, steps, accuracy=accuracy), rel=1e-9)
    planned = min(ctx.metrics["planned_steps"], max_steps or ctx.metrics["planned_steps"])
    assert steps <= planned
    if steps < planned:  # stopped by the grant: one more step would have exceeded it
        assert ctx.metrics["stopped"] == "budget"
        assert not np.all(leq(expected_spent(accounting, q, sigma, steps + 1, accuracy=accuracy), ctx.budget))


def test_a_job_stopped_by_max_steps_spends_less_and_saves_its_model(small_blocks, tmp_path):
    job = {"kind": "dpsgd", "model": "mlp", "sample_rate": 0.1, "epochs": 2, "lr": 0.02, "max_steps": 3}
    ctx = job_context(small_blocks, job, Accounting.rdp(), tmp_path)
    run_builtin(ctx)
    assert ctx.metrics["steps"] == 3 and ctx.metrics["stopped"] == "max_steps"
    assert np.all(ctx.spent < ctx.budget)
    assert ctx.touched_data
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["steps"] == 3 and 0 <= saved["heldout_accuracy"] <= 1
    model = build_model("mlp", 1000, 2)
    model.load_state_dict(torch.load(tmp_path / "model.pt"))


@pytest.mark.parametrize(
    ("model", "mode"), [("logreg", "ghost"), ("mlp", "ghost"), ("text", "ghost"), ("cnn", "opacus-ghost"), ("lstm", "opacus-ghost")]
)
def test_every_zoo_model_trains_privately_in_its_default_grad_sample_mode(small_blocks, tmp_path, model, mode):
    job = {"kind": "dpsgd", "model": model, "sample_rate": 0.1, "epochs": 1, "lr": 0.01, "max_steps": 2}
    ctx = job_context(small_blocks, job, Accounting.rdp(), tmp_path)
    run_builtin(ctx)
    assert ctx.metrics["grad_sample_mode"] == mode
    assert ctx.metrics["steps"] == 2


@pytest.mark.parametrize(("model", "mode"), [("text", "opacus-ghost"), ("mlp", "hooks"), ("cnn", "hooks")])
def test_a_job_trains_in_the_grad_sample_mode_it_names_and_reports_it(small_blocks, tmp_path, model, mode):
    job = {"kind": "dpsgd", "model": model, "sample_rate": 0.1, "epochs": 1, "lr": 0.01, "max_steps": 2}
    ctx = job_context(small_blocks, {**job, "grad_sample_mode": mode}, Accounting.rdp(), tmp_path)
    run_builtin(ctx)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert ctx.metrics["grad_sample_mode"] == saved["grad_sample_mode"] == mode
    assert ctx.metrics["steps"] == 2


@pytest.mark.parametrize("mode", ["ghost", "opacus-ghost"])
def test_ghost_clipping_takes_noise_only_steps_on_empty_poisson_batches(small_blocks, tmp_path, mode):
    # 160 training records at q = 0.002: most Poisson batches are empty
    job = {"kind": "dpsgd", "model": "text", "sample_rate": 0.002, "epochs": 0.02, "lr": 0.01, "grad_sample_mode": mode}
    ctx = job_context(small_blocks, job, Accounting.rdp(), tmp_path)
    run_builtin(ctx)
    assert ctx.metrics["steps"] == 10
    assert ctx.spent == pytest.approx(demand_vector(plan_mechanism(job, 1.0, DELTA, Accounting.rdp()), Accounting.rdp()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["ghost", "opacus-ghost", "hooks"])
def test_a_job_trains_with_secure_noise_on_the_device_it_is_placed_on(small_blocks, tmp_path, device, mode):
    # The noise generator lives on the model's device: a CPU generator fails on a GPU.
    job = {"kind": "dpsgd", "model": "text", "sample_rate": 0.1, "epochs": 0.2, "lr": 0.01, "grad_sample_mode": mode}
    ctx = job_context(small_blocks, job, Accounting.rdp(), tmp_path, device=device)
    run_builtin(ctx)
    assert ctx.metrics["steps"] == 2 and ctx.spent is not None


def test_reading_a_block_outside_the_grant_raises_before_opening_any(small_blocks, tmp_path):
    ctx = job_context(small_blocks[:1], {"kind": "statistic", "query": "count"}, Accounting.basic(), tmp_path)
    with pytest.raises(BlockAccessError):
        load_blocks(ctx, [small_blocks[0].stem, small_blocks[1].stem])
    assert not ctx.touched_data


def test_a_job_trains_with_the_noise_multiplier_it_was_charged(small_blocks, tmp_path):
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": 0.1, "epochs": 1, "lr": 0.01}
    ctx = job_context(small_blocks, job, Accounting.rdp(), tmp_path)
    training, accuracy = ctx.plan.parts
    ctx.plan = Composed(parts=[training.model_copy(update={"noise_multiplier": 2 * training.noise_multiplier}), accuracy])
    run_builtin(ctx)
    assert ctx.metrics["noise_multiplier"] == 2 * training.noise_multiplier  # taken as charged, not recalibrated
    assert ctx.metrics["planned_steps"] == training.steps
    assert np.all(leq(ctx.spent, ctx.budget))


@pytest.mark.parametrize(
    "charged",
    [
        lambda training, accuracy: Composed(parts=[training.model_copy(update={"sample_rate": 0.2}), accuracy]),
        lambda training, accuracy: training,
    ],
    ids=["another-sample-rate", "no-accuracy-release"],
)
def test_a_job_whose_charged_mechanism_is_not_its_training_plan_fails_before_reading(small_blocks, tmp_path, charged):
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": 0.1, "epochs": 1, "lr": 0.01}
    ctx = job_context(small_blocks, job, Accounting.rdp(), tmp_path)
    ctx.plan = charged(*ctx.plan.parts)
    with pytest.raises(ValueError) as info:
        run_builtin(ctx)
    assert "\n" not in str(info.value)
    assert ctx.spent is None and not ctx.touched_data


def test_dpsgd_logreg_beats_chance_clearly_at_epsilon_one(large_blocks, tmp_path):
    # 3,200 training reviews, balanced sentiment (chance 0.5); measured ≈ 0.83
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": 0.05, "epochs": 5, "lr": 0.01, "optimizer": "adam"}
    ctx = job_context(large_blocks, job, Accounting.rdp(), tmp_path, epsilon=1.0)
    run_builtin(ctx)
    assert ctx.metrics["steps"] == 100
    assert ctx.metrics["heldout_accuracy"] > 0.7


def released_numbers(ctx: JobContext, workdir: Path) -> list[float]:
    """Every number a submitter can read: reported metrics and metrics.json."""
    saved = json.loads((workdir / "metrics.json").read_text())
    values = list(ctx.metrics.values()) + list(saved.values())
    return [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def test_two_runs_of_the_same_job_release_different_models(small_blocks, tmp_path):
    job = {"kind": "dpsgd", "model": "mlp", "sample_rate": 0.2, "epochs": 1, "lr": 0.05, "seed": 4}
    runs = []
    for name in ("a", "b"):
        ctx = job_context(small_blocks, job, Accounting.rdp(), tmp_path / name)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Secure RNG")  # no insecure-RNG path is taken
            run_builtin(ctx)
        runs.append(torch.load(tmp_path / name / "model.pt"))
    weights_a, weights_b = runs
    assert any(not torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def test_the_same_model_on_the_same_heldout_data_gets_fresh_accuracy_noise_each_time():
    # two releases coincide with probability ~6e-4 at ε = 0.1 (Σ_k P(k)² per bin, squared),
    # so twenty identical releases (probability ~1e-61) would mean the noise is not fresh
    model = nn.Linear(3, 2)
    heldout = TensorDataset(torch.randn(60, 3), torch.randint(0, 2, (60,)))
    releases = {tuple(release_accuracy(model, heldout, torch.device("cpu"), 0.1).values()) for _ in range(20)}
    assert len(releases) > 1


def test_no_released_number_is_an_exact_record_count_or_an_unnoised_metric(small_blocks, tmp_path):
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": 0.2, "epochs": 1, "lr": 0.05}
    ctx = job_context(small_blocks, job, Accounting.rdp(), tmp_path)
    run_builtin(ctx)
    plan = {
        "model",
        "grad_sample_mode",
        "sample_rate",
        "noise_multiplier",
        "planned_steps",
        "steps",
        "stopped",
        "accuracy_epsilon",
        "spent",
        "architecture",  # the model's name and shape: the job's and the blocks' declared metadata
        "device",
        "epsilon_used",  # the (ε, δ) the noise was calibrated to
        "delta_used",
    }  # depend on the plan, the grant and the placement, not on the data
    assert set(ctx.metrics) == plan | {"heldout_accuracy", "heldout_records_noisy"}
    # 200 records: no record count is released except the noisy held-out size (and the noisy
    # accuracy, a proportion clamped to [0, 1], which reads 1.0 when its noise is large)
    public = {ctx.metrics[k] for k in ("sample_rate", "noise_multiplier", "planned_steps", "steps", "accuracy_epsilon", "epsilon_used")}
    leaked = {v for v in released_numbers(ctx, tmp_path) if v in set(range(1, 201)) and v not in public}
    assert leaked <= {ctx.metrics["heldout_records_noisy"], ctx.metrics["heldout_accuracy"]}


def test_the_optimizer_draws_secure_noise_from_an_os_seeded_generator(small_blocks):
    from privsched.trainers.dpsgd import private_trainer
    from privsched.trainers.plans import parse_job

    spec = parse_job({"kind": "dpsgd", "model": "mlp", "sample_rate": 0.1, "epochs": 1, "lr": 0.01, "seed": 0})
    data = TensorDataset(torch.zeros(20, 1000), torch.zeros(20, dtype=torch.long))
    seeds = set()
    for mode in ("ghost", "opacus-ghost", "hooks"):
        trainer = private_trainer(build_model("mlp", 1000, 2), data, spec, 1.0, mode, torch.device("cpu"))
        assert trainer.optimizer.secure_mode
        seeds.add(trainer.optimizer.generator.initial_seed())
        seeds.add(trainer.batches.rng.bit_generator.seed_seq.entropy)
    assert len(seeds) == 6 and 0 not in seeds


def test_patience_is_refused_with_one_line():
    from privsched.trainers.plans import parse_job

    with pytest.raises(ValueError, match="patience") as info:
        parse_job({"kind": "dpsgd", "model": "mlp", "sample_rate": 0.1, "epochs": 1, "lr": 0.01, "patience": 2})
    assert "\n" not in str(info.value)


def test_poisson_batches_keep_each_record_when_its_64_bit_draw_is_below_the_threshold():
    records = TensorDataset(torch.arange(300), torch.arange(300) % 2)
    ours = PoissonBatches(records, 0.07, np.random.Generator(np.random.PCG64(5)))
    draws = np.random.Generator(np.random.PCG64(5)).bit_generator
    epoch = list(ours)
    assert len(epoch) == len(ours) == 14  # int(1/q) steps per epoch
    assert [inputs.tolist() for inputs, _ in epoch] == [np.flatnonzero(draws.random_raw(300) < ours.threshold).tolist() for _ in epoch]
    assert all(torch.equal(labels, inputs % 2) for inputs, labels in epoch)
    assert [inputs.tolist() for inputs, _ in ours] != [inputs.tolist() for inputs, _ in epoch]  # fresh draws


@given(st.floats(min_value=MIN_SAMPLE_RATE, max_value=1.0))
def test_the_inclusion_probability_is_never_above_the_charged_rate_and_short_of_it_by_less_than_2_to_the_minus_64(q):
    threshold = inclusion_threshold(q)
    assert Fraction(threshold, 2**64) <= Fraction(q)
    assert Fraction(q) - Fraction(threshold, 2**64) < Fraction(1, 2**64)


def test_the_inclusion_rate_at_a_tiny_q_is_at_most_q_where_a_float32_draw_gives_sixty_times_it():
    q = 1e-9
    assert inclusion_threshold(q) / 2**64 <= q
    assert math.ceil(q * 2**24) / 2**24 > 59 * q  # what ``torch.rand(n) < q`` includes with


def test_a_sample_rate_the_sampler_cannot_resolve_is_refused():
    with pytest.raises(ValueError, match="resolves"):
        inclusion_threshold(2.0**-41)


def test_poisson_batches_include_records_at_the_rate_q():
    q, n, steps = 0.3, 2000, 50
    batches = PoissonBatches(TensorDataset(torch.arange(n), torch.zeros(n)), q)
    sizes = [len(batches.draw(n)) for _ in range(steps)]
    mean, sd = np.mean(sizes), math.sqrt(n * q * (1 - q) / steps)
    assert abs(mean - q * n) < 6 * sd


def test_shuffled_batches_cover_every_record_once_per_epoch():
    records = TensorDataset(torch.arange(103), torch.arange(103) * 2)
    batches = list(ShuffledBatches(records, 20, torch.Generator().manual_seed(1)))
    assert [len(labels) for _, labels in batches] == [20] * 5 + [3]
    assert sorted(torch.cat([inputs for inputs, _ in batches]).tolist()) == list(range(103))
    assert all(torch.equal(labels, inputs * 2) for inputs, labels in batches)


def test_the_text_model_is_a_mean_of_token_embeddings_without_padding():
    torch.manual_seed(0)
    model = build_model("text", 50, 3, embed_dim=8)
    tokens = torch.randint(1, 50, (6, 10))
    tokens[:, 7:] = 0
    tokens[2, 3:] = 0
    tokens[4] = 0
    bag = nn.EmbeddingBag(50, 8, mode="mean", padding_idx=0)
    with torch.no_grad():
        bag.weight.copy_(model.embedding.weight.T)
    assert torch.allclose(model(tokens), model.out(bag(tokens)), atol=1e-6)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("model_name", ["logreg", "mlp", "text"])
def test_opacus_ghost_clipping_computes_the_exact_per_sample_norms_of_the_all_linear_models(model_name):
    torch.manual_seed(1)
    model = build_model(model_name, 40, 2, embed_dim=6, hidden=5)
    assert ghost_clipping_applies(model)  # every trainable layer is linear: Opacus has a norm sampler for it
    tokens = torch.randint(1, 40, (7, 9))
    tokens[:, 6:] = 0
    inputs = tokens if model_name == "text" else torch.zeros(7, 40).scatter_(1, tokens, 1.0)
    labels = torch.randint(0, 2, (7,))
    expected = []
    for i in range(7):
        loss = nn.functional.cross_entropy(model(inputs[i : i + 1]), labels[i : i + 1])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        expected.append(torch.sqrt(sum((g**2).sum() for g in grads)))
    ghost = GradSampleModuleFastGradientClipping(model, max_grad_norm=1.0, use_ghost_clipping=True)
    nn.functional.cross_entropy(ghost(inputs), labels).backward()
    assert torch.allclose(ghost.get_norm_sample(), torch.stack(expected), rtol=1e-4)
    assert all(getattr(p, "grad_sample", None) is None for p in model.parameters())


def test_a_dpsgd_job_granted_part_of_its_elastic_range_trains_at_the_largest_epsilon_the_grant_holds(small_blocks, tmp_path):
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": 0.2, "epochs": 1, "lr": 0.05}
    accounting = Accounting.rdp()
    ctx = job_context(small_blocks, job, accounting, tmp_path, epsilon=2.0)
    grant = granted_amount(demand_vector(ctx.plan, accounting), 0.6)  # of [0.5, 2.0], whose min needs less
    ctx.blocks = {k: BlockGrant(k, b.location, grant) for k, b in ctx.blocks.items()}
    ctx.epsilon_min = 0.5
    run_builtin(ctx)
    assert 0.5 < ctx.metrics["epsilon_used"] < 2.0 and ctx.metrics["delta_used"] == DELTA
    assert ctx.spent is not None and np.all(leq(ctx.spent, grant))
    assert ctx.metrics["noise_multiplier"] > ctx.plan.parts[0].noise_multiplier  # more noise than the whole plan

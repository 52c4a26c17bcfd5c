"""Single-pass ghost clipping: with no noise, a step's gradient is the clipped sum of the
explicitly computed per-example gradients and what Opacus' two-pass ghost clipping
computes, divided by q·n; the noise the optimizer adds in every mode has standard deviation
σC/(q·n) on every parameter; models with a non-linear trainable layer are refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from privsched.trainers.clipping import GhostClipping, unsupported_layers
from privsched.trainers.dpsgd import Trainer, default_mode, private_trainer
from privsched.trainers.models import build_model, ghost_clipping_applies
from privsched.trainers.plans import ALL_LINEAR_MODELS, MODEL_NAMES, parse_job
from tests.support.devices import DEVICES

VOCAB, CLASSES, TRAIN = 30, 3, 200
JOB = {"kind": "dpsgd", "sample_rate": 0.1, "epochs": 1, "lr": 0.1}


def batch(model_name: str, size: int, seed: int, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """Random reviews of up to 8 tokens (padding 0) as the model reads them, and labels."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (size, 8), generator=generator)
    tokens[:, 5:] *= torch.rand(size, 3, generator=generator) < 0.5
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    if model_name == "text":
        return tokens, labels
    return torch.zeros(size, vocab).scatter_(1, tokens, 1.0), labels


def model_of(model_name: str, vocab: int = VOCAB) -> nn.Module:
    torch.manual_seed(0)
    return build_model(model_name, vocab, CLASSES, embed_dim=4, hidden=6)


def trainer(model_name: str, mode: str, sigma: float, max_grad_norm: float, vocab: int = VOCAB) -> Trainer:
    """A private trainer with SGD over 200 training records at q = 0.1 (expected batch 20)."""
    job = parse_job({**JOB, "model": model_name, "max_grad_norm": max_grad_norm})
    train = TensorDataset(*batch(model_name, TRAIN, seed=99, vocab=vocab))
    return private_trainer(model_of(model_name, vocab), train, job, sigma, mode, torch.device("cpu"))


def step_gradients(trainer: Trainer, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradient each parameter's optimiser step used, times the expected batch size:
    the clipped (and noised) sum of per-example gradients."""
    trainer.step(inputs, labels)
    return {name: p.grad.detach().cpu() * 20 for name, p in trainer.model.named_parameters()}


def explicit_clipped_sum(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, c: float) -> dict:
    """Σ_i min(1, C/(‖∇L_i‖ + 10⁻⁶)) ∇L_i from per-example gradients, one example at a time."""
    names, params = zip(*model.named_parameters())
    total = {name: torch.zeros_like(p) for name, p in zip(names, params)}
    for x, y in zip(inputs, labels):
        grads = torch.autograd.grad(nn.functional.cross_entropy(model(x[None]), y[None]), params)
        factor = min(1.0, c / (torch.sqrt(sum(g.square().sum() for g in grads)).item() + 1e-6))
        for name, g in zip(names, grads):
            total[name] += factor * g
    return total


#: (batch size, C): a batch of one, mixed clipping, every norm below C, every norm above C.
CASES = [(1, 0.5), (17, 0.5), (40, 0.3), (23, 1e3), (31, 1e-3)]


@pytest.mark.parametrize("model_name", ALL_LINEAR_MODELS)
@pytest.mark.parametrize(("size", "max_grad_norm"), CASES)
def test_without_noise_a_step_uses_the_clipped_sum_of_per_example_gradients(model_name, size, max_grad_norm):
    inputs, labels = batch(model_name, size, seed=size)
    expected = explicit_clipped_sum(model_of(model_name), inputs, labels, max_grad_norm)
    ours = step_gradients(trainer(model_name, "ghost", 0.0, max_grad_norm), inputs, labels)
    assert ours.keys() == expected.keys()
    for name in ours:
        assert torch.allclose(ours[name], expected[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("model_name", ALL_LINEAR_MODELS)
@pytest.mark.parametrize(("size", "max_grad_norm"), CASES)
def test_without_noise_a_step_is_the_step_of_opacus_ghost_clipping(model_name, size, max_grad_norm):
    inputs, labels = batch(model_name, size, seed=size + 1)
    ours = trainer(model_name, "ghost", 0.0, max_grad_norm)
    opacus = trainer(model_name, "opacus-ghost", 0.0, max_grad_norm)
    ours_grads, opacus_grads = step_gradients(ours, inputs, labels), step_gradients(opacus, inputs, labels)
    for name in ours_grads:
        assert torch.allclose(ours_grads[name], opacus_grads[name], rtol=1e-4, atol=1e-6), name
    for mine, theirs in zip(ours.model.parameters(), opacus.model.parameters()):
        assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-7)
    assert ours.history == opacus.history == [(0.0, 0.1, 1)]


@pytest.mark.parametrize("device", DEVICES)
def test_per_example_norms_are_those_of_the_explicit_per_example_gradients(device):
    model = model_of("mlp").to(device)  # on a GPU where there is one
    inputs, labels = batch("mlp", 12, seed=5)
    clipping = GhostClipping(model, 1.0, nn.CrossEntropyLoss(reduction="sum"))
    norms, _ = clipping.per_example(inputs.to(device), labels.to(device))
    expected = []
    for x, y in zip(inputs, labels):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[None].to(device)), y[None].to(device)).backward()
        expected.append(torch.sqrt(sum(p.grad.square().sum() for p in model.parameters())))
    assert torch.allclose(norms, torch.stack(expected), rtol=1e-5)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("mode", ["ghost", "opacus-ghost", "hooks"])
@pytest.mark.parametrize("model_name", ["mlp", "text"])
@pytest.mark.parametrize("size", [25, 0])
def test_noise_has_standard_deviation_sigma_c_over_the_expected_batch(model_name, size, mode):
    # the clipped sum is the same without noise (zero on an empty batch): the difference is
    # the noise divided by q·n, on 12,000 coordinates or more, drawn for all parameters at once
    sigma, c, vocab = 1.5, 0.7, 3000
    inputs, labels = batch(model_name, size, seed=3, vocab=vocab)
    exact = step_gradients(trainer(model_name, mode, 0.0, c, vocab), inputs, labels)
    noisy = trainer(model_name, mode, sigma, c, vocab)
    noisy_grads = step_gradients(noisy, inputs, labels)
    noises = {name: (noisy_grads[name] - exact[name]).flatten() / 20 for name in exact}
    expected = sigma * c / 20
    # a sample standard deviation of n Gaussians has relative standard error 1/sqrt(2n); 6-sigma bounds
    for noise in [torch.cat(list(noises.values())), *(v for v in noises.values() if len(v) >= 1000)]:
        n = len(noise)
        assert abs(noise.std().item() / expected - 1) < 6 / (2 * n) ** 0.5
        assert abs(noise.mean().item()) < 6 * expected / n**0.5
    heads = [v[:6] for v in noises.values()]  # every parameter has noise of its own
    assert all(not torch.equal(a, b) for i, a in enumerate(heads) for b in heads[i + 1 :])
    assert noisy.history == [(sigma, 0.1, 1)]


def test_the_accountant_counts_every_step_with_sigma_and_q():
    ghost = trainer("logreg", "ghost", 1.2, 1.0)
    for seed in range(4):
        ghost.step(*batch("logreg", 15 + seed, seed))
    assert ghost.history == [(1.2, 0.1, 4)]


def test_a_model_with_a_non_linear_trainable_layer_is_refused():
    model = build_model("cnn", VOCAB, CLASSES, embed_dim=4, hidden=6)
    assert unsupported_layers(model) == ["embedding (Embedding)", "conv (Conv1d)"]
    with pytest.raises(ValueError, match=r"all nn.Linear, not embedding \(Embedding\), conv \(Conv1d\)"):
        trainer("cnn", "ghost", 1.0, 1.0)
    with pytest.raises(ValueError, match="use opacus-ghost or hooks for cnn"):
        parse_job({**JOB, "model": "cnn", "grad_sample_mode": "ghost"})


def test_the_default_mode_is_ghost_exactly_for_the_all_linear_models():
    for name in MODEL_NAMES:
        model = model_of(name)
        assert ghost_clipping_applies(model) == (name in ALL_LINEAR_MODELS)
        assert default_mode(model) == ("ghost" if name in ALL_LINEAR_MODELS else "opacus-ghost")


def test_a_linear_layer_used_twice_is_refused():
    layer = nn.Linear(4, 4)
    clipping = GhostClipping(nn.Sequential(layer, nn.ReLU(), layer), 1.0, nn.CrossEntropyLoss(reduction="sum"))
    with pytest.raises(ValueError, match="called once per forward pass"):
        clipping.accumulate(torch.randn(3, 4), torch.tensor([0, 1, 2]))


def test_a_linear_layer_on_sequences_is_refused():
    clipping = GhostClipping(nn.Sequential(nn.Linear(4, 3), nn.Flatten()), 1.0, nn.CrossEntropyLoss(reduction="sum"))
    with pytest.raises(ValueError, match="2-D inputs"):
        clipping.accumulate(torch.randn(2, 5, 4), torch.tensor([0, 1]))

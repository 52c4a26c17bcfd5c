"""Data-parallel DP-SGD on two gloo processes: the same global batch, noise scale and
charge as one process. Each test starts gloo processes (a few seconds each): marked slow."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from privsched.trainers.distributed import train_distributed
from privsched.trainers.plans import parse_job

JOB = parse_job({"kind": "dpsgd", "model": "logreg", "sample_rate": 0.25, "epochs": 1, "lr": 0.05, "max_grad_norm": 1.0})


def zero_input_model() -> nn.Module:
    """A model whose every per-example gradient is zero on zero inputs: its gradient is the noise alone."""
    torch.manual_seed(0)
    return nn.Linear(200, 100, bias=False)


@pytest.mark.slow
def test_two_workers_are_charged_what_one_process_is_and_end_with_the_same_model():
    data = TensorDataset(torch.randn(200, 200), torch.randint(0, 100, (200,)))
    ranks = train_distributed(zero_input_model(), data, JOB, 1.3, 4, 50, workers=2)
    assert ranks[0]["history"] == [(1.3, 0.25, 4)]
    assert torch.equal(ranks[0]["state"]["weight"], ranks[1]["state"]["weight"])


@pytest.mark.slow
def test_the_averaged_gradient_carries_one_processes_noise_scale():
    data = TensorDataset(torch.zeros(200, 200), torch.randint(0, 100, (200,)))
    sigma, batch = 2.0, 40
    for workers in (1, 2):
        grad = train_distributed(zero_input_model(), data, JOB, sigma, 1, batch, workers)[0]["grads"][0]
        assert abs(grad.std().item() / (sigma * 1.0 / batch) - 1) < 0.05, f"{workers} worker(s)"

"""DP-SGD's secure Gaussian noise, drawn for all parameters at once: every coordinate is
N(0, σ²C²) (mean, variance, fourth moment, Kolmogorov-Smirnov against the normal), the sum
of four draws of the generator (Opacus' secure mode, Holohan & Braghin 2021 §5.1), and
independent of the others; two OS-seeded generators draw different noise."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from privsched.trainers.dpsgd import secure_generator
from privsched.trainers.secure_noise import SECURE_DRAWS, gaussian_noise

CPU = torch.device("cpu")
N = 200_000


def noise(std: float, generator: torch.Generator, secure: bool = True, numel: int = N) -> torch.Tensor:
    return gaussian_noise(numel, std, generator, CPU, torch.float64, secure)


@pytest.mark.parametrize("secure", [True, False])
def test_noise_is_gaussian_with_the_requested_standard_deviation(secure):
    std = 0.7
    sample = noise(std, secure_generator(), secure)
    # standard errors of the mean, standard deviation and fourth moment of N Gaussians: std/√N,
    # std/√(2N), √96·std⁴/√N; 6-sigma bounds
    assert abs(sample.mean().item()) < 6 * std / N**0.5
    assert abs(sample.std().item() / std - 1) < 6 / (2 * N) ** 0.5
    assert abs(sample.pow(4).mean().item() / (3 * std**4) - 1) < 6 * 96**0.5 / (3 * N**0.5)
    assert stats.kstest(sample.numpy(), stats.norm(scale=std).cdf).pvalue > 1e-6


def test_secure_noise_is_the_scaled_sum_of_four_draws_per_coordinate():
    seed = torch.randint(0, 2**62, ()).item()
    std, numel = 1.3, 1000
    ours = noise(std, torch.Generator().manual_seed(seed), numel=numel)
    draws = torch.randn(SECURE_DRAWS, numel, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert torch.allclose(ours, draws.sum(dim=0) * std / 2)
    # the one-draw noise of a benchmark baseline is one draw
    one = torch.randn(numel, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert torch.allclose(noise(std, torch.Generator().manual_seed(seed), secure=False, numel=numel), one * std)


def test_coordinates_are_uncorrelated_and_two_generators_differ():
    first, second = noise(1.0, secure_generator()), noise(1.0, secure_generator())
    assert not torch.equal(first, second)
    # neighbouring coordinates and two generators' draws: correlation within 6/√N of 0
    for x, y in ((first[:-1], first[1:]), (first, second)):
        assert abs(torch.corrcoef(torch.stack([x, y]))[0, 1].item()) < 6 / N**0.5

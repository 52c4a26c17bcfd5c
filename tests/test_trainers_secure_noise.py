"""DP-SGD's secure Gaussian noise, drawn for all parameters at once into kept buffers: every
coordinate is N(0, σ²C²) (mean, variance, fourth moment, Kolmogorov-Smirnov against the
normal), the sum of four draws of the generator (Opacus' secure mode, Holohan & Braghin
2021 §5.1), and independent of the others and of the previous step's; two OS-seeded
generators draw different noise; an optimizer step's gradient is Opacus' (clipped sum +
noise) / (q·n), bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset
from scipy import stats

from privsched.trainers.dpsgd import secure_generator
from privsched.trainers.secure_noise import SECURE_DRAWS, SecureNoise

CPU = torch.device("cpu")
N = 200_000


def noise(std: float, generator: torch.Generator, secure: bool = True, numel: int = N) -> torch.Tensor:
    return SecureNoise(numel, generator, CPU, torch.float64, secure).sample(std)


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
    # each draw is halved in the sampler, which is exact in binary floating point: bit for bit
    # Opacus' arithmetic, four draws of N(0, std²) summed, then halved
    opacus = torch.empty(SECURE_DRAWS, numel, dtype=torch.float64).normal_(0.0, std, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(ours, opacus.sum(dim=0) / 2)
    # the one-draw noise of a benchmark baseline is one draw
    one = torch.randn(numel, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert torch.allclose(noise(std, torch.Generator().manual_seed(seed), secure=False, numel=numel), one * std)


def test_coordinates_are_uncorrelated_and_two_generators_differ():
    first, second = noise(1.0, secure_generator()), noise(1.0, secure_generator())
    assert not torch.equal(first, second)
    # neighbouring coordinates and two generators' draws: correlation within 6/√N of 0
    for x, y in ((first[:-1], first[1:]), (first, second)):
        assert abs(torch.corrcoef(torch.stack([x, y]))[0, 1].item()) < 6 / N**0.5


def test_every_sample_redraws_the_kept_buffer_with_the_next_draws_of_the_generator():
    seed = torch.randint(0, 2**62, ()).item()
    source = SecureNoise(N, torch.Generator().manual_seed(seed), CPU, torch.float32)
    first = source.sample(0.5).clone()
    second = source.sample(0.5)
    assert second.data_ptr() == source.noise.data_ptr()  # the same buffer, refilled
    draws = torch.empty(2, SECURE_DRAWS, N).normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(first, draws[0].sum(dim=0) / 2)
    assert torch.equal(second, draws[1].sum(dim=0) / 2)
    assert abs(torch.corrcoef(torch.stack([first, second]))[0, 1].item()) < 6 / N**0.5


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_a_step_adds_opacus_secure_noise_to_the_clipped_sum_and_divides_by_q_n_exactly():
    from privsched.trainers.dpsgd import private_trainer
    from privsched.trainers.models import build_model
    from privsched.trainers.plans import parse_job

    job = parse_job({"kind": "dpsgd", "model": "mlp", "sample_rate": 0.1, "epochs": 1, "lr": 0.1, "max_grad_norm": 0.8})
    generator = torch.Generator().manual_seed(7)
    records = TensorDataset(torch.rand(200, 50, generator=generator).round(), torch.randint(0, 2, (200,), generator=generator))
    for mode in ("ghost", "opacus-ghost", "hooks"):
        trainer = private_trainer(build_model("mlp", 50, 2, hidden=8), records, job, 1.3, mode, CPU)
        params = list(trainer.model.parameters())
        noises = []
        for step in range(2):
            replay = torch.Generator()
            replay.set_state(trainer.optimizer.generator.get_state())
            # Opacus' secure noise: four draws of N(0, (σC)²) summed and halved
            draws = torch.empty(SECURE_DRAWS, sum(p.numel() for p in params)).normal_(0.0, 1.3 * 0.8, generator=replay)
            noise = draws.sum(dim=0) / 2
            trainer.step(*records[20 * step : 20 * step + 17])
            for p, entries in zip(params, noise.split([p.numel() for p in params])):
                # Opacus' add_noise then scale_grad, on the clipped sum the step left in summed_grad
                assert torch.equal(p.grad, (p.summed_grad + entries.view_as(p)) / 20), mode
            noises.append(noise)
        assert not torch.equal(noises[0], noises[1])


def test_the_optimizer_draws_one_normal_per_coordinate_once_secure_mode_is_turned_off():
    # the benchmark's non-secure baseline: the kept buffers are made anew for one draw
    from privsched.trainers.dpsgd import private_trainer
    from privsched.trainers.models import build_model
    from privsched.trainers.plans import parse_job

    job = parse_job({"kind": "dpsgd", "model": "logreg", "sample_rate": 0.1, "epochs": 1, "lr": 0.1, "max_grad_norm": 0.5})
    records = TensorDataset(torch.rand(200, 30).round(), torch.randint(0, 2, (200,)))
    trainer = private_trainer(build_model("logreg", 30, 2), records, job, 2.0, "ghost", CPU)
    trainer.step(*records[:15])
    trainer.optimizer.secure_mode = False
    replay = torch.Generator()
    replay.set_state(trainer.optimizer.generator.get_state())
    params = list(trainer.model.parameters())
    noise = torch.empty(1, sum(p.numel() for p in params)).normal_(0.0, 2.0 * 0.5, generator=replay).sum(dim=0)
    trainer.step(*records[15:30])
    for p, entries in zip(params, noise.split([p.numel() for p in params])):
        assert torch.equal(p.grad, (p.summed_grad + entries.view_as(p)) / 20)

"""Where secure noise costs DP-SGD its time: epochs of single-pass ghost clipping with the
noise drawn in other places and ways, against non-private epochs, in one process.

    .venv/bin/python benchmarks/dpsgd_noise.py [--models mlp,text] [--repeats 9]

Every variant trains the same model on the same data as ``benchmarks/dpsgd.py`` (its
defaults: q = 0.05, batches of about 400, Adam, one torch thread), epochs interleaved so
that load from other processes hits all alike; the table gives each variant's median
process CPU milliseconds per step and its ratio to the non-private step. The variants test
two explanations of secure noise's cost beyond its own draws:

- **cache**: the draws (four per coordinate, 1 MiB for the mlp) evict what the clipping
  pass and Adam read next. "noise drawn before the clipping pass" moves the draw to the
  start of the step; "draws in chunks of k" draws k coordinates' four normals at a time
  into a small buffer (4k floats, L2-resident) and sums them into the noise, so that the
  draws never occupy more than that; "zeros for the draws" writes and sums the same
  buffers without drawing.
- **the random numbers themselves**: "uniforms for the draws" fills the buffers with
  torch's uniform draws (the Mersenne Twister output that the normal sampler transforms)
  instead of normals.

Only "secure (default)" and "one draw" are noise a job could use (one draw is a benchmark
baseline, never a job's); the chunked draws are the same N(0, σ²C²) from the same sampler
in another order of the generator's stream; zeros and uniforms are diagnostics, no noise.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time

import torch
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from dpsgd import TRAINING, ZeroDraws, with_noise

from privsched.jobs.records import read_block_files
from privsched.trainers.dpsgd import Trainer, fit, plain_trainer, private_trainer, train_heldout
from privsched.trainers.models import build_model
from privsched.trainers.optimizers import SinglePassGhostOptimizer
from privsched.trainers.plans import parse_job
from privsched.trainers.secure_noise import SecureNoise
from workloads.reviews import write_blocks


class NoiseFirst(SinglePassGhostOptimizer):
    """Draws the step's noise when the step begins (``zero_grad``), before the clipping pass,
    and adds it after."""

    _drawn: torch.Tensor | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        params = self.params
        source = self.noise_source(sum(p.numel() for p in params), params[0])
        self._drawn = source.sample(self.noise_multiplier * self.max_grad_norm)

    def add_noise(self) -> None:
        params, noise, self._drawn = self.params, self._drawn, None
        assert noise is not None, "zero_grad draws the noise of every step"
        for p, entries in zip(params, noise.split([p.numel() for p in params])):
            _check_processed_flag(p.summed_grad)
            p.grad = entries.view_as(p).add_(p.summed_grad)
            _mark_as_processed(p.summed_grad)


def chunked(chunk: int) -> type[SecureNoise]:
    """Secure noise drawn ``chunk`` coordinates at a time through a buffer of 4·chunk floats."""

    class Chunked(SecureNoise):
        def __init__(self, numel: int, generator: torch.Generator, device: torch.device, dtype: torch.dtype, secure: bool = True) -> None:
            super().__init__(min(numel, chunk), generator, device, dtype, secure)
            self.buffer = self.draws.view(-1)
            self.noise = torch.empty(numel, device=device, dtype=dtype)

        def sample(self, std: float) -> torch.Tensor:
            rows = len(self.draws)
            for part in self.noise.split(chunk):
                draws = self.buffer[: rows * len(part)].view(rows, len(part))  # contiguous: torch's fast sampler
                draws.normal_(0.0, std / math.sqrt(rows), generator=self.generator)
                torch.sum(draws, dim=0, out=part)
            return self.noise

    return Chunked


class UniformDraws(SecureNoise):
    """Diagnostic only: the buffers filled with uniform draws instead of normals."""

    def sample(self, std: float) -> torch.Tensor:
        self.draws.uniform_(generator=self.generator)
        return torch.sum(self.draws, dim=0, out=self.noise)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,text")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        records = read_block_files(write_blocks(tmp, days=1, per_day=10_000, seed=0))
    print("| model | training | CPU ms per step | ratio |")
    print("|---|---|---:|---:|")
    for model_name in args.models.split(","):
        job = parse_job({"kind": "dpsgd", "model": model_name, "sample_rate": 0.05, "epochs": 1, **TRAINING})
        data, train, _ = train_heldout(records, job)
        steps = int(1 / job.sample_rate)

        def fresh() -> torch.nn.Module:
            torch.manual_seed(0)
            return build_model(model_name, data.vocab_size, data.n_classes)

        def private() -> Trainer:
            return private_trainer(fresh(), train, job, 1.0, "ghost", cpu)

        first = private()
        first.optimizer.__class__ = NoiseFirst
        trainers = {
            "non-private": plain_trainer(fresh(), train, job, cpu),
            "secure (default)": private(),
            "secure, noise drawn before the clipping pass": first,
            "secure, draws in chunks of 4,096 coordinates (64 KiB)": with_noise(private(), chunked(4096)),
            "secure, draws in chunks of 16,384 coordinates (256 KiB)": with_noise(private(), chunked(16384)),
            "one draw (non-secure baseline)": with_noise(private(), SecureNoise, secure=False),
            "zeros for the draws (diagnostic, no noise)": with_noise(private(), ZeroDraws),
            "uniforms for the draws (diagnostic, no noise)": with_noise(private(), UniformDraws),
        }
        for trainer in trainers.values():
            fit(trainer, steps)
        times: dict[str, list[float]] = {name: [] for name in trainers}
        for _ in range(args.repeats):
            for name, trainer in trainers.items():
                start = time.process_time()
                fit(trainer, steps)
                times[name].append((time.process_time() - start) / steps)
        base = statistics.median(times["non-private"])
        for name, measured in times.items():
            ms = statistics.median(measured)
            print(f"| {model_name} | {name} | {1e3 * ms:.3f} | {ms / base:.2f}× |")


if __name__ == "__main__":
    main()

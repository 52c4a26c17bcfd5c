"""Data-parallel DP-SGD over several processes with ``torch.distributed`` (gloo on CPUs),
the same mechanism as one process.

The records are split by position (record i to process i mod W, a partition that does not
look at the data); each process Poisson-samples its part at rate q, so that the union of
the processes' batches is one Poisson batch of the whole set at rate q. Each process clips
its examples' gradients (single-pass ghost clipping) and divides its clipped sum by the
global expected batch size B; only the first process adds the Gaussian noise N(0, σ²C²)
(as Opacus' ``DistributedDPOptimizer`` does), and the processes' results are summed
(``all_reduce``): every process takes the step (Σ clipped + noise)/B, exactly the step of
one process with the same q, σ and B (Abadi et al. 2016). The first process's accountant
counts (σ, q, steps): the charge is that of one process.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

from privsched.trainers.dpsgd import fit, private_trainer
from privsched.trainers.optimizers import SinglePassGhostOptimizer
from privsched.trainers.plans import DPSGDJob


class DistributedGhostOptimizer(SinglePassGhostOptimizer):
    """The single-pass ghost clipping optimizer of one process among ``world_size``: noise
    on the first only, each clipped sum divided by the global B, then summed over all."""

    rank: int = 0

    def add_noise(self) -> None:
        if self.rank == 0:
            super().add_noise()
            return
        for p in self.params:
            p.grad = p.summed_grad.view_as(p)

    def scale_grad(self) -> None:
        if self.rank == 0:
            super().scale_grad()
            return
        for p in self.params:
            p.grad = p.grad / (self.expected_batch_size * self.accumulated_iterations)

    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            with torch.enable_grad():
                closure()
        if not self.pre_step():
            return None
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for p, part in zip(self.params, flat.split([p.numel() for p in self.params])):
            p.grad = part.view_as(p)
        return self.original_optimizer.step()


def _worker(
    rank: int,
    world: int,
    rendezvous: str,
    warmup: int,
    model: nn.Module,
    train: TensorDataset,
    job: DPSGDJob,
    sigma: float,
    steps: int,
    batch: int,
    out: str,
) -> None:
    torch.set_num_threads(1)
    model = copy.deepcopy(model)  # its tensors arrive in memory shared with the other processes
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        part = TensorDataset(*(t[rank::world] for t in train.tensors))
        trainer = private_trainer(model, part, job, sigma, "ghost", torch.device("cpu"), batch)
        trainer.optimizer.__class__ = DistributedGhostOptimizer
        trainer.optimizer.rank = rank  # type: ignore[attr-defined]
        fit(trainer, warmup)
        dist.barrier()
        start = time.perf_counter()
        fit(trainer, steps)
        dist.barrier()
        seconds = time.perf_counter() - start
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        result = {"state": model.state_dict(), "grads": grads, "history": trainer.history, "seconds": seconds}
        torch.save(result, Path(out) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def train_distributed(
    model: nn.Module, train: TensorDataset, job: DPSGDJob, sigma: float, steps: int, batch: int, workers: int, warmup: int = 0
) -> list[dict[str, Any]]:
    """Train an all-linear ``model`` for ``steps`` DP-SGD steps on ``workers`` gloo
    processes (module docstring); returns each process's final state dict, last gradients,
    accountant history and training seconds (between barriers: all processes together), in
    rank order (the first's history is the charge). ``warmup`` steps (benchmarks only) go
    before the timed ones and are counted in the history too."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        rendezvous = str(Path(folder) / "rendezvous")
        mp.spawn(_worker, args=(workers, rendezvous, warmup, model, train, job, sigma, steps, batch, folder), nprocs=workers, join=True)
        return [torch.load(Path(folder) / f"rank{rank}.pt") for rank in range(workers)]

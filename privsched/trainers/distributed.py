"""Data-parallel DP-SGD over several processes with ``torch.distributed`` (gloo on CPUs),
the same mechanism as one process.

The records are split by position (record i to process i mod W, a partition that does not
look at the data); each process Poisson-samples its part at rate q, so that the union of
the processes' batches is one Poisson batch of the whole set at rate q. Each process clips
its examples' gradients (single-pass ghost clipping) and divides its clipped sum by the
global expected batch size B; each process adds the Gaussian noise N(0, σ²C²) of its own
1/W of the coordinates (where Opacus' ``DistributedDPOptimizer`` has the first process draw
all of it, which makes the first the slowest), and the processes' results are summed
(``all_reduce``): every process takes the step (Σ clipped + noise)/B, each coordinate with
exactly one draw of N(0, σ²C²), the step of one process with the same q, σ and B (Abadi et
al. 2016, Algorithm 1). The first process's accountant counts (σ, q, steps): the charge is
that of one process.

A granted job with ``workers`` > 1 (or several GPUs) runs :class:`Ranks`: its confined
process forks the other W − 1 processes before any torch work (an OpenMP thread pool does
not survive a fork, nor does CUDA), so that all share its sandbox, its private tmp and its
network namespace; they meet through a ``FileStore`` in that tmp, and gloo's (or on GPUs
NCCL's) transport runs over the namespace's own loopback (docs/sandbox.md). Only the first
process reads data (through the supervisor, as a one-process job does); it sends each other
process its share and the plan over a socket pair.

On the Ray executor, ranks that run across nodes (Ray Train's ``TorchTrainer``,
:mod:`privsched.service.executors.ray_train`) are each a confined job process of their own
under a supervisor on their node: :class:`GroupRanks`. They meet at the address and port
privsched chose (``ctx.rendezvous``, a TCP store on the first rank's node), over the host
network that sandbox leaves them (docs/sandbox.md, "Ranks across nodes"); the first rank alone
reads data and sends every other rank its share and the plan over the process group
(``scatter_object_list``). The other ranks' contexts name no block locations: they could not
read data if they tried.
"""

from __future__ import annotations

import copy
import os
import pickle
import signal
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import nn
from torch.utils.data import TensorDataset

from privsched.jobs.context import JobContext
from privsched.trainers.dpsgd import Trainer, declarations, fit, initial_model, private_trainer, shape_only
from privsched.trainers.models import ghost_clipping_applies
from privsched.trainers.optimizers import SinglePassGhostOptimizer
from privsched.trainers.plans import DPSGDJob

#: Why a model cannot train data-parallel.
ALL_LINEAR = "data-parallel DP-SGD needs single-pass ghost clipping: a model whose trainable layers are all linear"
#: Longest wait of one collective operation (or of the rendezvous) before a process gives up.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


def noise_slice(numel: int, rank: int, world: int) -> slice:
    """The coordinates of the flat gradient (of ``numel``) whose noise process ``rank`` draws:
    the ``rank``-th of ``world`` contiguous runs, which together cover every coordinate once."""
    return slice(numel * rank // world, numel * (rank + 1) // world)


class DistributedGhostOptimizer(SinglePassGhostOptimizer):
    """The single-pass ghost clipping optimizer of process ``rank`` among ``world``: its
    clipped sums, flat, plus the noise N(0, σ²C²) of its own :func:`noise_slice` of the
    coordinates (from its own OS-seeded generator, secure mode), divided by the global B,
    then summed over all processes (``all_reduce``). After the sum each coordinate carries
    exactly one independent draw of N(0, σ²C²), as in one process's step (Abadi et al. 2016,
    Algorithm 1), while each process draws only 1/W of the noise."""

    rank: int = 0
    world: int = 1
    _flat: torch.Tensor | None = None

    def add_noise(self) -> None:
        params = self.params
        sizes = [p.numel() for p in params]
        for p in params:
            _check_processed_flag(p.summed_grad)
        flat = torch.cat([p.summed_grad.reshape(-1) for p in params])
        own = noise_slice(flat.numel(), self.rank, self.world)
        flat[own].add_(self.noise_source(own.stop - own.start, flat).sample(self.noise_multiplier * self.max_grad_norm))
        for p, part in zip(params, flat.split(sizes)):
            p.grad = part.view_as(p)
            _mark_as_processed(p.summed_grad)
        self._flat = flat

    def scale_grad(self) -> None:
        if self.loss_reduction == "mean" and self._flat is not None:
            self._flat.div_(self.expected_batch_size * self.accumulated_iterations)

    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            with torch.enable_grad():
                closure()
        if not self.pre_step():
            return None
        assert self._flat is not None  # every p.grad is a view of it
        dist.all_reduce(self._flat, op=dist.ReduceOp.SUM)
        return self.original_optimizer.step()


def shard(tensors: tuple[torch.Tensor, ...], rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """Process ``rank``'s share of the records: those at positions i with i mod W = rank (a
    partition that looks only at positions, so each record is in exactly one share)."""
    return tuple(t[rank::world] for t in tensors)


def rank_device(device_type: str, rank: int) -> torch.device:
    """Process ``rank``'s device: its own GPU (``CUDA_VISIBLE_DEVICES`` names the job's), else the CPU."""
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


@contextmanager
def process_group(rank: int, world: int, store: Path, device: torch.device) -> Iterator[None]:
    """Join the job's ``world`` processes: rendezvous through a ``FileStore`` at ``store``,
    gloo on CPUs or NCCL on GPUs, over the loopback (all processes share one host and, when
    confined, one network namespace whose only interface it is)."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["NCCL_SOCKET_IFNAME"] = "lo"
    os.environ["NCCL_SHM_DISABLE"] = "1"  # a confined job has no /dev/shm
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()


def rank_trainer(
    model: nn.Module, part: TensorDataset, job: DPSGDJob, sigma: float, device: torch.device, batch: int, rank: int, world: int
) -> Trainer:
    """Process ``rank``'s DP-SGD trainer on its share: single-pass ghost clipping, the noise
    of its slice of the coordinates, every clipped sum divided by the global expected batch
    ``batch`` (:class:`DistributedGhostOptimizer`)."""
    trainer = private_trainer(model, part, job, sigma, "ghost", device, batch)
    trainer.optimizer.__class__ = DistributedGhostOptimizer
    trainer.optimizer.rank = rank  # type: ignore[attr-defined]
    trainer.optimizer.world = world  # type: ignore[attr-defined]
    return trainer


def _serve_rank(rank: int, world: int, store: Path, device_type: str, threads: int, conn: Connection) -> None:
    """A forked process of a data-parallel job: wait for its share and the plan, train it in
    step with the others, say it is done. Nothing to train (the job ended first): return."""
    torch.set_num_threads(threads)
    message = conn.recv_bytes()
    if not message:
        return
    model, tensors, job, sigma, batch, steps = pickle.loads(message)
    device = rank_device(device_type, rank)
    with process_group(rank, world, store, device):
        fit(rank_trainer(model, TensorDataset(*tensors), job, sigma, device, batch, rank, world), steps)
    conn.send_bytes(b"done")


class Ranks:
    """The other processes of a data-parallel job (module docstring), forked by
    :meth:`start` before any torch work; the job trains as the first one with
    :meth:`train`. Leaving the ``with`` block ends them all: a process that failed fails the job."""

    def __init__(self, world: int, device_type: str) -> None:
        self.world = world
        self.device_type = device_type
        self.store = Path(tempfile.mkdtemp(prefix="rendezvous-")) / "store"
        self.threads = max(1, torch.get_num_threads() // world)
        self.children: list[tuple[int, Connection]] = []
        self.sent = False

    @classmethod
    def start(cls, world: int, device_type: str) -> Ranks:
        ranks = cls(world, device_type)
        for rank in range(1, world):
            ours, theirs = Pipe()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    ours.close()
                    for _, other in ranks.children:
                        other.close()
                    _serve_rank(rank, world, ranks.store, device_type, ranks.threads, theirs)
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            theirs.close()
            ranks.children.append((pid, ours))
        torch.set_num_threads(ranks.threads)
        return ranks

    def __enter__(self) -> Ranks:
        return self

    def train(
        self, model: nn.Module, train: TensorDataset, job: DPSGDJob, sigma: float, mode: str, device: torch.device, batch: int, steps: int
    ) -> tuple[Trainer, int]:
        """Train ``steps`` steps on every process, each on its :func:`shard` of ``train``
        with the global expected batch ``batch``; returns the first process's trainer (its
        accountant's history is the charge) and the steps taken. Needs single-pass ghost
        clipping (a model whose trainable layers are all linear): else ``ValueError``."""
        if mode != "ghost":
            raise ValueError(ALL_LINEAR)
        device = rank_device(device.type, 0)  # "cuda" names no GPU: the first process takes the first
        for rank, (_, conn) in enumerate(self.children, start=1):
            conn.send_bytes(pickle.dumps((model, shard(train.tensors, rank, self.world), job, sigma, batch, steps)))
        self.sent = True
        with process_group(0, self.world, self.store, device):
            trainer = rank_trainer(model, TensorDataset(*shard(train.tensors, 0, self.world)), job, sigma, device, batch, 0, self.world)
            taken = fit(trainer, steps)
        for rank, (_, conn) in enumerate(self.children, start=1):
            if conn.recv_bytes() != b"done":
                raise RuntimeError(f"data-parallel process {rank} did not finish its steps")
        return trainer, taken

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for pid, conn in self.children:
            if kind is not None:
                os.kill(pid, signal.SIGKILL)
            elif not self.sent:
                conn.send_bytes(b"")
            conn.close()
        failed = [rank for rank, (pid, _) in enumerate(self.children, start=1) if os.waitpid(pid, 0)[1] != 0]
        if kind is None and failed:
            raise RuntimeError(f"data-parallel process {failed[0]} failed")


def check_parallel(job: DPSGDJob, ctx: JobContext) -> None:
    """Refuse, before any data is read (so the job is charged nothing), a job data-parallel
    processes cannot train: a clipping mode other than single-pass ghost clipping, or a model
    sized by the job and the dataset's declarations with a non-linear trainable layer (a
    model sized by its blocks is checked when it trains)."""
    if job.grad_sample_mode not in (None, "ghost"):
        raise ValueError(f"data-parallel DP-SGD uses single-pass ghost clipping, not {job.grad_sample_mode!r}")
    try:
        data = shape_only(job, declarations(ctx))
    except ValueError:
        return
    if not ghost_clipping_applies(initial_model(job, data)):
        raise ValueError(ALL_LINEAR)


@contextmanager
def network_group(rank: int, world: int, rendezvous: dict[str, Any], device: torch.device) -> Iterator[None]:
    """Join ranks on several hosts: a TCP store at ``rendezvous["address"]:rendezvous["port"]``
    (the first rank serves it), gloo over ``rendezvous["interface"]`` for CPU tensors and the
    objects ranks send one another, NCCL for GPU tensors."""
    os.environ["GLOO_SOCKET_IFNAME"] = str(rendezvous["interface"])
    os.environ["NCCL_SOCKET_IFNAME"] = str(rendezvous["interface"])
    os.environ["NCCL_SHM_DISABLE"] = "1"  # a confined job has no /dev/shm
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init = f"tcp://{rendezvous['address']}:{int(rendezvous['port'])}"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()


class GroupRanks:
    """This process as one rank of a data-parallel job whose ranks run across nodes (module
    docstring): ranks meet when the ``with`` block starts; the first trains with
    :meth:`train` (the same interface as :class:`Ranks`), every other waits in :meth:`serve`.
    A first rank that ends without training sends the others nothing to train."""

    def __init__(self, ctx: JobContext) -> None:
        assert ctx.rendezvous is not None
        self.world, self.rank, self.rendezvous = ctx.workers, ctx.rank, ctx.rendezvous
        self.device = rank_device(ctx.device, 0)  # each rank sees its own GPU only (ray_train.run_rank)
        self.sent = False
        self._group = network_group(self.rank, self.world, self.rendezvous, self.device)

    def __enter__(self) -> GroupRanks:
        self._group.__enter__()
        return self

    def train(
        self, model: nn.Module, train: TensorDataset, job: DPSGDJob, sigma: float, mode: str, device: torch.device, batch: int, steps: int
    ) -> tuple[Trainer, int]:
        """As :meth:`Ranks.train`, the shares sent over the process group."""
        if mode != "ghost":
            raise ValueError(ALL_LINEAR)
        shares = [None] + [(model, shard(train.tensors, r, self.world), job, sigma, batch, steps) for r in range(1, self.world)]
        dist.scatter_object_list([None], shares, src=0)
        self.sent = True
        trainer = rank_trainer(model, TensorDataset(*shard(train.tensors, 0, self.world)), job, sigma, self.device, batch, 0, self.world)
        taken = fit(trainer, steps)
        dist.barrier()  # every rank took its steps
        return trainer, taken

    def serve(self) -> None:
        """Another rank: train the share and plan the first rank sends (or nothing)."""
        received: list[Any] = [None]
        dist.scatter_object_list(received, None, src=0)
        if received[0] is None:
            return
        model, tensors, job, sigma, batch, steps = received[0]
        fit(rank_trainer(model, TensorDataset(*tensors), job, sigma, self.device, batch, self.rank, self.world), steps)
        dist.barrier()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self.rank == 0 and not self.sent and kind is None:
                dist.scatter_object_list([None], [None] * self.world, src=0)
        finally:
            self._group.__exit__(kind, exc, tb)


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
    device_type: str,
) -> None:
    torch.set_num_threads(1)
    model = copy.deepcopy(model)  # its tensors arrive in memory shared with the other processes
    device = rank_device(device_type, rank)
    with process_group(rank, world, Path(rendezvous), device):
        part = TensorDataset(*shard(train.tensors, rank, world))
        trainer = rank_trainer(model, part, job, sigma, device, batch, rank, world)
        fit(trainer, warmup)
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        fit(trainer, steps)
        dist.barrier()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        grads = [p.grad.cpu() for p in model.parameters() if p.grad is not None]
        state = {k: v.cpu() for k, v in model.state_dict().items()}
        result = {"state": state, "grads": grads, "history": trainer.history, "seconds": seconds, "cpu": cpu}
        torch.save(result, Path(out) / f"rank{rank}.pt")
        dist.barrier()


def train_distributed(
    model: nn.Module,
    train: TensorDataset,
    job: DPSGDJob,
    sigma: float,
    steps: int,
    batch: int,
    workers: int,
    warmup: int = 0,
    device_type: str = "cpu",
) -> list[dict[str, Any]]:
    """Train an all-linear ``model`` for ``steps`` DP-SGD steps on ``workers`` gloo
    processes (NCCL, one GPU each, for ``device_type`` "cuda") started by
    ``torch.multiprocessing`` (tests and benchmarks: a job forks its own, :class:`Ranks`),
    as the module docstring says; returns each process's final state dict, last gradients,
    accountant history, training seconds (between barriers: all processes together) and
    its own CPU seconds in
    rank order (the first's history is the charge). ``warmup`` steps (benchmarks only) go
    before the timed ones and are counted in the history too."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        rendezvous = str(Path(folder) / "rendezvous")
        args = (workers, rendezvous, warmup, model, train, job, sigma, steps, batch, folder, device_type)
        mp.spawn(_worker, args=args, nprocs=workers, join=True)
        return [torch.load(Path(folder) / f"rank{rank}.pt") for rank in range(workers)]

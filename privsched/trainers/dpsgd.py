"""DP-SGD training on Opacus (Abadi et al. 2016; Yousefpour et al. 2021), within a grant.

A granted job trains a zoo model on its granted blocks with Poisson sampling at rate q,
per-sample clipping to C and Gaussian noise of standard deviation σC per step. Clipping
runs in one of three modes (``grad_sample_mode``): "ghost", single-pass ghost clipping
for models whose trainable layers are all linear (:mod:`privsched.trainers.clipping`,
the default for them); "opacus-ghost", Opacus' two-pass fast gradient clipping (the default for the other
models); "hooks", Opacus' per-sample gradients. The noise
multiplier σ is the one its plan was charged with (RDP calibration, docs/design.md §3.4). The
trainer never takes a step whose cumulative cost ``compute_rdp(q, σ, steps, orders)`` would
exceed the grant in any dimension, may stop earlier (``max_steps``, early stopping on the
held-out loss), and reports the budget of the steps it actually took, read from the Opacus
accountant that counted them: the scheduler releases the rest (docs/design.md §4.4).

Held-out loss and accuracy are computed on records of the granted blocks kept out of
training; like the paper's accuracy figures they are not themselves noised.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privsched.budgets.accounting import Accounting, leq
from privsched.budgets.curves import subsampled_gaussian_curve
from privsched.jobs.context import JobContext
from privsched.trainers.clipping import GhostClipping
from privsched.trainers.data import bag_of_words, load_blocks, split
from privsched.trainers.models import INPUTS, build_model, ghost_clipping_applies
from privsched.trainers.plans import GRAD_SAMPLE_MODES, DPSGDJob

if TYPE_CHECKING:
    from opacus.accountants import RDPAccountant

#: Opacus warnings that say nothing about a correct run (secure RNG off by choice, backward
#: hooks on modules whose inputs need no gradient, the RDP conversion's order range).
_QUIET = (
    "Secure RNG turned off",
    "Using a non-full backward hook",
    "Full backward hook is firing",
    "Optimal order is the largest alpha",
)


@dataclass
class Examples:
    """A job's records as model inputs and labels."""

    inputs: torch.Tensor
    labels: torch.Tensor
    n_classes: int
    vocab_size: int

    def subset(self, index: np.ndarray) -> TensorDataset:
        idx = torch.as_tensor(index, dtype=torch.long)
        return TensorDataset(self.inputs[idx], self.labels[idx])


def examples(records: dict[str, np.ndarray], model: str, target: str) -> Examples:
    """Inputs of the kind ``model`` reads (bag of words or token ids) and ``target`` labels."""
    tokens = records["tokens"]
    vocab_size = int(records["vocab_size"]) if "vocab_size" in records else int(tokens.max()) + 1
    labels = records[target].astype(np.int64)
    if target == "category":
        n_classes = int(records["n_categories"]) if "n_categories" in records else int(labels.max()) + 1
    else:
        n_classes = 2
    if INPUTS[model] == "bow":
        inputs = torch.from_numpy(bag_of_words(tokens, vocab_size))
    else:
        inputs = torch.from_numpy(tokens.astype(np.int64))
    return Examples(inputs, torch.from_numpy(labels), n_classes, vocab_size)


def train_heldout(records: dict[str, np.ndarray], job: DPSGDJob) -> tuple[Examples, TensorDataset, TensorDataset]:
    """The job's examples and their seeded (train, held-out) split."""
    data = examples(records, job.model, job.target)
    train_idx, held_idx = split(len(data.labels), job.holdout, job.seed)
    return data, data.subset(train_idx), data.subset(held_idx)


class PoissonBatches:
    """Poisson-sampled batches (Abadi et al. 2016, the sampled Gaussian mechanism): at every
    step each record joins the batch independently with probability q.

    The draw is the one Opacus' ``UniformWithReplacementSampler`` makes (one uniform number
    per record, kept when below q), gathered on whole tensors rather than record by record.
    An epoch is ``int(1/q)`` steps, Opacus' convention; a batch may be empty."""

    def __init__(self, data: TensorDataset, sample_rate: float, generator: torch.Generator) -> None:
        self.tensors = data.tensors
        self.sample_rate = sample_rate
        self.generator = generator

    def __len__(self) -> int:
        return int(1 / self.sample_rate)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        n = len(self.tensors[0])
        for _ in range(len(self)):
            index = (torch.rand(n, generator=self.generator) < self.sample_rate).nonzero().flatten()
            yield tuple(t.index_select(0, index) for t in self.tensors)


class ShuffledBatches:
    """Non-private epochs: a seeded permutation of the records cut into batches of
    ``batch_size`` (the last one shorter), as ``DataLoader(shuffle=True)`` yields them."""

    def __init__(self, data: TensorDataset, batch_size: int, generator: torch.Generator) -> None:
        self.tensors = data.tensors
        self.batch_size = batch_size
        self.generator = generator

    def __len__(self) -> int:
        return math.ceil(len(self.tensors[0]) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        order = torch.randperm(len(self.tensors[0]), generator=self.generator)
        for index in order.split(self.batch_size):
            yield tuple(t.index_select(0, index) for t in self.tensors)


def spent_budget(history: list[tuple[float, float, int]], accounting: Accounting, delta: float) -> np.ndarray:
    """Budget of the steps an Opacus RDP accountant recorded as (σ, q, steps) entries.

    RDP: Σ compute_rdp(q, σ, steps, orders) on the dataset's orders. Basic: (ε, δ) with ε
    the RDP accountant's conversion at δ (Balle et al. 2020), or (0, 0) before any step."""
    if accounting.is_rdp:
        total = np.zeros(accounting.dims)
        for sigma, q, steps in history:
            total = total + subsampled_gaussian_curve(q, sigma, steps, accounting.alphas)
        return total
    if not history:
        return np.zeros(2)
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = list(history)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_QUIET[-1])
        return np.array([accountant.get_epsilon(delta=delta), delta])


def affordable_steps(
    budget: np.ndarray, accounting: Accounting, sample_rate: float, sigma: float, delta: float, limit: int
) -> int:
    """Most steps (≤ ``limit``) whose cumulative cost stays within ``budget`` in every
    dimension; the cost grows with the number of steps, so a bisection finds it."""

    def fits(steps: int) -> bool:
        return bool(np.all(leq(spent_budget([(sigma, sample_rate, steps)], accounting, delta), budget)))

    if fits(limit):
        return limit
    low, high = 0, limit  # fits(low), not fits(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def evaluate(model: nn.Module, data: TensorDataset, device: torch.device) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``data``."""
    model.eval()
    inputs, labels = data.tensors
    with torch.no_grad():
        logits = model(inputs.to(device))
        loss = nn.functional.cross_entropy(logits, labels.to(device)).item()
        accuracy = (logits.argmax(dim=1).cpu() == labels).float().mean().item()
    model.train()
    return loss, accuracy


def make_optimizer(model: nn.Module, job: DPSGDJob) -> torch.optim.Optimizer:
    if job.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=job.lr)
    return torch.optim.SGD(model.parameters(), lr=job.lr)


#: The clipping modes run by Opacus' ``make_private``, with its ``grad_sample_mode`` name.
OPACUS_MODES = {"opacus-ghost": "ghost", "hooks": "hooks"}


def default_mode(model: nn.Module) -> str:
    """Single-pass ghost clipping where every trainable layer is linear, Opacus' two-pass
    ghost clipping elsewhere (2× faster than hooks on ``cnn``, 10 % on ``lstm``:
    ``benchmarks/dpsgd.py``)."""
    return "ghost" if ghost_clipping_applies(model) else "opacus-ghost"


@dataclass
class Trainer:
    """A model ready to train: the (possibly Opacus-wrapped) module, optimizer, loss, batches;
    for private training the accountant its optimizer steps and, in the "ghost" mode, the
    single-pass clipping that fills the gradients."""

    model: nn.Module  # the plain model, whose state_dict is saved
    module: nn.Module
    optimizer: torch.optim.Optimizer
    criterion: nn.Module
    batches: PoissonBatches | ShuffledBatches
    device: torch.device
    mode: str | None = None
    accountant: RDPAccountant | None = None
    clipping: GhostClipping | None = None

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        """One optimiser step. An empty Poisson batch under ghost clipping is a noise-only
        step (the noisy sum of zero clipped gradients), which Opacus' hooks mode also takes."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.mode in ("ghost", "opacus-ghost") and len(labels) == 0:
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
        elif self.clipping is not None:
            self.clipping.accumulate(inputs.to(self.device), labels.to(self.device))
        else:
            loss = self.criterion(self.module(inputs.to(self.device)), labels.to(self.device))
            loss.backward()
        self.optimizer.step()

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """(σ, q, steps) entries of the Opacus accountant (empty when not private)."""
        return list(self.accountant.history) if self.accountant is not None else []


def private_trainer(
    model: nn.Module, train: TensorDataset, job: DPSGDJob, sigma: float, mode: str, device: torch.device
) -> Trainer:
    """A DP-SGD trainer with explicit noise σ in clipping ``mode`` (see :data:`OPACUS_MODES`).

    Batches sample each record independently with probability q (:class:`PoissonBatches`)
    and an Opacus RDP accountant is stepped with that same q by the optimizer, so that its
    record is exactly ``(σ, q, steps taken)``. The optimizer adds noise N(0, σ²C²) to the
    clipped sum and divides by the expected batch size q·n. Raises ``ValueError`` for an
    unknown mode, or "ghost" on a model with a non-linear trainable layer."""
    from opacus.accountants import RDPAccountant
    from opacus.optimizers import DPOptimizerFastGradientClipping

    if mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"unknown grad_sample_mode {mode!r} (expected one of {', '.join(GRAD_SAMPLE_MODES)})")
    if mode in OPACUS_MODES:
        return opacus_trainer(model, train, job, sigma, mode, device)
    model.to(device)
    clipping = GhostClipping(model, job.max_grad_norm, nn.CrossEntropyLoss(reduction="sum"))
    optimizer = DPOptimizerFastGradientClipping(
        make_optimizer(model, job),
        noise_multiplier=sigma,
        max_grad_norm=job.max_grad_norm,
        expected_batch_size=expected_batch_size(job, train),
        loss_reduction="mean",
    )
    accountant = RDPAccountant()
    optimizer.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=job.sample_rate))
    batches = PoissonBatches(train, job.sample_rate, torch.Generator().manual_seed(job.seed))
    return Trainer(model, model, optimizer, nn.CrossEntropyLoss(), batches, device, mode, accountant, clipping)


def opacus_trainer(
    model: nn.Module, train: TensorDataset, job: DPSGDJob, sigma: float, mode: str, device: torch.device
) -> Trainer:
    """Wrap a model with Opacus ``make_private`` in an Opacus clipping mode ("opacus-ghost"
    or "hooks"); the nominal loader handed to ``make_private`` is never iterated."""
    from opacus import PrivacyEngine

    model.to(device)
    batch_size = expected_batch_size(job, train)
    loader = DataLoader(train, batch_size=batch_size)
    criterion = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message)
        engine = PrivacyEngine()
        wrapped = engine.make_private(
            module=model,
            optimizer=make_optimizer(model, job),
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=job.max_grad_norm,
            poisson_sampling=False,  # PoissonBatches sample at rate q
            grad_sample_mode=OPACUS_MODES[mode],
        )
    if mode == "opacus-ghost":
        module, optimizer, criterion, _ = wrapped
    else:
        module, optimizer, _ = wrapped
    optimizer.expected_batch_size = batch_size
    optimizer.attach_step_hook(engine.accountant.get_optimizer_hook_fn(sample_rate=job.sample_rate))
    batches = PoissonBatches(train, job.sample_rate, torch.Generator().manual_seed(job.seed))
    return Trainer(model, module, optimizer, criterion, batches, device, mode, engine.accountant)


def expected_batch_size(job: DPSGDJob, train: TensorDataset) -> int:
    """q·n rounded, at least 1: the denominator of DP-SGD's mean gradient."""
    return max(1, round(job.sample_rate * len(train)))


def plain_trainer(model: nn.Module, train: TensorDataset, job: DPSGDJob, device: torch.device) -> Trainer:
    """The same model, optimiser and expected batch size q·n without privacy (shuffled batches)."""
    model.to(device)
    batches = ShuffledBatches(train, expected_batch_size(job, train), torch.Generator().manual_seed(job.seed))
    return Trainer(model, model, make_optimizer(model, job), nn.CrossEntropyLoss(), batches, device)


def fit(trainer: Trainer, steps: int, heldout: TensorDataset | None = None, patience: int | None = None) -> tuple[int, bool]:
    """Take up to ``steps`` steps, in epochs of ``len(trainer.batches)`` steps; with
    ``patience``, stop once the held-out loss has not improved for that many epochs.
    Returns (steps taken, whether it stopped early)."""
    taken, best, stale = 0, math.inf, 0
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message)
        while taken < steps:
            for inputs, labels in trainer.batches:
                if taken == steps:
                    break
                trainer.step(inputs, labels)
                taken += 1
            if patience is not None and heldout is not None and taken < steps:
                loss, _ = evaluate(trainer.model, heldout, trainer.device)
                best, stale = (loss, 0) if loss < best else (best, stale + 1)
                if stale >= patience:
                    return taken, True
    return taken, False


def run_dpsgd(ctx: JobContext, job: DPSGDJob, sigma: float, delta: float) -> None:
    """Train the job's model within its grant; save ``model.pt`` and ``metrics.json`` under
    the work directory; report metrics and the budget actually spent."""
    data, train, heldout = train_heldout(load_blocks(ctx), job)
    planned = min(job.steps, job.max_steps or job.steps)
    steps = affordable_steps(ctx.budget, ctx.accounting, job.sample_rate, sigma, delta, planned)
    torch.manual_seed(job.seed)
    model = build_model(job.model, data.vocab_size, data.n_classes, job.embed_dim, job.hidden)
    mode = job.grad_sample_mode or default_mode(model)
    device = torch.device(ctx.device)
    trainer = private_trainer(model, train, job, sigma, mode, device)
    taken, early = fit(trainer, steps, heldout, job.patience)
    spent = spent_budget(trainer.history, ctx.accounting, delta)
    loss, accuracy = evaluate(model, heldout, device)
    reason = "early_stopping" if early else "budget" if steps < planned else "max_steps" if planned < job.steps else "plan"
    metrics = {
        "model": job.model,
        "grad_sample_mode": mode,
        "sample_rate": job.sample_rate,
        "noise_multiplier": sigma,
        "planned_steps": job.steps,
        "steps": taken,
        "stopped": reason,
        "train_records": len(train),
        "heldout_records": len(heldout),
        "heldout_loss": loss,
        "heldout_accuracy": accuracy,
        "spent": spent.tolist(),
    }
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), ctx.workdir / "model.pt")
    (ctx.workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    ctx.report_metrics(**metrics)
    ctx.report_spent(spent)

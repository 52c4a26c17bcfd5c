"""DP-SGD training on Opacus (Abadi et al. 2016; Yousefpour et al. 2021), within a grant.

A granted job trains a zoo model on its granted blocks with Poisson sampling at rate q,
per-sample clipping to C and Gaussian noise of standard deviation σC per step. Clipping
runs in one of three modes (``grad_sample_mode``): "ghost", single-pass ghost clipping
for models whose trainable layers are all linear (:mod:`privsched.trainers.clipping`,
the default for them); "opacus-ghost", Opacus' two-pass fast gradient clipping (the default for the other
models); "hooks", Opacus' per-sample gradients. The noise
multiplier σ is the one its plan was charged with (RDP calibration, docs/design.md §3.4). The
trainer never takes a step whose cumulative cost ``compute_rdp(q, σ, steps, orders)``, plus
the held-out accuracy release, would exceed the grant in any dimension, may stop earlier
(``max_steps``), and reports the budget of the steps it actually took, read from the Opacus
accountant that counted them, plus the accuracy release: the scheduler releases the rest
(docs/design.md §4.4).

Randomness: the Gaussian noise comes from Opacus' optimizer built with ``secure_mode=True``
(each coordinate sums four normal draws, resisting floating-point attacks; Holohan & Braghin
2021), drawn for all parameters at once (:mod:`privsched.trainers.optimizers`, the same
distribution) on a generator seeded from OS entropy (:func:`secure_generator`); the Poisson batches
and the held-out split draw from OS entropy too. The job's ``seed`` fixes only the model's
initial weights. What leaves the job (``model.pt``, ``metrics.json``, reported metrics) is
the model, the public plan, and a held-out accuracy released as a noisy histogram
(correct, wrong) whose Laplace noise is part of the charged plan (:func:`release_accuracy`);
no exact record count or un-noised metric.
"""

from __future__ import annotations

import json
import math
import secrets
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from privsched.budgets.accounting import Accounting, leq
from privsched.budgets.mechanisms import EpsilonDelta, demand_vector
from privsched.budgets.sgm import subsampled_gaussian_curve
from privsched.jobs.context import JobContext
from privsched.trainers.clipping import GhostClipping
from privsched.jobs.records import load_blocks
from privsched.statistics.noise import laplace_scale, noisy, within_charge
from privsched.trainers.data import bag_of_words, split
from privsched.trainers.models import INPUTS, build_model, ghost_clipping_applies
from privsched.trainers.plans import GRAD_SAMPLE_MODES, DPSGDJob, DPSGDPlan

if TYPE_CHECKING:
    from opacus.accountants import RDPAccountant

#: Opacus warnings that say nothing about a correct run (backward hooks on modules whose
#: inputs need no gradient, the RDP conversion's order range).
_QUIET = (
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
    """The job's examples and their (train, held-out) split, drawn from OS entropy."""
    data = examples(records, job.model, job.target)
    train_idx, held_idx = split(len(data.labels), job.holdout)
    return data, data.subset(train_idx), data.subset(held_idx)


def secure_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on ``device`` seeded with 64 bits from the OS (``secrets``), never
    from a user seed: the source of DP-SGD's noise (on the model's device, where Opacus
    draws it) and of Poisson sampling (on the CPU, where the records are)."""
    return torch.Generator(device=device).manual_seed(secrets.randbits(64))


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
    budget: np.ndarray,
    accounting: Accounting,
    sample_rate: float,
    sigma: float,
    delta: float,
    limit: int,
    extra: np.ndarray | float = 0.0,
) -> int:
    """Most steps (≤ ``limit``) whose cumulative cost plus ``extra`` (the other releases)
    stays within ``budget`` in every dimension; the cost grows with the number of steps,
    so a bisection finds it."""

    def fits(steps: int) -> bool:
        return bool(np.all(leq(spent_budget([(sigma, sample_rate, steps)], accounting, delta) + extra, budget)))

    if fits(limit):
        return limit
    low, high = 0, limit  # fits(low), not fits(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def evaluate(model: nn.Module, data: TensorDataset, device: torch.device) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``data``: exact, hence never released
    from sensitive data (non-private baselines on synthetic data only)."""
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


def private_trainer(model: nn.Module, train: TensorDataset, job: DPSGDJob, sigma: float, mode: str, device: torch.device) -> Trainer:
    """A DP-SGD trainer with explicit noise σ in clipping ``mode`` (see :data:`OPACUS_MODES`).

    Batches sample each record independently with probability q (:class:`PoissonBatches`)
    and an Opacus RDP accountant is stepped with that same q by the optimizer, so that its
    record is exactly ``(σ, q, steps taken)``. The optimizer adds noise N(0, σ²C²) to the
    clipped sum and divides by the expected batch size q·n. Raises ``ValueError`` for an
    unknown mode, or "ghost" on a model with a non-linear trainable layer."""
    if mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"unknown grad_sample_mode {mode!r} (expected one of {', '.join(GRAD_SAMPLE_MODES)})")
    if mode in OPACUS_MODES:
        return opacus_trainer(model, train, job, sigma, mode, device)
    model.to(device)
    clipping = GhostClipping(model, job.max_grad_norm, nn.CrossEntropyLoss(reduction="sum"))
    optimizer, accountant, batches = private_parts(mode, model, train, job, sigma, device)
    return Trainer(model, model, optimizer, nn.CrossEntropyLoss(), batches, device, mode, accountant, clipping)


def private_parts(
    mode: str, model: nn.Module, train: TensorDataset, job: DPSGDJob, sigma: float, device: torch.device
) -> tuple[Any, RDPAccountant, PoissonBatches]:
    """What every clipping mode shares: the Opacus DP optimizer of ``mode``
    (:data:`privsched.trainers.optimizers.OPTIMIZERS`) built directly with
    ``secure_mode=True`` and noise from an OS-seeded generator on ``device``, the RDP
    accountant its steps feed, and Poisson batches drawn from OS entropy."""
    from opacus.accountants import RDPAccountant

    from privsched.trainers.optimizers import OPTIMIZERS

    optimizer = OPTIMIZERS[mode](
        optimizer=make_optimizer(model, job),
        noise_multiplier=sigma,
        max_grad_norm=job.max_grad_norm,
        expected_batch_size=expected_batch_size(job, train),
        loss_reduction="mean",
        generator=secure_generator(device),
        secure_mode=True,
    )
    accountant = RDPAccountant()
    optimizer.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=job.sample_rate))
    return optimizer, accountant, PoissonBatches(train, job.sample_rate, secure_generator())


def opacus_trainer(model: nn.Module, train: TensorDataset, job: DPSGDJob, sigma: float, mode: str, device: torch.device) -> Trainer:
    """Wrap a model for an Opacus clipping mode ("opacus-ghost" or "hooks") and build the
    matching Opacus ``DPOptimizer`` directly, with ``secure_mode=True`` and a generator from
    OS entropy (Opacus' ``PrivacyEngine`` secure mode needs torchcsprng)."""
    from opacus.grad_sample.utils import prepare_module
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    model.to(device)
    grad_sample_mode = OPACUS_MODES[mode]
    extra = {"max_grad_norm": job.max_grad_norm} if grad_sample_mode == "ghost" else {}
    module = prepare_module(model, grad_sample_mode=grad_sample_mode, batch_first=True, loss_reduction="mean", **extra)
    optimizer, accountant, batches = private_parts(mode, model, train, job, sigma, device)
    criterion: nn.Module = nn.CrossEntropyLoss()
    if grad_sample_mode == "ghost":
        criterion = DPLossFastGradientClipping(module, optimizer, criterion, "mean")
    return Trainer(model, module, optimizer, criterion, batches, device, mode, accountant)


def expected_batch_size(job: DPSGDJob, train: TensorDataset) -> int:
    """q·n rounded, at least 1: the denominator of DP-SGD's mean gradient."""
    return max(1, round(job.sample_rate * len(train)))


def plain_trainer(model: nn.Module, train: TensorDataset, job: DPSGDJob, device: torch.device) -> Trainer:
    """The same model, optimiser and expected batch size q·n without privacy (shuffled batches)."""
    model.to(device)
    batches = ShuffledBatches(train, expected_batch_size(job, train), torch.Generator().manual_seed(job.seed))
    return Trainer(model, model, make_optimizer(model, job), nn.CrossEntropyLoss(), batches, device)


def fit(trainer: Trainer, steps: int) -> int:
    """Take ``steps`` steps, in epochs of ``len(trainer.batches)`` steps; returns the count."""
    taken = 0
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message)
        while taken < steps:
            for inputs, labels in trainer.batches:
                if taken == steps:
                    break
                trainer.step(inputs, labels)
                taken += 1
    return taken


def correct_wrong(model: nn.Module, data: TensorDataset, device: torch.device) -> np.ndarray:
    """Exact histogram (correct, wrong) of the model's held-out predictions: never released
    as is. One record moves one bin by one (L1 sensitivity 1)."""
    model.eval()
    inputs, labels = data.tensors
    with torch.no_grad():
        correct = int((model(inputs.to(device)).argmax(dim=1).cpu() == labels).sum()) if len(labels) else 0
    model.train()
    return np.array([correct, len(labels) - correct])


def release_accuracy(model: nn.Module, heldout: TensorDataset, device: torch.device, epsilon: float) -> dict:
    """The held-out accuracy as an ε-DP release: the histogram (correct, wrong) plus discrete
    Laplace noise of scale 1/ε from OpenDP (Dwork & Roth 2014, Thm 3.6; sensitivity 1 for a
    fixed model, so it composes adaptively with the training, Thm 3.16). Returns the noisy
    accuracy c̃/(c̃ + w̃) clipped to [0, 1] and the noisy held-out size c̃ + w̃."""
    exact = correct_wrong(model, heldout, device)
    scale = within_charge("laplace", laplace_scale(1.0, epsilon), True, 2, 1.0, epsilon)
    correct, wrong = noisy(exact, "laplace", scale, integer=True)
    total = correct + wrong
    accuracy = float(np.clip(correct / total, 0.0, 1.0)) if total > 0 else 0.0
    return {"heldout_accuracy": accuracy, "heldout_records_noisy": int(total)}


def initial_model(job: DPSGDJob, data: Examples) -> nn.Module:
    """The model with its initial weights drawn from the job's ``seed`` (the only thing the
    seed fixes), without leaving torch's global generator seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.seed)
        return build_model(job.model, data.vocab_size, data.n_classes, job.embed_dim, job.hidden)


def run_dpsgd(ctx: JobContext, job: DPSGDJob, plan: DPSGDPlan) -> None:
    """Train the job's model within its grant with the charged ``plan`` (σ, steps), release
    its held-out accuracy with the plan's ε_acc; save ``model.pt`` and ``metrics.json`` under
    the work directory; report metrics and the budget actually spent."""
    sigma, delta, accuracy_epsilon = plan.noise_multiplier, plan.delta, plan.accuracy_epsilon
    accuracy_cost = demand_vector(EpsilonDelta(epsilon=accuracy_epsilon), ctx.accounting)
    releases_accuracy = bool(np.all(leq(accuracy_cost, ctx.budget)))
    if not releases_accuracy:  # a grant below the plan that cannot pay for it: no accuracy
        accuracy_cost = np.zeros_like(accuracy_cost)
    data, train, heldout = train_heldout(load_blocks(ctx), job)
    planned = min(plan.steps, job.max_steps or plan.steps)
    steps = affordable_steps(ctx.budget, ctx.accounting, job.sample_rate, sigma, delta, planned, accuracy_cost)
    model = initial_model(job, data)
    mode = job.grad_sample_mode or default_mode(model)
    device = torch.device(ctx.device)
    trainer = private_trainer(model, train, job, sigma, mode, device)
    taken = fit(trainer, steps)
    spent = spent_budget(trainer.history, ctx.accounting, delta) + accuracy_cost
    if not np.all(leq(spent, ctx.budget)):
        raise ValueError("the training and its accuracy release exceed the grant: nothing was released")
    metrics = {
        "model": job.model,
        # what build_model(**architecture) takes to rebuild the model that model.pt's state dict loads into
        "architecture": {
            "name": job.model,
            "vocab_size": int(data.vocab_size),
            "n_classes": int(data.n_classes),
            "embed_dim": job.embed_dim,
            "hidden": job.hidden,
        },
        "grad_sample_mode": mode,
        "device": device.type,  # where it trained (cuda or cpu)
        "sample_rate": job.sample_rate,
        "noise_multiplier": sigma,
        "planned_steps": plan.steps,
        "steps": taken,
        "stopped": "budget" if steps < planned else "max_steps" if planned < plan.steps else "plan",
        **(release_accuracy(model, heldout, device, accuracy_epsilon) if releases_accuracy else {}),
        "accuracy_epsilon": accuracy_epsilon if releases_accuracy else 0.0,
        "spent": spent.tolist(),
    }
    ctx.report_spent(spent)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    # on the CPU: the state dict loads anywhere, with torch.load(..., weights_only=True)
    torch.save({name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}, ctx.workdir / "model.pt")
    (ctx.workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    ctx.report_metrics(**metrics)

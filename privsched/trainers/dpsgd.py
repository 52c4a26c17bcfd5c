"""DP-SGD training on Opacus (Abadi et al. 2016; Yousefpour et al. 2021), within a grant.

A granted job trains a zoo model on a text column, or a model on a table's declared
features (:mod:`privsched.trainers.tabular`; ``logreg``, ``mlp`` or a layer list,
:mod:`privsched.trainers.networks`), on its granted blocks with Poisson sampling at rate q
(64-bit draws, an inclusion probability never above q: :class:`PoissonBatches`), per-sample
clipping to C and Gaussian noise of standard deviation σC per step, divided by a public
expected batch size (:func:`expected_batch_size`). Clipping
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

On a dataset whose unit is a person with K > 1 rows, the sampling, the clipping and the
held-out split are per person (:mod:`privsched.trainers.people`, user-level DP-SGD) and
the held-out accuracy is released at sensitivity K; the charge is the same plan, with q
the rate over people.

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

import copy
import json
import math
import secrets
import warnings
from fractions import Fraction
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
from privsched.trainers.layers import LayerModel
from privsched.trainers.models import INPUTS, build_model, ghost_clipping_applies
from privsched.trainers.networks import OneHotFeatures, SquaredError, check_private, layer_model, tabular_model
from privsched.trainers.plans import GRAD_SAMPLE_MODES, DPSGDJob, DPSGDPlan, check_person_level
from privsched.trainers.tabular import Declarations, TableSchema, as_numbers, codes, encode_rows, resolve_schema

if TYPE_CHECKING:
    from opacus.accountants import RDPAccountant

    from privsched.trainers.people import PersonBatches
    from privsched.trainers.distributed import GroupRanks, Ranks

#: Opacus warnings that say nothing about a correct run (backward hooks on modules whose
#: inputs need no gradient, the RDP conversion's order range).
_QUIET = (
    "Using a non-full backward hook",
    "Full backward hook is firing",
    "Optimal order is the largest alpha",
)


@dataclass
class Examples:
    """A job's records as model inputs and labels, and the sizes its model is built with
    (from the job and the blocks' declarations, never from the records)."""

    inputs: torch.Tensor
    labels: torch.Tensor  # class indices, or (n, 1) scaled targets for regression
    n_classes: int  # outputs of the head (1 for regression)
    vocab_size: int | None  # text jobs: the declared vocabulary
    rows: int  # the granted blocks' public row count, before any record was dropped
    schema: TableSchema | None = None  # tabular jobs: the declared table
    kept: np.ndarray | None = None  # which records became examples (a record whose label is no class is dropped)
    people: np.ndarray | None = None  # person-level DP-SGD: each example's person (0..P−1)

    def subset(self, index: np.ndarray) -> TensorDataset:
        idx = torch.as_tensor(index, dtype=torch.long)
        return TensorDataset(self.inputs[idx], self.labels[idx])


def declared_size(job: DPSGDJob, records: dict[str, np.ndarray], name: str) -> int:
    """A text job's vocabulary or number of categories: the job's, else the blocks' declared
    scalar (``vocab_size``, ``n_categories``), never a maximum of the records."""
    value = getattr(job, name)
    if value is None and name in records:
        value = int(records[name])
    if value is None:
        raise ValueError(f"declare {name} in the job: the blocks do not declare it")
    return int(value)


def text_examples(records: dict[str, np.ndarray], job: DPSGDJob) -> Examples:
    """Token ids (ids outside the declared vocabulary become padding, 0) as a bag of words
    or as ids; labels as class indices, a record whose label is not a class dropped."""
    vocab_size = declared_size(job, records, "vocab_size")
    if job.text not in records or records[job.text].ndim != 2:
        raise ValueError(f"the blocks have no token column {job.text!r}")
    tokens = records[job.text].astype(np.int64)
    tokens[(tokens < 0) | (tokens >= vocab_size)] = 0
    raw = records.get(job.label_column)
    if raw is None or raw.ndim != 1:
        raise ValueError(f"the blocks have no column {job.label_column!r}")
    if job.classes is not None:
        n_classes, labels = len(job.classes), codes(raw, list(job.classes))
    else:
        n_classes = declared_size(job, records, "n_categories") if job.label is None and job.target == "category" else 2
        numbers = as_numbers(raw)
        whole = np.isfinite(numbers) & (numbers == np.round(numbers))
        labels = np.where(whole, numbers, -1).astype(np.int64)
    keep = (labels >= 0) & (labels < n_classes)
    tokens, labels = tokens[keep], labels[keep]
    bow = isinstance(job.model, str) and INPUTS[job.model] == "bow"
    inputs = torch.from_numpy(bag_of_words(tokens, vocab_size)) if bow else torch.from_numpy(tokens)
    return Examples(inputs, torch.from_numpy(labels), n_classes, vocab_size, len(raw), kept=keep)


def examples(records: dict[str, np.ndarray], job: DPSGDJob, declared: Declarations | None = None) -> Examples:
    """The job's inputs and labels: a table's declared features (:mod:`privsched.trainers.tabular`)
    or a text column (:func:`text_examples`)."""
    if not job.tabular:
        return text_examples(records, job)
    schema = resolve_schema(job, declared)
    rows = len(records[schema.label]) if schema.label in records else 0
    inputs, labels, keep = encode_rows(records, schema)
    return Examples(torch.from_numpy(inputs), torch.from_numpy(labels), schema.n_outputs, None, rows, schema, keep)


def shape_only(job: DPSGDJob, declared: Declarations | None = None) -> Examples:
    """No records, only the sizes the job's model is built with, from the job and the
    dataset's ``declared`` columns (a text job's placeholder vocabulary when it declares
    none: the vocabulary sizes the embedding, not the shapes after it). Raises
    ``ValueError`` where a size is missing."""
    empty = torch.zeros(0)
    if job.tabular:
        schema = resolve_schema(job, declared)
        return Examples(empty, empty, schema.n_outputs, None, 0, schema)
    n_classes = len(job.classes) if job.classes is not None else job.n_categories or 2
    return Examples(empty, empty, n_classes, job.vocab_size or 2, 0)


def train_heldout(
    records: dict[str, np.ndarray], job: DPSGDJob, declared: Declarations | None = None
) -> tuple[Examples, TensorDataset, TensorDataset]:
    """The job's examples and their (train, held-out) split, drawn from OS entropy."""
    data = examples(records, job, declared)
    train_idx, held_idx = split(len(data.labels), job.holdout)
    return data, data.subset(train_idx), data.subset(held_idx)


def person_train_heldout(
    blocks: list[dict[str, np.ndarray]], job: DPSGDJob, declared: Declarations | None, user_column: str
) -> tuple[Examples, TensorDataset, TensorDataset, np.ndarray]:
    """As :func:`train_heldout` on the records of ``blocks`` (each block's apart), each person
    held out with all of their rows (:func:`privsched.trainers.people.person_split`); also
    the training rows' people (:func:`privsched.trainers.people.people_of`)."""
    from privsched.trainers.people import people_of, person_split

    records, units = people_of(blocks, user_column)
    data = examples(records, job, declared)
    data.people = people = units[data.kept]
    train_idx, held_idx = person_split(people, job.holdout)
    return data, data.subset(train_idx), data.subset(held_idx), people[train_idx]


def secure_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on ``device`` seeded with 64 bits from the OS (``secrets``), never
    from a user seed: the source of DP-SGD's noise (on the model's device, where Opacus
    draws it). Poisson sampling draws from :func:`os_entropy_rng`."""
    return torch.Generator(device=device).manual_seed(secrets.randbits(64))


#: Poisson sampling compares 64-bit integers: a record joins a batch when its draw is below
#: ⌊q·2⁶⁴⌋, with probability ⌊q·2⁶⁴⌋/2⁶⁴ ≤ q (:func:`inclusion_threshold`).
SAMPLER_BITS = 64
#: Smallest sample rate the sampler resolves to a relative 2⁻²⁴ (below it, ⌊q·2⁶⁴⌋ would
#: lose more than that): far below any useful q, and below the smallest q a plan accepts.
MIN_RESOLVED_RATE = 2.0**-40


def inclusion_threshold(sample_rate: float) -> int:
    """⌊q·2⁶⁴⌋, computed exactly (a float q is a binary fraction): a uniform 64-bit draw is
    below it with probability ⌊q·2⁶⁴⌋/2⁶⁴, which is at most q and above q − 2⁻⁶⁴, so that
    the charged rate q is never below the real one (the subsampled Gaussian's RDP grows with
    q: Mironov, Talwar & Zhang 2019). A q the sampler cannot resolve is refused."""
    if not MIN_RESOLVED_RATE <= sample_rate <= 1.0:
        raise ValueError(f"sample rate {sample_rate!r} is outside what Poisson sampling resolves ([2^-40, 1])")
    if sample_rate == 1.0:
        return 2**SAMPLER_BITS
    return int(Fraction(sample_rate) * 2**SAMPLER_BITS)


def os_entropy_rng() -> np.random.Generator:
    """A NumPy generator seeded with 128 bits from the OS (``secrets``)."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


class PoissonBatches:
    """Poisson-sampled batches (Abadi et al. 2016, the sampled Gaussian mechanism): at every
    step each record joins the batch independently, with probability ⌊q·2⁶⁴⌋/2⁶⁴ ≤ q
    (:func:`inclusion_threshold`): one uniform 64-bit integer per record, from a generator
    seeded from OS entropy. (A float32 uniform below q, as in ``torch.rand(n) < q``, includes
    with probability ⌈q·2²⁴⌉/2²⁴, 60 times q at q = 10⁻⁹.) An epoch is ``int(1/q)`` steps,
    Opacus' convention; a batch may be empty."""

    def __init__(self, data: TensorDataset, sample_rate: float, rng: np.random.Generator | None = None) -> None:
        self.tensors = data.tensors
        self.sample_rate = sample_rate
        self.threshold = inclusion_threshold(sample_rate)
        self.rng = rng if rng is not None else os_entropy_rng()

    def __len__(self) -> int:
        return int(1 / self.sample_rate)

    def draw(self, n: int) -> np.ndarray:
        """Indices of the records (of ``n``) that join one batch."""
        if self.threshold == 2**SAMPLER_BITS:
            return np.arange(n)
        return np.flatnonzero(self.rng.bit_generator.random_raw(n) < np.uint64(self.threshold))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        n = len(self.tensors[0])
        for _ in range(len(self)):
            index = torch.from_numpy(self.draw(n))
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


#: A regression prediction is a hit within this share of its label's declared range.
REGRESSION_HIT = 0.1


def hits(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Which predictions are right: the top class, or within :data:`REGRESSION_HIT` of a
    (scaled) regression target."""
    if labels.is_floating_point():
        return ((outputs - labels).abs() <= REGRESSION_HIT).all(dim=1)
    return outputs.argmax(dim=1) == labels


def evaluate(model: nn.Module, data: TensorDataset, device: torch.device) -> tuple[float, float]:
    """Mean loss and accuracy (:func:`hits`) of ``model`` on ``data``: exact, hence never
    released from sensitive data (non-private baselines on synthetic data only)."""
    model.eval()
    inputs, labels = data.tensors
    with torch.no_grad():
        outputs = model(inputs.to(device))
        loss = loss_of(data)(outputs, labels.to(device)).item()
        accuracy = hits(outputs.cpu(), labels).float().mean().item()
    model.train()
    return loss, accuracy


def make_optimizer(model: nn.Module, job: DPSGDJob) -> torch.optim.Optimizer:
    if job.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=job.lr)
    return torch.optim.SGD(model.parameters(), lr=job.lr)


#: The clipping modes run by Opacus' ``make_private``, with its ``grad_sample_mode`` name.
OPACUS_MODES = {"opacus-ghost": "ghost", "hooks": "hooks"}


def default_mode(model: nn.Module, per_person: bool = False) -> str:
    """Single-pass ghost clipping where every trainable layer is linear, Opacus' two-pass
    ghost clipping elsewhere (2× faster than hooks on ``cnn``, 10 % on ``lstm``:
    ``benchmarks/dpsgd.py``), Opacus' hooks there for person-level DP-SGD (whose per-row
    gradients are summed per person)."""
    if ghost_clipping_applies(model):
        return "ghost"
    return "hooks" if per_person else "opacus-ghost"


@dataclass
class Trainer:
    """A model ready to train: the (possibly Opacus-wrapped) module, optimizer, loss, batches;
    for private training the accountant its optimizer steps and, in the "ghost" mode, the
    single-pass clipping that fills the gradients."""

    model: nn.Module  # the plain model, whose state_dict is saved
    module: nn.Module
    optimizer: torch.optim.Optimizer
    criterion: nn.Module
    batches: PoissonBatches | PersonBatches | ShuffledBatches
    device: torch.device
    mode: str | None = None
    accountant: RDPAccountant | None = None
    clipping: GhostClipping | None = None

    def step(self, inputs: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor | None = None) -> None:
        """One optimiser step. An empty Poisson batch under ghost clipping is a noise-only
        step (the noisy sum of zero clipped gradients), which Opacus' hooks mode also takes.
        ``groups`` (person-level batches, :class:`privsched.trainers.people.PersonBatches`):
        each row's person, whose rows' gradients are summed and clipped as one."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.mode in ("ghost", "opacus-ghost") and len(labels) == 0:
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
        elif self.clipping is not None:
            self.clipping.accumulate(inputs.to(self.device), labels.to(self.device), groups)
        else:
            loss = self.criterion(self.module(inputs.to(self.device)), labels.to(self.device))
            loss.backward()
            if groups is not None:
                from privsched.trainers.people import sum_grad_samples

                sum_grad_samples(self.module, groups)
        self.optimizer.step()

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """(σ, q, steps) entries of the Opacus accountant (empty when not private)."""
        return list(self.accountant.history) if self.accountant is not None else []


def private_trainer(
    model: nn.Module,
    train: TensorDataset,
    job: DPSGDJob,
    sigma: float,
    mode: str,
    device: torch.device,
    batch_size: int | None = None,
    loss: nn.Module | None = None,
    people: np.ndarray | None = None,
) -> Trainer:
    """A DP-SGD trainer with explicit noise σ in clipping ``mode`` (see :data:`OPACUS_MODES`).

    Batches sample each record independently with probability q (:class:`PoissonBatches`)
    and an Opacus RDP accountant is stepped with that same q by the optimizer, so that its
    record is exactly ``(σ, q, steps taken)``. The optimizer adds noise N(0, σ²C²) to the
    clipped sum and divides by the expected batch size ``batch_size`` (a job passes its
    public one, :func:`expected_batch_size`; None: :func:`batch_size_of`). Raises
    ``ValueError`` for an unknown mode, or "ghost" on a model with a non-linear trainable layer.
    ``loss``: a torch loss with a ``reduction`` (default :func:`loss_of` the labels).
    ``people`` (each training row's person): person-level DP-SGD, Poisson sampling over
    people at q and each person's rows clipped together (:mod:`privsched.trainers.people`;
    ``batch_size`` is then the expected number of people), in "ghost" or "hooks" mode."""
    batch_size = batch_size_of(job, train, batch_size)
    if mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"unknown grad_sample_mode {mode!r} (expected one of {', '.join(GRAD_SAMPLE_MODES)})")
    if people is not None and mode == "opacus-ghost":
        raise ValueError("person-level DP-SGD clips per person in grad_sample_mode ghost or hooks, not opacus-ghost")
    if mode in OPACUS_MODES:
        return opacus_trainer(model, train, job, sigma, mode, device, batch_size, loss, people)
    model.to(device)
    criterion = loss if loss is not None else loss_of(train)
    summed = copy.copy(criterion)
    summed.reduction = "sum"  # type: ignore[assignment]  # torch types Module.__setattr__ for tensors and modules; any value is set
    clipping = GhostClipping(model, job.max_grad_norm, summed)
    optimizer, accountant, batches = private_parts(mode, model, train, job, sigma, device, batch_size, people)
    return Trainer(model, model, optimizer, criterion, batches, device, mode, accountant, clipping)


def private_parts(
    mode: str,
    model: nn.Module,
    train: TensorDataset,
    job: DPSGDJob,
    sigma: float,
    device: torch.device,
    batch_size: int,
    people: np.ndarray | None = None,
) -> tuple[Any, RDPAccountant, PoissonBatches | PersonBatches]:
    """What every clipping mode shares: the Opacus DP optimizer of ``mode``
    (:data:`privsched.trainers.optimizers.OPTIMIZERS`) built directly with
    ``secure_mode=True`` and noise from an OS-seeded generator on ``device``, the RDP
    accountant its steps feed, and Poisson batches drawn from OS entropy, over records or,
    given each row's person, over ``people``."""
    from opacus.accountants import RDPAccountant

    from privsched.trainers.optimizers import OPTIMIZERS

    optimizer = OPTIMIZERS[mode](
        optimizer=make_optimizer(model, job),
        noise_multiplier=sigma,
        max_grad_norm=job.max_grad_norm,
        expected_batch_size=batch_size,
        loss_reduction="mean",
        generator=secure_generator(device),
        secure_mode=True,
    )
    accountant = RDPAccountant()
    optimizer.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=job.sample_rate))
    if people is None:
        return optimizer, accountant, PoissonBatches(train, job.sample_rate)
    from privsched.trainers.people import PersonBatches

    return optimizer, accountant, PersonBatches(train, people, job.sample_rate)


def opacus_trainer(
    model: nn.Module,
    train: TensorDataset,
    job: DPSGDJob,
    sigma: float,
    mode: str,
    device: torch.device,
    batch_size: int,
    loss: nn.Module | None = None,
    people: np.ndarray | None = None,
) -> Trainer:
    """Wrap a model for an Opacus clipping mode ("opacus-ghost" or "hooks") and build the
    matching Opacus ``DPOptimizer`` directly, with ``secure_mode=True`` and a generator from
    OS entropy (Opacus' ``PrivacyEngine`` secure mode needs torchcsprng)."""
    from opacus.grad_sample.utils import prepare_module
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    model.to(device)
    grad_sample_mode = OPACUS_MODES[mode]
    extra = {"max_grad_norm": job.max_grad_norm} if grad_sample_mode == "ghost" else {}
    module = prepare_module(model, grad_sample_mode=grad_sample_mode, batch_first=True, loss_reduction="mean", **extra)
    optimizer, accountant, batches = private_parts(mode, model, train, job, sigma, device, batch_size, people)
    criterion: Any = loss if loss is not None else loss_of(train)
    if grad_sample_mode == "ghost":
        criterion = DPLossFastGradientClipping(module, optimizer, criterion, "mean")
    return Trainer(model, module, optimizer, criterion, batches, device, mode, accountant)


def expected_batch_size(job: DPSGDJob, rows: int, per_person: bool = False, holdout: float | None = None) -> int:
    """DP-SGD's divisor B, the expected batch size, from public sizes only: the job's
    ``expected_batch_size``, else q·(1 − holdout)·``rows`` rounded (at least 1), ``rows``
    the granted blocks' public row count (docs/privacy.md). Never the number of training
    records, which depends on the held-out split and on the records dropped. Person-level
    (``per_person``): the expected number of people a batch, the job's
    ``expected_batch_size``, else q·(1 − holdout)·(the job's declared ``people``), never the
    people counted in the data (:func:`privsched.trainers.plans.check_person_level`).
    ``holdout``: the share held out (default the job's)."""
    held = job.holdout if holdout is None else holdout
    if job.expected_batch_size is not None:
        return int(job.expected_batch_size)
    if per_person:
        if job.people is None:
            raise ValueError("person-level DP-SGD needs expected_batch_size or people: the number of people is not public")
        rows = job.people
    return max(1, round(job.sample_rate * (1 - held) * rows))


def batch_size_of(job: DPSGDJob, train: TensorDataset, batch_size: int | None) -> int:
    """``batch_size`` when given; else the job's, else q·len(train): for benchmarks and
    baselines on synthetic data (a job's trainer is always given its public one)."""
    if batch_size is not None:
        return batch_size
    return int(job.expected_batch_size or max(1, round(job.sample_rate * len(train))))


def loss_of(data: TensorDataset, reduction: str = "mean") -> nn.Module:
    """Cross-entropy for class labels, squared error for (n, 1) regression targets."""
    if data.tensors[1].is_floating_point():
        return SquaredError(reduction)
    return nn.CrossEntropyLoss(reduction=reduction)


def plain_trainer(model: nn.Module, train: TensorDataset, job: DPSGDJob, device: torch.device, batch_size: int | None = None) -> Trainer:
    """The same model, optimiser and expected batch size without privacy (shuffled batches)."""
    model.to(device)
    batches = ShuffledBatches(train, batch_size_of(job, train, batch_size), torch.Generator().manual_seed(job.seed))
    return Trainer(model, model, make_optimizer(model, job), loss_of(train), batches, device)


def fit(trainer: Trainer, steps: int) -> int:
    """Take ``steps`` steps, in epochs of ``len(trainer.batches)`` steps; returns the count."""
    taken = 0
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message)
        while taken < steps:
            for batch in trainer.batches:
                if taken == steps:
                    break
                trainer.step(*batch)
                taken += 1
    return taken


def correct_wrong(model: nn.Module, data: TensorDataset, device: torch.device) -> np.ndarray:
    """Exact histogram (correct, wrong) of the model's held-out predictions: never released
    as is. One record moves one bin by one (L1 sensitivity 1)."""
    model.eval()
    inputs, labels = data.tensors
    with torch.no_grad():
        correct = int(hits(model(inputs.to(device)).cpu(), labels).sum()) if len(labels) else 0
    model.train()
    return np.array([correct, len(labels) - correct])


def release_accuracy(model: nn.Module, heldout: TensorDataset, device: torch.device, epsilon: float, sensitivity: int = 1) -> dict:
    """The held-out accuracy as an ε-DP release: the histogram (correct, wrong) plus discrete
    Laplace noise of scale Δ/ε from OpenDP (Dwork & Roth 2014, Thm 3.6; sensitivity Δ = 1 for
    a fixed model, K for a person's at most K rows, so it composes adaptively with the
    training, Thm 3.16). Returns the noisy accuracy c̃/(c̃ + w̃) clipped to [0, 1] and the
    noisy held-out size c̃ + w̃."""
    exact = correct_wrong(model, heldout, device)
    scale = within_charge("laplace", laplace_scale(float(sensitivity), epsilon), True, 2, float(sensitivity), epsilon)
    correct, wrong = noisy(exact, "laplace", scale, integer=True)
    total = correct + wrong
    accuracy = float(np.clip(correct / total, 0.0, 1.0)) if total > 0 else 0.0
    return {"heldout_accuracy": accuracy, "heldout_records_noisy": int(total)}


def initial_model(job: DPSGDJob, data: Examples) -> nn.Module:
    """The job's model, sized from the job and the declarations in ``data`` only (its
    schema, vocabulary and classes), with its initial weights drawn from the job's ``seed``
    (the only thing the seed fixes), without leaving torch's global generator seeded; checked
    by Opacus' ``ModuleValidator``. Raises a one-line ``ValueError``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.seed)
        schema = data.schema
        if schema is not None:
            encoder = OneHotFeatures(len(schema.numeric), schema.category_sizes)
            if isinstance(job.model, LayerModel):
                trial = torch.zeros(2, len(schema.numeric) + len(schema.categorical))
                model = layer_model(job.model, encoder, trial, schema.n_outputs, None)
            else:
                model = tabular_model(job.model, len(schema.numeric), schema.category_sizes, job.hidden, schema.n_outputs)
        elif isinstance(job.model, LayerModel):
            model = layer_model(job.model, None, torch.zeros(2, 8, dtype=torch.long), data.n_classes, data.vocab_size)
        else:
            model = build_model(job.model, data.vocab_size or 0, data.n_classes, job.embed_dim, job.hidden)
    check_private(model)
    return model


def architecture(job: DPSGDJob, data: Examples) -> dict[str, Any] | None:
    """What :func:`~privsched.trainers.models.build_model` takes (``build_model(**it)``) to
    rebuild a zoo model that ``model.pt``'s state dict loads into; None for a tabular or a
    layer-list model, which the job's own parameters rebuild."""
    if data.schema is not None or isinstance(job.model, LayerModel):
        return None
    return {
        "name": job.model,
        "vocab_size": int(data.vocab_size or 0),
        "n_classes": int(data.n_classes),
        "embed_dim": job.embed_dim,
        "hidden": job.hidden,
    }


def declarations(ctx: JobContext) -> Declarations | None:
    """The dataset's declared column bounds and categories, where the context carries them
    (``ctx.schema``: ``{column: {"bounds": [lo, hi]} | {"categories": [...]}}``)."""
    return getattr(ctx, "schema", None)


def person_column(ctx: JobContext) -> str | None:
    """The column naming the person when DP-SGD samples and clips per person: on a dataset
    whose unit is a person with K > 1 rows of each in a read (with K = 1 a row is the unit, a
    person or a person in one period, and DP-SGD runs per row). Raises ``ValueError``, before
    any data is read, for a person-unit context that names no user column."""
    if ctx.unit == "record":
        return None
    if ctx.user_column is None:
        raise ValueError(f"the dataset's unit is {ctx.unit} but the job's context names no user column")
    return ctx.user_column if ctx.max_rows_per_user > 1 else None


def run_dpsgd(ctx: JobContext, job: DPSGDJob, plan: DPSGDPlan, ranks: Ranks | GroupRanks | None = None) -> None:
    """Train the job's model within its grant with the charged ``plan`` (σ, steps), release
    its held-out accuracy with the plan's ε_acc; save ``model.pt`` and ``metrics.json`` under
    the work directory; report metrics and the budget actually spent. On a dataset whose unit
    is a person with K > 1, per person (:mod:`privsched.trainers.people`): the held-out split,
    the sampling and the clipping by person, the accuracy at sensitivity K. With ``ranks``,
    train data-parallel on the job's processes (:mod:`privsched.trainers.distributed`)."""
    sigma, delta, accuracy_epsilon = plan.noise_multiplier, plan.delta, plan.accuracy_epsilon
    accuracy_cost = demand_vector(EpsilonDelta(epsilon=accuracy_epsilon), ctx.accounting)
    releases_accuracy = bool(np.all(leq(accuracy_cost, ctx.budget)))
    if not releases_accuracy:  # a grant below the plan that cannot pay for it: no accuracy
        accuracy_cost = np.zeros_like(accuracy_cost)
    if job.tabular:
        resolve_schema(job, declarations(ctx))  # a feature without declarations fails before any data is read
    user_column = person_column(ctx)
    if user_column is not None:
        check_person_level(job)  # before any data is read
        if ranks is not None:  # the ranks split rows, not people: a person would be clipped per rank
            raise ValueError("person-level DP-SGD trains in one process: ask for one worker")
    people: np.ndarray | None = None
    if user_column is None:
        data, train, heldout = train_heldout(load_blocks(ctx), job, declarations(ctx))
    else:
        blocks = [load_blocks(ctx, [key]) for key in ctx.block_keys]
        data, train, heldout, people = person_train_heldout(blocks, job, declarations(ctx), user_column)
    per_person = people is not None
    planned = min(plan.steps, job.max_steps or plan.steps)
    steps = affordable_steps(ctx.budget, ctx.accounting, job.sample_rate, sigma, delta, planned, accuracy_cost)
    model = initial_model(job, data)
    mode = job.grad_sample_mode or default_mode(model, per_person)
    device = torch.device(ctx.device)
    divisor = expected_batch_size(job, data.rows, per_person)
    if ranks is not None:
        trainer, taken = ranks.train(model, train, job, sigma, mode, device, divisor, steps)
    else:
        trainer = private_trainer(model, train, job, sigma, mode, device, divisor, people=people)
        taken = fit(trainer, steps)
    spent = spent_budget(trainer.history, ctx.accounting, delta) + accuracy_cost
    if not np.all(leq(spent, ctx.budget)):
        raise ValueError("the training and its accuracy release exceed the grant: nothing was released")
    rebuild = architecture(job, data)
    metrics = {
        "model": job.model_name,
        **({} if rebuild is None else {"architecture": rebuild}),
        "grad_sample_mode": mode,
        "device": device.type,  # where it trained (cuda or cpu)
        **({} if ranks is None else {"workers": ranks.world}),
        "sample_rate": job.sample_rate,
        "noise_multiplier": sigma,
        "planned_steps": plan.steps,
        "steps": taken,
        "stopped": "budget" if steps < planned else "max_steps" if planned < plan.steps else "plan",
        **({"sampled": "people", "max_rows_per_user": ctx.max_rows_per_user} if per_person else {}),
        **(
            release_accuracy(model, heldout, device, accuracy_epsilon, ctx.max_rows_per_user if per_person else 1)
            if releases_accuracy
            else {}
        ),
        "accuracy_epsilon": accuracy_epsilon if releases_accuracy else 0.0,
        "spent": spent.tolist(),
    }
    ctx.report_spent(spent)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    # on the CPU: the state dict loads anywhere, with torch.load(..., weights_only=True)
    torch.save({name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}, ctx.workdir / "model.pt")
    (ctx.workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    ctx.report_metrics(**metrics)

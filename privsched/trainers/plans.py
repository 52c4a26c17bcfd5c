"""Built-in job descriptions and their privacy plans (what a job will spend, before it runs).

Two kinds of built-in jobs (docs/design.md §5.2):
- ``dpsgd``: a DP-SGD model (Abadi et al. 2016) trained with Poisson sampling rate q for E
  epochs, i.e. ``ceil(E / q)`` noisy steps, with the noise multiplier calibrated so that the
  training reaches (ε − ε_acc, δ) under Opacus' RDP accountant, and ε_acc = 10 % of ε spent
  on releasing its held-out accuracy (pure DP, :data:`ACCURACY_SHARE`).
- ``statistic``: a count, sum, mean or histogram released with Laplace or Gaussian noise,
  contributions clipped to known bounds (:mod:`privsched.statistics.queries`).

Job parameters are validated here with one-line errors. Nothing here imports torch or Opacus
(the noise calibration is :mod:`privsched.budgets.sgm`), so planning a job at submit is cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import MAX_STEPS
from privsched.budgets.fields import SampleRate, bounded, within
from privsched.budgets.mechanisms import Composed, EpsilonDelta, Mechanism, SubsampledGaussian
from privsched.budgets.sgm import calibrate_noise_multiplier
from privsched.errors import validation_message
from privsched.statistics.queries import StatisticJob
from privsched.trainers.layers import LayerModel

#: The model zoo (built by :mod:`privsched.trainers.models`).
MODEL_NAMES: tuple[str, ...] = ("logreg", "mlp", "cnn", "text", "lstm")

#: Per-sample clipping of a DP-SGD job (:mod:`privsched.trainers.dpsgd`): single-pass ghost
#: clipping, Opacus' two-pass ghost clipping, Opacus' per-sample gradients from hooks.
GRAD_SAMPLE_MODES: tuple[str, ...] = ("ghost", "opacus-ghost", "hooks")

#: The zoo models whose trainable layers are all ``nn.Linear``: the ones single-pass ghost
#: clipping applies to (``privsched.trainers.models.ghost_clipping_applies``).
ALL_LINEAR_MODELS: tuple[str, ...] = ("logreg", "mlp", "text")

#: Most epochs of a DP-SGD job (its planned steps are bounded by ``MAX_STEPS`` too).
MAX_EPOCHS = 10_000.0
#: A seed fits in 63 bits (torch and NumPy take at most 64).
Seed = Annotated[int, within(0, 2**63 - 1, integer=True)]
#: Share of a DP-SGD job's ε spent on its noisy held-out accuracy (:func:`dpsgd_mechanism`).
ACCURACY_SHARE = 0.1


class _Job(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: A declared category or class: a string, an integer or a boolean (never a float, which
#: would compare unreliably with the data's values).
Category = Union[StrictBool, StrictInt, Annotated[str, Field(max_length=256)]]
#: Most features, categories of one feature, and label classes of a job.
MAX_FEATURES, MAX_CATEGORIES = 1024, 100_000
#: A layer's width.
Width = bounded(1, 65_536, integer=True)
#: Largest vocabulary of a text model.
MAX_VOCAB = 10_000_000


def _model_field(value: object) -> object:
    """A zoo model's name as is; a layer list validated here, so that its error is its own."""
    if isinstance(value, dict):
        try:
            return LayerModel.model_validate(value)
        except ValidationError as exc:
            raise ValueError(validation_message(exc)) from None
    if not isinstance(value, str) or value not in MODEL_NAMES:
        raise ValueError(f"must be one of {', '.join(MODEL_NAMES)} or {{layers: [...]}}, got {value!r}"[:200])
    return value


class DPSGDJob(_Job):
    """A DP-SGD training job: a zoo model on a text column, or a model on a table's
    declared ``features`` (numeric ones scaled with public ``bounds``, categorical ones
    one-hot from declared ``categories``) with a classification head (declared ``classes``,
    else binary 0/1) or a regression head (``task: regression``, the label's bounds
    declared). Every size of the model comes from here and the dataset's declarations."""

    kind: Literal["dpsgd"] = "dpsgd"
    model: Annotated[Union[Literal["logreg", "mlp", "cnn", "text", "lstm"], LayerModel], BeforeValidator(_model_field)]
    sample_rate: SampleRate
    epochs: bounded(1e-6, MAX_EPOCHS)  # type: ignore[valid-type]
    lr: bounded(1e-12, 1e6, low_open=True)  # type: ignore[valid-type]
    max_grad_norm: bounded(1e-12, 1e12, low_open=True) = 1.0  # type: ignore[valid-type]
    optimizer: Literal["sgd", "adam"] = "sgd"
    seed: Seed = 0
    target: Literal["sentiment", "category"] = "sentiment"
    holdout: float = Field(0.2, gt=0, lt=1)
    max_steps: bounded(1, MAX_STEPS, integer=True) | None = None  # type: ignore[valid-type]
    grad_sample_mode: Literal["ghost", "opacus-ghost", "hooks"] | None = None
    embed_dim: int = Field(32, ge=1, le=1024)
    hidden: Annotated[list[Width], BeforeValidator(lambda v: [v] if not isinstance(v, list) else v)] = Field(  # type: ignore[valid-type]
        default_factory=lambda: [64], min_length=1, max_length=16
    )
    #: Tabular inputs: the feature columns, the label column, public bounds (numeric
    #: features, a regression label) and declared categories (categorical features).
    features: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(None, min_length=1, max_length=MAX_FEATURES)
    label: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    bounds: dict[str, tuple[float, float]] = Field(default_factory=lambda: {})
    categories: dict[str, list[Category]] = Field(default_factory=lambda: {})
    classes: list[Category] | None = Field(None, max_length=MAX_CATEGORIES)
    task: Literal["classification", "regression"] = "classification"
    #: Text inputs: the token column and its vocabulary (else the blocks' declared one).
    text: Annotated[str, Field(min_length=1, max_length=256)] = "tokens"
    vocab_size: bounded(2, MAX_VOCAB, integer=True) | None = None  # type: ignore[valid-type]
    n_categories: bounded(2, MAX_CATEGORIES, integer=True) | None = None  # type: ignore[valid-type]
    #: DP-SGD's divisor B (public); else q·(1 − holdout)·(the blocks' public row count).
    #: Person-level DP-SGD: the expected people a batch, else q·(1 − holdout)·``people``.
    expected_batch_size: bounded(1, 10**9, integer=True) | None = None  # type: ignore[valid-type]
    #: Person-level DP-SGD: the number of people in the granted blocks, as declared (public).
    people: bounded(1, 10**12, integer=True) | None = None  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _no_patience(cls, data: object) -> object:
        if isinstance(data, dict) and "patience" in data:
            raise ValueError(
                "patience is not supported: early stopping on the un-noised held-out loss would release data outside the charge"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> DPSGDJob:
        if self.epochs / self.sample_rate > MAX_STEPS:
            raise ValueError(f"{self.epochs:g} epochs at sample rate {self.sample_rate:g} is more than {MAX_STEPS} noisy steps")
        if self.grad_sample_mode == "ghost" and not self.all_linear:
            raise ValueError(
                f"grad_sample_mode ghost needs a model whose layers are all linear ({', '.join(ALL_LINEAR_MODELS)}); "
                f"use opacus-ghost or hooks for {self.model_name}"
            )
        check_inputs(self)
        return self

    @property
    def steps(self) -> int:
        """Planned noisy steps: ``ceil(E / q)`` (Opacus' convention of 1/q steps per epoch)."""
        return max(1, math.ceil(self.epochs / self.sample_rate - 1e-9))

    @property
    def tabular(self) -> bool:
        """Whether the job trains on declared features (else on a text column)."""
        return self.features is not None

    @property
    def label_column(self) -> str:
        return self.label or self.target

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else "layers"

    @property
    def columns(self) -> list[str]:
        """The per-record columns the job reads."""
        return [*(self.features or []), self.label_column] if self.tabular else [self.text, self.label_column]

    @property
    def all_linear(self) -> bool:
        """Whether every trainable layer of the model is linear (single-pass ghost clipping)."""
        if isinstance(self.model, str):
            return self.model in ALL_LINEAR_MODELS
        return self.tabular and all(layer.type in LINEAR_LAYER_TYPES for layer in self.model.layers)


#: The layers of a declarative model that keep it all-linear (nothing else trainable).
LINEAR_LAYER_TYPES = frozenset({"linear", "relu", "tanh", "gelu", "sigmoid", "dropout", "flatten"})


def check_inputs(job: DPSGDJob) -> None:
    """What can be known of a DP-SGD job's inputs without its data. Raises ``ValueError``."""
    for column, (low, high) in job.bounds.items():
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"bounds of {column!r} must be finite with lo < hi, got [{low:g}, {high:g}]")
    for column, values in job.categories.items():
        if not values or len(set(map(repr, values))) != len(values):
            raise ValueError(f"categories of {column!r} must be a non-empty list without repeats")
    if job.classes is not None:
        if len(set(map(repr, job.classes))) != len(job.classes) or len(job.classes) < 2:
            raise ValueError("a label needs at least two distinct classes")
        if job.task == "regression":
            raise ValueError("a regression label has bounds, not classes")
    if not job.tabular:
        if job.label is None and job.task == "regression":
            raise ValueError("a regression job names its 'label' and its 'features'")
        if isinstance(job.model, LayerModel) and job.model.layers[0].type != "embedding":
            raise ValueError("a layer model on token ids starts with an embedding layer (or give 'features')")
        return
    if job.model in TEXT_MODELS:
        raise ValueError(f"model {job.model} reads token ids: train a table's features with logreg, mlp or a layer list")
    if job.label is None:
        raise ValueError("a job on 'features' names its 'label' column")
    features = job.features or []
    if len(set(features)) != len(features):
        raise ValueError("a feature is listed twice")
    if job.label in features:
        raise ValueError(f"the label {job.label!r} is also a feature")
    if isinstance(job.model, LayerModel) and job.model.layers[0].type == "embedding":
        raise ValueError("a layer model on features starts from their encoding, not an embedding layer")
    both = sorted(set(job.bounds) & set(job.categories))
    if both:
        raise ValueError(f"column {both[0]!r} has both bounds and categories")


def check_person_level(job: DPSGDJob) -> None:
    """What person-level DP-SGD (:mod:`privsched.trainers.people`, on a dataset whose unit is
    a person with K > 1 rows) needs of a job, known without its data: a public divisor (the
    number of people is not public, so it is never counted) and a clipping mode that clips
    per person. Raises a one-line ``ValueError``."""
    if job.expected_batch_size is None and job.people is None:
        raise ValueError(
            "DP-SGD on a dataset whose unit is a person samples people: declare expected_batch_size "
            "(people a batch) or people (in the granted blocks), the number of people is not public"
        )
    if job.grad_sample_mode == "opacus-ghost":
        raise ValueError("person-level DP-SGD clips per person in grad_sample_mode ghost or hooks, not opacus-ghost")


def undeclared(job: DPSGDJob, kinds: dict[str, str]) -> str | None:
    """What a block whose arrays have these NumPy kinds (``dtype.kind``, its declared scalars
    included) lacks for the job, read from headers only: declared categories for a text
    feature, a declared vocabulary (or number of categories) for a text model."""
    if job.tabular:
        for feature in job.features or []:
            if kinds.get(feature) in ("U", "S", "O") and feature not in job.categories:
                return f"feature {feature!r} holds text: declare its categories"
        return None
    if job.vocab_size is None and "vocab_size" not in kinds:
        return "the job needs vocab_size: the block does not declare it"
    if job.label is None and job.target == "category" and job.n_categories is None and job.classes is None and "n_categories" not in kinds:
        return "the job needs n_categories: the block does not declare it"
    return None


#: The zoo models that read token ids (the others read features or a bag of words).
TEXT_MODELS: tuple[str, ...] = ("cnn", "text", "lstm")


def parse_job(fields: dict) -> DPSGDJob | StatisticJob:
    """Validate a built-in job dict (its ``kind`` and parameters). Raises ``ValueError``
    with one line naming the bad parameter."""
    if not isinstance(fields, dict):
        raise ValueError(f"a built-in job must be a dict, got {type(fields).__name__}")
    kind = fields.get("kind")
    models: dict[str, type[DPSGDJob] | type[StatisticJob]] = {"dpsgd": DPSGDJob, "statistic": StatisticJob}
    if kind not in models:
        raise ValueError(f"unknown built-in job kind {kind!r} (expected one of {', '.join(models)})")
    try:
        return models[kind].model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        message = error["msg"].removeprefix("Value error, ")
        where = ".".join(str(p) for p in error["loc"])
        raise ValueError(f"bad {kind} job parameter {where}: {message}" if where else f"bad {kind} job: {message}") from None


def calibrate_noise(sample_rate: float, steps: int, epsilon: float, delta: float) -> float:
    """Noise multiplier σ such that ``steps`` subsampled-Gaussian steps at rate q reach at
    most (ε, δ) under the RDP accountant, found as Opacus' ``get_noise_multiplier`` finds it
    (bisection to a 1 % relative tolerance, always within ε), without importing Opacus:
    :func:`privsched.budgets.sgm.calibrate_noise_multiplier`."""
    return calibrate_noise_multiplier(sample_rate, steps, epsilon, delta, tolerance=0.01)


def accuracy_epsilon(epsilon: float) -> float:
    """The ε of a DP-SGD job's held-out accuracy release: :data:`ACCURACY_SHARE` of its ε."""
    return ACCURACY_SHARE * epsilon


def training_epsilon(epsilon: float) -> float:
    """The ε a DP-SGD job's training is calibrated to: what the accuracy release leaves."""
    return epsilon - accuracy_epsilon(epsilon)


def dpsgd_mechanism(job: DPSGDJob, noise_multiplier: float | None, epsilon: float, delta: float, accounting: Accounting) -> Mechanism:
    """What a DP-SGD plan charges: its training, the subsampled Gaussian (q, σ, steps) under
    RDP or the (ε − ε_acc, δ) it was calibrated to under basic composition, composed with the
    pure ε_acc-DP accuracy release (charged min(ε_acc, αε_acc²/2) under RDP).

    Under basic composition the charge holds no σ, so ``noise_multiplier`` may be ``None``."""
    accuracy = EpsilonDelta(epsilon=accuracy_epsilon(epsilon), delta=0.0)
    if accounting.is_rdp:
        if noise_multiplier is None:
            raise ValueError("a DP-SGD plan under RDP is charged its noise multiplier: none was given")
        training: Mechanism = SubsampledGaussian(sample_rate=job.sample_rate, noise_multiplier=noise_multiplier, steps=job.steps)
    else:
        training = EpsilonDelta(epsilon=training_epsilon(epsilon), delta=delta)
    return Composed(parts=[training, accuracy])


@dataclass(frozen=True)
class DPSGDPlan:
    """What a granted DP-SGD job runs with, read from the mechanism the ledger charged."""

    noise_multiplier: float  # σ of every noisy step
    steps: int  # planned noisy steps
    delta: float  # δ of the (ε, δ) the training was planned for (basic accounting's charge)
    accuracy_epsilon: float  # ε of the held-out accuracy release


def charged_plan(job: DPSGDJob, charged: Mechanism, delta: float) -> DPSGDPlan:
    """The DP-SGD plan in ``charged``, the mechanism :func:`dpsgd_mechanism` planned and the
    ledger charged: ``Composed([training, EpsilonDelta(ε_acc, 0)])``.

    Under RDP the training part is ``SubsampledGaussian(q, σ, steps)``, read as is (its q
    must be the job's sample rate). Under basic accounting it is the (ε − ε_acc, δ) the
    training was calibrated to, and σ is calibrated from it here, as at submit (the charge
    holds no σ). ``delta`` (the pipeline's δ) is what an RDP plan's spend is reported at.
    Raises ``ValueError`` for any other mechanism."""
    parts = charged.parts if isinstance(charged, Composed) else []
    accuracy = parts[1] if len(parts) == 2 else None
    if not isinstance(accuracy, EpsilonDelta) or accuracy.delta != 0:
        raise ValueError(
            f"a dpsgd job needs a charged mechanism that composes its training and a pure-DP accuracy release, got {charged.kind}"
        )
    training = parts[0]
    if isinstance(training, SubsampledGaussian):
        if training.sample_rate != job.sample_rate:
            raise ValueError(f"the charged sample rate {training.sample_rate:g} is not the job's {job.sample_rate:g}")
        return DPSGDPlan(training.noise_multiplier, training.steps, delta, accuracy.epsilon)
    if isinstance(training, EpsilonDelta):
        sigma = calibrate_noise(job.sample_rate, job.steps, training.epsilon, training.delta)
        return DPSGDPlan(sigma, job.steps, training.delta, accuracy.epsilon)
    raise ValueError(f"a dpsgd job cannot train under a charged {training.kind} mechanism")

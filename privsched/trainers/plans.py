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
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import MAX_STEPS
from privsched.budgets.fields import SampleRate, bounded
from privsched.budgets.mechanisms import Composed, EpsilonDelta, Mechanism, SubsampledGaussian
from privsched.budgets.sgm import calibrate_noise_multiplier
from privsched.statistics.queries import StatisticJob

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
Seed = bounded(0, 2**63 - 1, integer=True)
#: Share of a DP-SGD job's ε spent on its noisy held-out accuracy (:func:`dpsgd_mechanism`).
ACCURACY_SHARE = 0.1


class _Job(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DPSGDJob(_Job):
    """A DP-SGD training job on review blocks."""

    kind: Literal["dpsgd"] = "dpsgd"
    model: Literal["logreg", "mlp", "cnn", "text", "lstm"]
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
    hidden: int = Field(64, ge=1, le=4096)

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
        if self.grad_sample_mode == "ghost" and self.model not in ALL_LINEAR_MODELS:
            raise ValueError(
                f"grad_sample_mode ghost needs a model whose layers are all linear ({', '.join(ALL_LINEAR_MODELS)}); "
                f"use opacus-ghost or hooks for {self.model}"
            )
        return self

    @property
    def steps(self) -> int:
        """Planned noisy steps: ``ceil(E / q)`` (Opacus' convention of 1/q steps per epoch)."""
        return max(1, math.ceil(self.epochs / self.sample_rate - 1e-9))


def parse_job(fields: dict) -> DPSGDJob | StatisticJob:
    """Validate a built-in job dict (its ``kind`` and parameters). Raises ``ValueError``
    with one line naming the bad parameter."""
    if not isinstance(fields, dict):
        raise ValueError(f"a built-in job must be a dict, got {type(fields).__name__}")
    kind = fields.get("kind")
    models = {"dpsgd": DPSGDJob, "statistic": StatisticJob}
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

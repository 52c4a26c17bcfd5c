"""Built-in job descriptions and their privacy plans (what a job will spend, before it runs).

Two kinds of built-in jobs (docs/design.md §5.2):
- ``dpsgd``: a DP-SGD model (Abadi et al. 2016) trained with Poisson sampling rate q for E
  epochs, i.e. ``ceil(E / q)`` noisy steps, with the noise multiplier calibrated so that the
  training reaches (ε − ε_acc, δ) under Opacus' RDP accountant, and ε_acc = 10 % of ε spent
  on releasing its held-out accuracy (pure DP, :data:`ACCURACY_SHARE`).
- ``statistic``: a count, sum, mean or histogram released with the Laplace or Gaussian
  mechanism, contributions clipped to known bounds (Dwork & Roth 2014, §3.3 and App. A).

Job parameters are validated here with one-line errors. Nothing here imports torch or Opacus
(the noise calibration is :mod:`privsched.budgets.sgm`), so planning a job at submit is cheap.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import MAX_STEPS
from privsched.budgets.fields import SampleRate, bounded
from privsched.budgets.curves import gaussian_sigma
from privsched.budgets.mechanisms import (
    Composed,
    EpsilonDelta,
    Gaussian,
    Laplace,
    Mechanism,
    SubsampledGaussian,
    parse_mechanism,
)
from privsched.budgets.sgm import calibrate_noise_multiplier

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
#: A clipping bound of a statistic.
Bound = bounded(-1e15, 1e15)
#: Share of a DP-SGD job's ε spent on its noisy held-out accuracy (:func:`dpsgd_mechanism`).
ACCURACY_SHARE = 0.1

#: Noise of a DP statistic.
NOISE_KINDS: tuple[str, ...] = ("laplace", "gaussian")


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
                "patience is not supported: early stopping on the un-noised held-out loss would release data "
                "outside the charge"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> DPSGDJob:
        if self.epochs / self.sample_rate > MAX_STEPS:
            raise ValueError(f"{self.epochs:g} epochs at sample rate {self.sample_rate:g} is more than "
                             f"{MAX_STEPS} noisy steps")
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


class StatisticJob(_Job):
    """A DP statistic over the granted blocks' records: a count of records, or the sum,
    mean or histogram of one column with each value clipped to ``bounds``."""

    kind: Literal["statistic"] = "statistic"
    query: Literal["count", "sum", "mean", "histogram"]
    column: str | None = None
    bounds: tuple[Bound, Bound] | None = None
    bins: int | None = Field(None, ge=1, le=10_000)
    mechanism: Literal["laplace", "gaussian"] = "laplace"

    @model_validator(mode="before")
    @classmethod
    def _no_seed(cls, data: object) -> object:
        if isinstance(data, dict) and "seed" in data:
            raise ValueError("a statistic takes no seed: its noise comes from OS entropy and cannot be replayed")
        return data

    @model_validator(mode="after")
    def _check(self) -> StatisticJob:
        if self.query != "count" and self.column is None:
            raise ValueError(f"a {self.query} needs a column")
        if self.query != "count" and self.bounds is None:
            raise ValueError(f"a {self.query} needs bounds [lo, hi] to clip contributions")
        if self.query == "count" and self.bounds is not None:
            raise ValueError("a count counts every record and takes no bounds")
        if self.bounds is not None:
            lo, hi = self.bounds
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"bounds must be finite with lo < hi, got {list(self.bounds)}")
        if (self.query == "histogram") != (self.bins is not None):
            raise ValueError("bins is required for a histogram and only for a histogram")
        return self

    def parts(self) -> list[tuple[str, float]]:
        """The released quantities as (name, sensitivity) under add/remove-one neighbours.

        A clipped sum has sensitivity max(|lo|, |hi|); a count or a histogram 1 (one record
        moves one bin by one, in L1 and L2 alike). A mean releases a sum and a count, each
        with half of the budget (sequential composition).
        """
        if self.query == "count":
            return [("count", 1.0)]
        if self.query == "histogram":
            return [("histogram", 1.0)]
        lo, hi = self.bounds  # type: ignore[misc]
        total = ("sum", max(abs(lo), abs(hi)))
        return [total] if self.query == "sum" else [total, ("count", 1.0)]


def split_params(params: dict) -> tuple[dict, Mechanism | None]:
    """Separate a job's own fields from what the scheduler adds to its parameters.

    The scheduler adds ``epsilon``, ``delta`` and ``mechanism`` (the description it
    charged). A statistic's own ``mechanism`` field names its noise ("laplace" or
    "gaussian"); when the charged description replaced it, the noise is read back from it.
    Returns the job's fields and the charged mechanism (None when absent)."""
    if not isinstance(params, dict):
        raise ValueError(f"a built-in job must be a dict, got {type(params).__name__}")
    fields = {k: v for k, v in params.items() if k not in ("epsilon", "delta")}
    charged = fields.get("mechanism")
    if charged is None or charged in NOISE_KINDS:
        return fields, None
    try:
        mechanism = parse_mechanism(charged)
    except ValueError:
        raise ValueError(f"the charged mechanism {charged!r} is not a mechanism description") from None
    del fields["mechanism"]
    if fields.get("kind") == "statistic":
        parts = mechanism.parts if isinstance(mechanism, Composed) else [mechanism]
        first = parts[0]
        pure = isinstance(first, Laplace) or (isinstance(first, EpsilonDelta) and first.delta == 0)
        fields["mechanism"] = "laplace" if pure else "gaussian"
    return fields, mechanism


def parse_job(params: dict) -> DPSGDJob | StatisticJob:
    """Validate a built-in job dict (keys the scheduler adds are set aside, see
    :func:`split_params`). Raises ``ValueError`` with one line naming the bad parameter."""
    fields, _ = split_params(params)
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


def dpsgd_mechanism(
    job: DPSGDJob, noise_multiplier: float, epsilon: float, delta: float, accounting: Accounting
) -> Mechanism:
    """What a DP-SGD plan charges: its training, the subsampled Gaussian (q, σ, steps) under
    RDP or the (ε − ε_acc, δ) it was calibrated to under basic composition, composed with the
    pure ε_acc-DP accuracy release (charged min(ε_acc, αε_acc²/2) under RDP)."""
    accuracy = EpsilonDelta(epsilon=accuracy_epsilon(epsilon), delta=0.0)
    if accounting.is_rdp:
        training: Mechanism = SubsampledGaussian(
            sample_rate=job.sample_rate, noise_multiplier=noise_multiplier, steps=job.steps
        )
    else:
        training = EpsilonDelta(epsilon=training_epsilon(epsilon), delta=delta)
    return Composed(parts=[training, accuracy])


def statistic_mechanism(job: StatisticJob, epsilon: float, delta: float, accounting: Accounting) -> Mechanism:
    """What a DP statistic charges: each released part gets an equal share of (ε, δ).

    Laplace: a pure ε_k-DP release (scale b = Δ/ε_k, Dwork & Roth 2014 Thm 3.6), charged as
    ``EpsilonDelta(ε_k, 0)``: ε_k under basic, min(ε_k, αε_k²/2) under RDP, a curve valid for
    the discrete Laplace OpenDP samples (Bun & Steinke 2016, Prop. 3.3), whose RDP exceeds the
    continuous Laplace curve. Gaussian: under RDP σ = Δ·sqrt(2 ln(1.25/δ_k))/ε_k (Thm A.1)
    charged as its exact RDP curve; under basic, (ε_k, δ_k) with σ from the analytic Gaussian
    mechanism (Balle & Wang 2018), valid for every ε.
    """
    parts = job.parts()
    share_eps, share_delta = epsilon / len(parts), delta / len(parts)
    mechanisms: list[Mechanism] = []
    for _, sensitivity in parts:
        if job.mechanism == "laplace":
            mechanisms.append(EpsilonDelta(epsilon=share_eps, delta=0.0))
        elif share_delta <= 0:
            raise ValueError("the Gaussian mechanism needs delta > 0")
        elif accounting.is_rdp:
            sigma = sensitivity * gaussian_sigma(share_eps, share_delta)
            mechanisms.append(Gaussian(sigma=sigma, sensitivity=sensitivity))
        else:
            mechanisms.append(EpsilonDelta(epsilon=share_eps, delta=share_delta))
    return mechanisms[0] if len(mechanisms) == 1 else Composed(parts=mechanisms)

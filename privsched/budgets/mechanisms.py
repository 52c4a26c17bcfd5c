"""Privacy demands described as data, turned into budget vectors by one function.

A pipeline's demand is a small, serialisable description of its mechanism or training plan
(in the spirit of Google's dp_accounting ``DpEvent``); :func:`demand_vector` interprets it
under an :class:`~privsched.budgets.accounting.Accounting`. The ledger stores both the
description and the resulting vector.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import MAX_DEMAND, MAX_PARTS
from privsched.budgets.fields import Delta, Epsilon, Noise, SampleRate, Sensitivity, Steps, bounded
from privsched.budgets.curves import (
    gaussian_curve,
    laplace_curve,
    pure_dp_curve,
)
from privsched.budgets.sgm import subsampled_gaussian_curve

Demand = bounded(0.0, MAX_DEMAND)


class _Mechanism(BaseModel):
    # Each model builds its validator and serializer when first used, not at import: a
    # submission uses one or two of the six (benchmarks/README.md, issue 16).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class EpsilonDelta(_Mechanism):
    """A plain (ε, δ) demand, valid for any mechanism that is (ε, δ)-DP.

    Under basic accounting it is charged (ε, δ). Under RDP a pure ε-DP declaration (δ = 0)
    is charged min(ε, αε²/2), a curve that holds for every ε-DP mechanism (Bun & Steinke
    2016, Prop. 3.3); with δ > 0 no finite RDP curve holds in general (a mechanism may fail
    outright with probability δ), so the demand is refused unless it names its mechanism."""

    kind: Literal["epsilon_delta"] = "epsilon_delta"
    epsilon: Epsilon
    delta: Delta = 0.0


class Gaussian(_Mechanism):
    """Gaussian mechanism with noise σ (RDP only)."""

    kind: Literal["gaussian"] = "gaussian"
    sigma: Noise
    sensitivity: Sensitivity = 1.0


class Laplace(_Mechanism):
    """Laplace mechanism with scale b; ε = Δ/b under basic accounting."""

    kind: Literal["laplace"] = "laplace"
    scale: Noise
    sensitivity: Sensitivity = 1.0


class SubsampledGaussian(_Mechanism):
    """A DP-SGD plan: Poisson sampling rate q, noise multiplier, number of steps (RDP only)."""

    kind: Literal["subsampled_gaussian"] = "subsampled_gaussian"
    sample_rate: SampleRate
    noise_multiplier: Noise
    steps: Steps


class Composed(_Mechanism):
    """Sequential composition: demands add up."""

    kind: Literal["composed"] = "composed"
    parts: list[Mechanism] = Field(min_length=1, max_length=MAX_PARTS)


class Explicit(_Mechanism):
    """A demand vector given directly: (ε, δ) for basic, one ε(α) per order for RDP."""

    kind: Literal["explicit"] = "explicit"
    values: list[Demand] = Field(min_length=1, max_length=MAX_PARTS)  # type: ignore[valid-type]  # a pydantic Annotated alias


Mechanism = Annotated[
    Union[EpsilonDelta, Gaussian, Laplace, SubsampledGaussian, Composed, Explicit],
    Field(discriminator="kind"),
]

#: Mechanism descriptions that carry their own RDP curve (accepted under RDP with δ > 0).
NAMED_MECHANISMS: tuple[str, ...] = ("gaussian", "laplace", "subsampled_gaussian", "composed", "explicit")


@cache
def _mechanism_adapter() -> TypeAdapter:
    """The validator of any mechanism description, built on first use."""
    return TypeAdapter(Mechanism)


def parse_mechanism(data: dict | str) -> Mechanism:
    """Validate a mechanism description from a dict or its JSON text; a problem raises a
    ``ValueError`` of one line naming the first invalid field."""
    try:
        if isinstance(data, str):
            return _mechanism_adapter().validate_json(data)
        return _mechanism_adapter().validate_python(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        where = where if len(where) <= 80 else "..." + where[-77:]
        message = error["msg"].removeprefix("Value error, ")
        raise ValueError(f"invalid mechanism: {where}: {message}" if where else f"invalid mechanism: {message}") from None


def mechanism_json(mechanism: Mechanism) -> str:
    """The description as JSON text, as :func:`parse_mechanism` reads it back (the model's
    own serializer: the same text as the union's, without building the other five models)."""
    return mechanism.model_dump_json()


def demand_vector(mechanism: Mechanism, accounting: Accounting) -> np.ndarray:
    """The budget vector a mechanism spends on each block it reads (docs/design.md §3.4)."""
    if isinstance(mechanism, Composed):
        return np.sum([demand_vector(part, accounting) for part in mechanism.parts], axis=0)
    if isinstance(mechanism, Explicit):
        values = np.asarray(mechanism.values, dtype=float)
        if values.shape != (accounting.dims,):
            raise ValueError(f"explicit demand has {values.size} values, the dataset's budgets have {accounting.dims}")
        if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > MAX_DEMAND):
            raise ValueError(f"explicit demand values must be in [0, {MAX_DEMAND:g}]")
        return values
    if accounting.is_rdp:
        alphas = accounting.alphas
        if isinstance(mechanism, EpsilonDelta):
            if mechanism.delta > 0:
                raise ValueError(
                    "an (epsilon, delta > 0) demand has no RDP curve unless it names its mechanism: "
                    f"describe it as one of {', '.join(NAMED_MECHANISMS)}, or declare delta = 0 (pure DP)"
                )
            return pure_dp_curve(mechanism.epsilon, alphas)
        if isinstance(mechanism, Gaussian):
            return gaussian_curve(mechanism.sigma, alphas, mechanism.sensitivity)
        if isinstance(mechanism, Laplace):
            return laplace_curve(mechanism.scale, alphas, mechanism.sensitivity)
        if isinstance(mechanism, SubsampledGaussian):
            return subsampled_gaussian_curve(mechanism.sample_rate, mechanism.noise_multiplier, mechanism.steps, alphas)
    else:
        if isinstance(mechanism, EpsilonDelta):
            return np.array([mechanism.epsilon, mechanism.delta])
        if isinstance(mechanism, Laplace):
            return np.array([mechanism.sensitivity / mechanism.scale, 0.0])
        raise ValueError(
            f"a {mechanism.kind} mechanism has no pure (epsilon, delta) cost under basic accounting: "
            "use rdp accounting or give epsilon and delta"
        )
    raise TypeError(f"unknown mechanism {mechanism!r}")

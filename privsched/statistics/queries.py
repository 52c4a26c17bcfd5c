"""A DP statistic's description and the privacy mechanism it is charged.

A count, sum, mean or histogram over block records, each record's contribution clipped to
known bounds, released with Laplace or Gaussian noise (its ``noise``; Dwork & Roth 2014,
§3.3 and App. A). The built-in ``statistic`` job and the privacy primitives of a user job
(:mod:`privsched.jobs.primitives`) describe and charge a statistic alike. Nothing here
imports OpenDP, so planning a statistic at submit is cheap.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import person_sensitivity
from privsched.budgets.fields import within
from privsched.budgets.curves import gaussian_sigma
from privsched.budgets.mechanisms import Composed, EpsilonDelta, Gaussian, Mechanism

#: A clipping bound of a statistic.
Bound = Annotated[float, within(-1e15, 1e15)]


class StatisticJob(BaseModel):
    """A DP statistic over the granted blocks' records: a count of records, or the sum,
    mean or histogram of one column with each value clipped to ``bounds``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["statistic"] = "statistic"
    query: Literal["count", "sum", "mean", "histogram"]
    column: str | None = None
    bounds: tuple[Bound, Bound] | None = None
    bins: int | None = Field(None, ge=1, le=10_000)
    noise: Literal["laplace", "gaussian"] = "laplace"

    @model_validator(mode="before")
    @classmethod
    def _no_seed_nor_mechanism(cls, data: object) -> object:
        if isinstance(data, dict) and "seed" in data:
            raise ValueError("a statistic takes no seed: its noise comes from OS entropy and cannot be replayed")
        if isinstance(data, dict) and "mechanism" in data:
            raise ValueError("a statistic names its noise in 'noise' (laplace or gaussian); 'mechanism' is the charged privacy mechanism")
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

    def parts(self, max_rows_per_user: int = 1) -> list[tuple[str, float]]:
        """The released quantities as (name, sensitivity) under add/remove-one-person
        neighbours, a person having at most K = ``max_rows_per_user`` rows in the read (K = 1:
        one record, event level).

        Per record, a clipped sum has sensitivity max(|lo|, |hi|) and a count or a histogram 1
        (one record moves one bin by one, in L1 and L2 alike); a person's K rows multiply each
        by K (:func:`~privsched.budgets.bounds.person_sensitivity`: a count K, a sum K·bound, a
        histogram K over the bins the rows touch). A mean releases a sum and a count, each
        with half of the budget (sequential composition).
        """
        if self.query == "count":
            record = [("count", 1.0)]
        elif self.query == "histogram":
            record = [("histogram", 1.0)]
        else:
            lo, hi = self.bounds  # type: ignore[misc]
            total = ("sum", max(abs(lo), abs(hi)))
            record = [total] if self.query == "sum" else [total, ("count", 1.0)]
        return [(name, person_sensitivity(sensitivity, max_rows_per_user)) for name, sensitivity in record]


def statistic_mechanism(job: StatisticJob, epsilon: float, delta: float, accounting: Accounting, max_rows_per_user: int = 1) -> Mechanism:
    """What a DP statistic charges: each released part gets an equal share of (ε, δ), at the
    sensitivities of :meth:`StatisticJob.parts` for a person with at most
    ``max_rows_per_user`` rows (the dataset's contribution bound K; 1 at event level): the
    same (ε, δ) and RDP curve, with K times the noise.

    Laplace: a pure ε_k-DP release (scale b = Δ/ε_k, Dwork & Roth 2014 Thm 3.6), charged as
    ``EpsilonDelta(ε_k, 0)``: ε_k under basic, min(ε_k, αε_k²/2) under RDP, a curve valid for
    the discrete Laplace OpenDP samples (Bun & Steinke 2016, Prop. 3.3), whose RDP exceeds the
    continuous Laplace curve. Gaussian: under RDP σ = Δ·sqrt(2 ln(1.25/δ_k))/ε_k (Thm A.1)
    charged as its exact RDP curve, which bounds the discrete Gaussian of counts too
    (Canonne, Kamath & Steinke 2020, §2.1); under basic, (ε_k, δ_k), with σ calibrated at
    release on the exact (ε, δ) of the noise drawn (:func:`privsched.statistics.release.noise_of`).
    """
    parts = job.parts(max_rows_per_user)
    share_eps, share_delta = epsilon / len(parts), delta / len(parts)
    mechanisms: list[Mechanism] = []
    for _, sensitivity in parts:
        if job.noise == "laplace":
            mechanisms.append(EpsilonDelta(epsilon=share_eps, delta=0.0))
        elif share_delta <= 0:
            raise ValueError("the Gaussian mechanism needs delta > 0")
        elif accounting.is_rdp:
            sigma = sensitivity * gaussian_sigma(share_eps, share_delta)
            mechanisms.append(Gaussian(sigma=sigma, sensitivity=sensitivity))
        else:
            mechanisms.append(EpsilonDelta(epsilon=share_eps, delta=share_delta))
    return mechanisms[0] if len(mechanisms) == 1 else Composed(parts=mechanisms)

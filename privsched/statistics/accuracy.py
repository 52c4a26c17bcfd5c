"""Proven accuracy of noisy counts and histograms, and the ε an accuracy needs.

A count or a histogram is released with integer noise (:mod:`privsched.statistics.noise`):
the discrete Laplace of scale b, P(X = k) ∝ e^{−|k|/b}, or the discrete Gaussian of
parameter σ. An answer is *within (α, β)* when every answered bin is within ±α of its
true value with probability at least 1 − β. Every bound here is a tail bound of the noise,
which depends only on the noise scales and the coefficients that combine releases, never on
the data; a histogram of m bins is bounded by the union bound, m times a bin's tail.

- One discrete Laplace (p = e^{−1/b}): P(|X| ≥ k) = 2p^k / (1 + p) for k ≥ 1, exactly
  (Inusah & Kozubowski 2006, the two-sided geometric law; Canonne, Kamath & Steinke 2020,
  Def. 2 for its use in DP). An integer X is within ±α iff |X| ≤ ⌊α⌋.
- A weighted sum E = Σ c_j X_j of independent noises (bins summed into a coarser bin or a
  count, releases combined): the Chernoff bound P(|E| > α) ≤ 2 e^{−tα} Π_j E[e^{t c_j X_j}]
  for every t > 0 (the noise is symmetric), with the discrete Laplace's moment generating
  function (1 − p)² / ((1 − p e^s)(1 − p e^{−s})) for |s| < 1/b, and the discrete
  Gaussian's bound e^{s²σ²/2} (CKS 2020, Cor. 9). Any t gives a valid bound; the best of a
  fixed grid is taken.
- A sum of n discrete Laplace of one scale (bins of one release summed, or releases of
  equal scale averaged): its exact law, the n-fold convolution, when it proves more.

A bound taken at a scale above the one drawn (:data:`SCALE_SLACK`) is above the true one:
a discrete Laplace of scale b' > b is one of scale b plus independent symmetric integer
noise (the ratio of their characteristic functions is that of a law with masses ∝
(1 + p²) − 2pp' at 0 and p'^{k−1}(p' − p)(1 − pp') at ±k), and adding such noise to a
symmetric unimodal integer sum (a sum of log-concave laws is log-concave) never brings
more mass within ±t (Anderson's inequality, in its discrete form); the Chernoff bounds grow
with the scale directly, as the moment generating functions do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privsched.statistics.noise import laplace_scale

#: A scale actually drawn exceeds the one computed from ε by at most a few ulps
#: (:func:`~privsched.statistics.noise.within_charge` adds at most 16); bounds are taken at
#: the scale times this factor, which only ever makes them larger.
SCALE_SLACK = 1.0 + 2.0**-40
#: Bounds computed in floating point are raised by this relative margin (rounding errors of
#: a few ulps could otherwise bring one under its exact value).
_ROUNDING = 1.0 + 1e-12
_GRID = np.linspace(1e-3, 1.0 - 1e-3, 999)


@dataclass(frozen=True)
class Term:
    """One noise draw in an answer's error: ``coefficient`` times a centred discrete
    Laplace (``kind`` "laplace", scale b) or discrete Gaussian ("gaussian", parameter σ)."""

    kind: str
    scale: float
    coefficient: float = 1.0
    count: int = 1  # independent draws of this same law


def laplace_tail(scale: float, alpha: float) -> float:
    """P(|X| > α) for X discrete Laplace of scale b: 2p^k / (1 + p), k = ⌊α⌋ + 1, p = e^{−1/b}."""
    p = math.exp(-1.0 / scale)
    return min(1.0, _ROUNDING * 2.0 * p ** (math.floor(alpha) + 1) / (1.0 + p))


def _log_mgf(term: Term, t: np.ndarray) -> np.ndarray:
    """log E[e^{t c X}] of ``count`` draws, at each t (t |c| b < 1 for a discrete Laplace)."""
    s = abs(term.coefficient) * t
    if term.kind == "gaussian":
        return term.count * s * s * term.scale**2 / 2.0
    p = math.exp(-1.0 / term.scale)
    return term.count * (2.0 * math.log1p(-p) - np.log1p(-p * np.exp(s)) - np.log1p(-p * np.exp(-s)))


def laplace_sum_tail(scale: float, count: int, threshold: float) -> float:
    """An upper bound on P(|X_1 + … + X_n| > t) for n = ``count`` independent discrete
    Laplace of scale b: the n-fold convolution of the law truncated to [−R, R] (computed by
    FFT), summed beyond ⌊t⌋, plus the n·2p^{R+1}/(1 + p) of mass truncation can move (union
    bound) and an absolute margin of 1e-12 for the FFT's rounding."""
    p = math.exp(-1.0 / scale)
    reach = int(math.ceil(40.0 * scale)) + 1
    single = (1 - p) / (1 + p) * p ** np.abs(np.arange(-reach, reach + 1, dtype=float))
    size = 1 << int(math.ceil(math.log2(count * 2 * reach + 1)))
    law = np.clip(np.fft.irfft(np.fft.rfft(single, size) ** count, size)[: count * 2 * reach + 1], 0.0, None)
    support = np.arange(law.size) - count * reach
    beyond = float(law[np.abs(support) > math.floor(threshold)].sum())
    return min(1.0, _ROUNDING * (beyond + count * 2.0 * p ** (reach + 1) / (1.0 + p)) + 1e-12)


def failure_bound(terms: list[Term], alpha: float) -> float:
    """An upper bound on P(|Σ c_j X_j| > α) (module docstring): the smaller of the best
    Chernoff bound over a fixed grid of t and, when every draw is a discrete Laplace of one
    scale with one |c|, the tail of their integer sum beyond α/|c| (exact for one draw,
    :func:`laplace_sum_tail` for more)."""
    bounds = []
    if len({(t.kind, t.scale, abs(t.coefficient)) for t in terms}) == 1 and terms[0].kind == "laplace":
        count, coefficient = sum(t.count for t in terms), abs(terms[0].coefficient)
        # α/|c| is exact for |c| = 1; else rounded down, so that more mass is counted
        threshold = alpha if coefficient == 1.0 else alpha / coefficient * (1.0 - 1e-12)
        if count == 1:
            return laplace_tail(terms[0].scale, threshold)
        bounds.append(laplace_sum_tail(terms[0].scale, count, threshold))
    laplace = [abs(t.coefficient) * t.scale for t in terms if t.kind == "laplace"]
    if laplace:
        grid = _GRID / max(laplace)
    else:  # sub-Gaussian: the optimal t = α / Σ c²σ², and a grid around it
        grid = _GRID * 2.0 * alpha / sum(t.count * t.coefficient**2 * t.scale**2 for t in terms)
    best = float(np.min(-grid * alpha + sum(_log_mgf(term, grid) for term in terms)))
    return min([1.0, _ROUNDING * 2.0 * math.exp(best), *bounds])


def laplace_epsilon(alpha: float, beta: float, bins: int, sensitivity: float = 1.0) -> float:
    """The ε at which a histogram of ``bins`` bins (1: a count) with discrete Laplace noise
    of scale b = Δ/ε (rounded up, :func:`~privsched.statistics.noise.laplace_scale`) is
    within (α, β): every bin within ±α with probability ≥ 1 − β.

    By the union bound it suffices that each bin fails with probability ≤ β/m, and since
    2p^k/(1 + p) ≤ 2e^{−k/b}, that b ≤ k / ln(2m/β) with k = ⌊α⌋ + 1, so
    ε = Δ · ln(2m/β) / (⌊α⌋ + 1) (the discrete form of Dwork & Roth 2014, Thm 3.8). The
    result is then checked with the exact tail at the scale drawn (with :data:`SCALE_SLACK`)
    and raised by ulps if rounding left it short. Monotone: more accuracy (smaller α or β)
    or more bins never costs less."""
    if not (alpha > 0 and 0 < beta < 1 and bins >= 1 and sensitivity > 0):
        raise ValueError(f"need alpha > 0, 0 < beta < 1 and at least one bin, got ({alpha!r}, {beta!r}, {bins!r})")
    epsilon = sensitivity * math.log(2.0 * bins / beta) / (math.floor(alpha) + 1)
    while bins * laplace_tail(laplace_scale(sensitivity, epsilon) * SCALE_SLACK, alpha) > beta:
        epsilon = math.nextafter(epsilon, math.inf)
    return epsilon


@dataclass(frozen=True)
class Source:
    """One release's estimate of an answer of ``outputs`` bins: ``sums[i]`` is the sum of
    ``width`` released entries, each with its own noise of ``kind`` and ``scale``."""

    sums: np.ndarray
    width: int
    kind: str
    scale: float

    def variance(self) -> float:
        """The variance of one output's noise: ``width`` times the discrete Laplace's
        2p/(1 − p)², or at most ``width`` σ² for the discrete Gaussian."""
        if self.kind == "gaussian":
            return self.width * self.scale**2
        p = math.exp(-1.0 / self.scale)
        return self.width * 2.0 * p / (1.0 - p) ** 2


@dataclass(frozen=True)
class Estimate:
    """An answer from releases: its values, the sources used, and the proven probability
    that some bin is off by more than α."""

    values: np.ndarray
    used: list[int]
    failure: float


def _estimate(sources: list[Source], weights: list[float], alpha: float, used: list[int]) -> Estimate:
    terms = [Term(s.kind, s.scale, w, s.width) for s, w in zip(sources, weights)]
    values = sum(w * s.sums for s, w in zip(sources, weights))
    outputs = len(sources[0].sums)
    return Estimate(np.asarray(values, dtype=float), used, min(1.0, outputs * failure_bound(terms, alpha)))


def best_estimate(sources: list[Source], alpha: float) -> Estimate | None:
    """The estimate with the smallest proven failure probability among each source alone
    and the inverse-variance weighted mean of all (weights w_i ∝ 1/Var_i, fixed by the
    noise scales alone, so the combination is post-processing and its error is the
    weighted sum of independent noises that :func:`failure_bound` bounds). None without
    sources."""
    if not sources:
        return None
    options = [_estimate([s], [1.0], alpha, [i]) for i, s in enumerate(sources)]
    if len(sources) > 1:
        inverse = [1.0 / s.variance() for s in sources]
        total = sum(inverse)
        options.append(_estimate(sources, [v / total for v in inverse], alpha, list(range(len(sources)))))
    return min(options, key=lambda e: e.failure)

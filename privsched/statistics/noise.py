"""Floating-point-safe noise for released numbers, drawn from OS entropy by OpenDP.

Adding a float Laplace or Gaussian sample to an exact value leaks it through the set of
reachable outputs (Mironov, CCS 2012). OpenDP's samplers draw exact noise on a lattice from
the operating system's entropy (no user seed) and round once (Canonne, Kamath & Steinke
2020 for the discrete Gaussian and Laplace): integer inputs (counts, histograms) get
discrete Laplace / discrete Gaussian noise and stay integers; float inputs (sums) get
OpenDP's lattice-based float Laplace / Gaussian.

:func:`laplace_scale` rounds a noise scale *up* so that, in exact rational arithmetic, its
privacy loss Δ/b never exceeds the ε it was charged for: rounding errs only towards more noise.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np


def laplace_scale(sensitivity: float, epsilon: float) -> float:
    """Smallest float b ≥ Δ/ε in exact arithmetic: the Laplace scale of an ε-DP release
    of a quantity with L1 sensitivity Δ (Dwork & Roth 2014, Thm 3.6)."""
    if not epsilon > 0 or not sensitivity > 0:
        raise ValueError(f"need positive sensitivity and epsilon, got ({sensitivity!r}, {epsilon!r})")
    scale = sensitivity / epsilon
    while Fraction(sensitivity) / Fraction(scale) > Fraction(epsilon):
        scale = math.nextafter(scale, math.inf)
    return scale


@functools.lru_cache(maxsize=64)
def _measurement(kind: str, scale: float, integer: bool, size: int):
    # OpenDP's own modules only: ``opendp.prelude`` also imports its extras, which import
    # whatever optional packages are installed (some start threads, which a fork server
    # must not have).
    from opendp.domains import atom_domain, vector_domain
    from opendp.measurements import make_gaussian, make_laplace
    from opendp.metrics import l1_distance, l2_distance
    from opendp.mod import enable_features

    enable_features("contrib")
    atom = atom_domain(T=int) if integer else atom_domain(T=float, nan=False)
    domain = vector_domain(atom, size=size)
    if kind == "laplace":
        return make_laplace(domain, l1_distance(T=int if integer else float), scale=scale)
    if kind == "gaussian":
        return make_gaussian(domain, l2_distance(T=int if integer else float), scale=scale)
    raise ValueError(f"unknown noise {kind!r} (expected laplace or gaussian)")


def privacy_loss(kind: str, scale: float, integer: bool, size: int, sensitivity: float) -> float:
    """OpenDP's own privacy map of the noise at input distance Δ: ε (Laplace, max
    divergence) or ρ (Gaussian, zero-concentrated divergence). For integer data Δ is
    rounded up to an integer."""
    distance = math.ceil(sensitivity) if integer else float(sensitivity)
    return float(_measurement(kind, float(scale), integer, size).map(distance))


def within_charge(kind: str, scale: float, integer: bool, size: int, sensitivity: float, charged: float) -> float:
    """The smallest float scale ≥ ``scale`` whose OpenDP privacy map at Δ is at most
    ``charged`` (OpenDP rounds its map upward, so the exact scale may sit an ulp over);
    raises ``ValueError`` when a few ulps more noise do not bring it within the charge."""
    for _ in range(16):
        if privacy_loss(kind, scale, integer, size, sensitivity) <= charged:
            return scale
        scale = math.nextafter(scale, math.inf)
    raise ValueError(f"{kind} noise of scale {scale:g} loses more privacy than it was charged")


def noisy(exact: np.ndarray, kind: str, scale: float, integer: bool) -> np.ndarray:
    """``exact`` plus Laplace (scale b) or Gaussian (standard deviation σ) noise from OpenDP.

    ``integer``: the values are counts, released as integers with discrete noise. Float
    values must be finite (clip and replace NaN before calling)."""
    values = np.asarray(exact)
    data: list[int] | list[float]
    if integer:
        data = [int(v) for v in values.reshape(-1)]
    else:
        if not np.all(np.isfinite(values)):
            raise ValueError("a released value must be finite")
        data = [float(v) for v in values.reshape(-1)]
    release = _measurement(kind, float(scale), integer, len(data))(data)
    return np.asarray(release, dtype=float).reshape(values.shape)

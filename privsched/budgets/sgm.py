"""Rényi DP of the Poisson-subsampled Gaussian mechanism (DP-SGD) and its noise calibration.

NumPy and the standard library only (the binomial coefficients below, ln Φ from
:mod:`privsched.budgets.normal`), so that planning a DP-SGD job loads neither torch, Opacus
nor SciPy. The numbers are those of Opacus' RDP accountant (``compute_rdp``,
``get_noise_multiplier``), term by term in the same floating-point operations; the tests
compare the two.

Mironov, Talwar & Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian
Mechanism", §3.3: one step with sampling rate q and noise multiplier σ has RDP
ε(α) = ln(A_α)/(α − 1), where

- integer α: A_α = Σ_{k=0}^{α} C(α, k) q^k (1 − q)^{α−k} exp((k² − k)/(2σ²));
- fractional α: A_α = A₀ + A₁ with z₀ = σ² ln(1/q − 1) + 1/2 and, for k ≥ 0,
  A₀ = Σ_k C(α, k) q^k (1 − q)^{α−k} exp((k² − k)/(2σ²)) · ½ erfc((k − z₀)/(√2 σ)),
  A₁ = Σ_k C(α, k) q^{α−k} (1 − q)^k exp(((α−k)² − (α−k))/(2σ²)) · ½ erfc((z₀ − (α−k))/(√2 σ)),
  with the generalised binomial coefficient C(α, k), summed until both terms fall below
  e^{−30} (the series converge; Opacus stops at the same term);
- q = 1 is the Gaussian mechanism, ε(α) = α/(2σ²) (Mironov 2017, Prop. 7).

Above ``LARGE_ORDER`` (α > 1000, where C(α, k) overflows a double and Opacus' terms are NaN)
an integer order's binomial sum is taken with ln C(α, k) = ln Γ(α + 1) − ln Γ(k + 1) −
ln Γ(α − k + 1) (``math.lgamma``) and NumPy's log-sum-exp, and ln A_α is rounded up by 10⁻¹⁴
of the magnitude of its terms' parts (far above their rounding); a fractional order is
charged at ⌈α⌉, which bounds it (Rényi divergence does not decrease with the order: van
Erven & Harremoës 2014, Thm 3), since its series there runs over about α terms.

T steps compose to T·ε(α) (Mironov 2017, Prop. 1).
"""

from __future__ import annotations

import bisect
import functools
import math

import numpy as np

from privsched.budgets.curves import rdp_to_epsilon
from privsched.budgets.normal import log_ndtr

#: The orders Opacus' RDP accountant converts over (``RDPAccountant.DEFAULT_ALPHAS``); a
#: noise level calibrated over them is the one Opacus' ``get_noise_multiplier`` returns.
CALIBRATION_ALPHAS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)])

#: Largest noise multiplier the calibration tries before declaring the budget too small.
MAX_NOISE_MULTIPLIER = 1e6

#: Orders above this take the large-order path of the module docstring.
LARGE_ORDER = 1000.0

#: A series term of the fractional-order sum below e^{-30} ends it (MTZ 2019 §3.3).
_SERIES_CUTOFF = -30.0
#: A fractional-order series still running after this many terms is refused (its terms
#: left the range of doubles), never summed forever.
_MAX_TERMS = 2**22


def subsampled_gaussian_curve(sample_rate: float, noise_multiplier: float, steps: int, alphas) -> np.ndarray:
    """RDP curve ε(α) of ``steps`` Poisson-subsampled Gaussian steps at rate q and noise σ
    (Mironov, Talwar & Zhang 2019, §3.3; composition: Mironov 2017, Prop. 1)."""
    q, sigma = _check_plan(sample_rate, noise_multiplier, steps)
    orders = np.asarray(alphas, dtype=float)
    if orders.ndim != 1 or not np.all(np.isfinite(orders)) or np.any(orders <= 1):
        raise ValueError("RDP orders must be finite and greater than 1")
    return _one_step(q, sigma, orders) * int(steps)


def _check_plan(sample_rate: float, noise_multiplier: float, steps: int) -> tuple[float, float]:
    """q and σ as floats; ``ValueError`` unless 0 < q ≤ 1, σ is positive and finite and
    steps is a whole number ≥ 0."""
    q, sigma = float(sample_rate), float(noise_multiplier)
    if not 0 < q <= 1:
        raise ValueError(f"sample rate must be in (0, 1], got {sample_rate!r}")
    if not sigma > 0 or not math.isfinite(sigma):
        raise ValueError(f"noise multiplier must be positive and finite, got {noise_multiplier!r}")
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    return q, sigma


def _one_step(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Per-step ε(α) for each order; the terms of every series are prepared for all orders
    at once, and each series is summed term by term in log space, in order, so that the
    result is Opacus' to the last bit."""
    if q == 1.0:
        return orders / (2 * sigma**2)
    large = orders > LARGE_ORDER
    orders = np.where(large, np.ceil(orders), orders)
    integer = orders == np.floor(orders)
    small = integer & ~large
    log_a = np.empty_like(orders)
    if small.any():
        log_a[small] = _log_a_integer(q, sigma, orders[small])
    if large.any():
        log_a[large] = [_log_a_large_integer(q, sigma, int(alpha)) for alpha in orders[large]]
    if (~integer).any():
        log_a[~integer] = _log_a_fractional(q, sigma, orders[~integer])
    return log_a / (orders - 1)


@functools.lru_cache(maxsize=4)
def _log_factorials(n: int) -> np.ndarray:
    """ln k! for 0 ≤ k ≤ n."""
    return np.array([math.lgamma(k + 1) for k in range(n + 1)])


def _log_a_large_integer(q: float, sigma: float, n: int) -> float:
    """ln A_α for an integer order α = n > ``LARGE_ORDER``: the binomial sum with ln Γ for the
    coefficients, in NumPy, rounded up (module docstring)."""
    log_factorials = _log_factorials(n)
    k = np.arange(n + 1, dtype=float)
    log_coef = log_factorials[n] - log_factorials - log_factorials[::-1]
    log_q, log_1q = math.log(q), math.log(1 - q)
    terms = log_coef + k * log_q + (n - k) * log_1q + (k * k - k) / (2 * sigma**2)
    top = float(terms.max())
    magnitude = 3 * log_factorials[n] + n * (abs(log_q) + abs(log_1q)) + n * n / (2 * sigma**2)
    return top + math.log(math.fsum(np.exp(terms - top).tolist())) + 1e-14 * magnitude


def _log_a_integer(q: float, sigma: float, orders: np.ndarray) -> list[float]:
    """ln A_α for integer orders: the binomial sum, term by term in log space."""
    k = np.arange(int(orders.max()) + 1, dtype=float)
    log_coef = np.array([_log_binomials(float(a), 0, k.size)[1] for a in orders])
    terms = log_coef + k * math.log(q) + (orders[:, None] - k) * math.log(1 - q) + (k * k - k) / (2 * sigma**2)
    sums = []
    for alpha, row in zip(orders, terms.tolist()):
        total = -math.inf
        for term in row[: int(alpha) + 1]:
            total = _log_add(total, term)
        sums.append(total)
    return sums


def _log_a_fractional(q: float, sigma: float, orders: np.ndarray) -> list[float]:
    """ln A_α for fractional orders: the two signed series, term by term in log space, up to
    and including the first k at which both terms fall below e^{−30}. The parts of the terms
    without erfc are prepared in chunks of doubling length for the orders whose series has
    not ended yet; the erfc factors, ln(½ erfc(x)) = ln Φ(−√2 x), only for the terms summed."""
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    scale = math.sqrt(2) * sigma
    sums = [(-math.inf, -math.inf)] * orders.size
    todo = list(range(orders.size))
    start, stop = 0, 64
    while todo:
        k = np.arange(start, stop, dtype=float)
        j = orders[todo, None] - k
        coefs = [_log_binomials(float(orders[row]), start, stop) for row in todo]
        log_coef = np.array([log_coef for _, log_coef in coefs])
        log_t0 = log_coef + k * math.log(q) + j * math.log(1 - q)
        log_t1 = log_coef + j * math.log(q) + k * math.log(1 - q)
        base0 = (log_t0 + (k * k - k) / (2 * (sigma**2))).tolist()
        base1 = (log_t1 + (j * j - j) / (2 * (sigma**2))).tolist()
        unfinished = []
        for row, (coef, _), row0, row1, row_j in zip(todo, coefs, base0, base1, j.tolist()):
            a0, a1 = sums[row]
            for i, (c, b0, b1, jj) in enumerate(zip(coef, row0, row1, row_j), start):
                s0 = b0 + _log_half_erfc((i - z0) / scale)
                s1 = b1 + _log_half_erfc((z0 - jj) / scale)
                a0, a1 = (_log_add(a0, s0), _log_add(a1, s1)) if c > 0 else (_log_sub(a0, s0), _log_sub(a1, s1))
                if max(s0, s1) < _SERIES_CUTOFF:
                    break
            else:
                unfinished.append(row)
            sums[row] = (a0, a1)
        todo, start, stop = unfinished, stop, 2 * stop
        if todo and stop > _MAX_TERMS:
            raise ValueError(f"the subsampled-Gaussian series at order {orders[todo[0]]:g} does not converge in double precision")
    return [_log_add(a0, a1) for a0, a1 in sums]


_LOG_HALF, _LOG_TWO = math.log(0.5), math.log(2)


def _log_half_erfc(x: float) -> float:
    """ln(½ erfc(x)) = ln ½ + (ln 2 + ln Φ(−√2 x)), in the operations of Opacus' ``_log_erfc``."""
    return _LOG_HALF + (_LOG_TWO + log_ndtr(-x * 2**0.5))


@functools.lru_cache(maxsize=4096)
def _log_binomials(alpha: float, start: int, stop: int) -> tuple[list[float], list[float]]:
    """For start ≤ k < stop: C(α, k) up to a positive scale (its sign, and 0 where C is 0:
    k > α for an integer α) and ln |C(α, k)| (−inf where C is 0)."""
    mantissas, scales = _binomial_row(alpha, stop)
    logs = [math.log(abs(m)) + e if m != 0 else -math.inf for m, e in zip(mantissas[start:stop], scales[start:stop])]
    return mantissas[start:stop], logs


#: Below this k (after the symmetry C(n, k) = C(n, n − k) of an integer n), C(α, k) is the
#: product below; from it on, the recurrence.
_PRODUCT_BELOW = 20
#: A coefficient of the recurrence below this (or above its inverse) is rescaled by it, so
#: that it never underflows (or overflows: α in the hundreds).
_RESCALE_BELOW = 1e-280


@functools.lru_cache(maxsize=1024)
def _binomial_row(alpha: float, stop: int) -> tuple[list[float], list[float]]:
    """C(α, k) = m_k·e^{s_k} for 0 ≤ k < ``stop``, as the lists of m_k and s_k (s_k = 0 unless
    the recurrence rescaled), where C(α, k) = α(α − 1)···(α − k + 1)/k! (A&S 3.1.4):

    - k < 20 (after the symmetry of an integer α): the product ∏_{i=1}^{k} (i + α − k)/i, its
      numerator and denominator multiplied separately and divided out whenever the
      numerator passes 1e50: the value SciPy's ``binom`` gives, on which Opacus' terms are
      built (these small-k terms dominate the series where ε is tiny);
    - integer α, larger k: ``math.comb``, exact before its rounding to a double (and scaled
      by a power of two where it would overflow one);
    - fractional α, larger k: the recurrence C(α, k) = C(α, k − 1)·(α − k + 1)/k, with a
      relative error of about √k ulp.
    A row of ``stop`` > 64 extends the cached row of ``stop // 2`` (the series ask for rows
    of doubling length)."""
    n = float(alpha)
    whole = n == math.floor(n)
    mantissas, scales = (list(part) for part in _binomial_row(alpha, stop // 2)) if stop > 64 else ([], [])
    for k in range(len(mantissas), stop):
        small = n - k if whole and k > n / 2 else k
        scale = 0.0
        if whole and k > n:
            value = 0.0
        elif small < _PRODUCT_BELOW:
            value = _binomial_product(n, float(small))
        elif whole:
            exact = math.comb(int(n), k)
            shift = max(0, exact.bit_length() - 1000)  # beyond a double's range (α > 1000): keep the scale apart
            value, scale = float(exact >> shift), shift * math.log(2)
        else:
            value, scale = mantissas[-1] * (n - k + 1) / k, scales[-1]
            if abs(value) < _RESCALE_BELOW:
                value, scale = value / _RESCALE_BELOW, scale + math.log(_RESCALE_BELOW)
            elif abs(value) > 1 / _RESCALE_BELOW:
                value, scale = value * _RESCALE_BELOW, scale - math.log(_RESCALE_BELOW)
        mantissas.append(value)
        scales.append(scale)
    return mantissas, scales


def _binomial_product(n: float, k: float) -> float:
    """C(n, k) for a whole k < 20 as ∏_{i=1}^{k} (i + n − k)/i (see :func:`_binomial_row`)."""
    num, den = 1.0, 1.0
    for i in range(1, int(k) + 1):
        num *= i + n - k
        den *= i
        if abs(num) > 1e50:
            num /= den
            den = 1.0
    return num / den


def _log_add(x: float, y: float) -> float:
    """ln(e^x + e^y), the larger term factored out."""
    low, high = min(x, y), max(x, y)
    if low == -math.inf:
        return high
    return math.log1p(math.exp(low - high)) + high


def _log_sub(x: float, y: float) -> float:
    """ln(e^x − e^y) for x ≥ y (a partial sum of a convergent series stays positive)."""
    if x < y:
        raise ValueError("the subsampled-Gaussian series went negative")
    if y == -math.inf:
        return x
    if x == y:
        return -math.inf
    try:
        return math.log(math.expm1(x - y)) + y
    except OverflowError:
        return x


def subsampled_gaussian_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """The ε at δ that ``steps`` subsampled-Gaussian steps imply, converted over
    :data:`CALIBRATION_ALPHAS` (Balle et al. 2020, Thm 21): what Opacus' RDP accountant
    reports as ``get_epsilon(delta)``, to the bit (see :func:`_epsilon_and_order`)."""
    epsilon, _ = _epsilon_and_order(sample_rate, noise_multiplier, steps, delta, None)
    return epsilon


#: Relative slack of the lower bounds that let :func:`_epsilon_and_order` skip an order: far
#: above the rounding of the computed curve (about 1e-13 in ln A_α), so that a skipped order
#: is one whose ε is above the minimum beyond any rounding.
_BOUND_SLACK = 1e-9
#: Absolute rounding of ln A_α per step allowed for in the bounds (LN_A_ROUNDING of the tests, ×10).
_LN_A_SLACK = 1e-12


def _epsilon_and_order(q: float, sigma: float, steps: int, delta: float, guess: int | None) -> tuple[float, int]:
    """The ε of :func:`subsampled_gaussian_epsilon` and the index in :data:`CALIBRATION_ALPHAS`
    of an order that gives it, with the curve computed only at the orders that can give the
    minimum (the rest count as +inf in the conversion, which then returns the same ε).

    The conversion is ε = min_α f(α), f(α) = T·ε₁(α) + c(α), c(α) = ln((α − 1)/α) −
    (ln δ + ln α)/(α − 1) (Balle et al. 2020, Thm 21). L(α) = T·ln A_α = (α − 1)·T·ε₁(α) is
    convex in α with L(1) = 0 (ln A_α = ln E_{μ₀}[(μ/μ₀)^α] is a cumulant-generating
    function, convex by Hölder's inequality), so ε₁ ≥ 0, ε₁ is non-decreasing (van Erven &
    Harremoës 2014, Thm 3), and L lies above the line through its values at two computed
    orders both below or both above α: :func:`_lower_bound` bounds f at an order from the
    orders computed, and the order is skipped if that bound exceeds the smallest f found
    (its f exceeds the final minimum too). Orders are visited once each, outwards from
    ``guess`` (a calibration passes the previous σ's minimiser; None: the order where c is
    least), on the side nearer the best order so far. Each value is the one the whole
    curve holds (an order's terms do not depend on the others), so the result is the
    whole curve's to the bit."""
    q, sigma = _check_plan(q, sigma, steps)
    orders = np.asarray(CALIBRATION_ALPHAS)
    if q == 1.0:  # the Gaussian mechanism: the whole curve costs nothing
        return _converted(_one_step(q, sigma, orders) * int(steps), delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    bias = (np.log((orders - 1) / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)).tolist()
    curve = [math.inf] * orders.size
    done: list[int] = []  # the orders computed, in increasing order
    best_value, best = math.inf, min(range(orders.size), key=bias.__getitem__) if guess is None else guess
    left, right = best, best + 1  # the orders visited are those from left + 1 to right - 1
    while left >= 0 or right < orders.size:
        if right >= orders.size or (left >= 0 and best - left <= right - best):
            i, left = left, left - 1
        else:
            i, right = right, right + 1
        if _lower_bound(i, done, curve, int(steps)) + bias[i] - _BOUND_SLACK * (1 + abs(bias[i])) > best_value:
            continue
        bisect.insort(done, i)
        curve[i] = float(_one_step(q, sigma, orders[i : i + 1])[0] * int(steps))
        value = curve[i] + bias[i]
        if value < best_value:
            best_value, best = value, i
    return _converted(np.array(curve), delta)


def _lower_bound(i: int, done: list[int], curve: list[float], steps: int) -> float:
    """A lower bound on T·ε₁ at order i of :data:`CALIBRATION_ALPHAS` from its values at the
    orders ``done`` (see :func:`_epsilon_and_order`), less a slack for their rounding: 0;
    the value at the nearest order below (ε₁ is non-decreasing); and L = (α − 1)·T·ε₁ on the
    line through the two nearest orders below, or the two nearest above (L is convex)."""
    alpha = CALIBRATION_ALPHAS[i]
    at = bisect.bisect(done, i)
    bound = 0.0
    if at and math.isfinite(curve[done[at - 1]]):
        bound = curve[done[at - 1]] * (1 - _BOUND_SLACK)
    for pair in (done[at - 2 : at] if at >= 2 else [], done[at : at + 2]):
        if len(pair) < 2 or not all(math.isfinite(curve[j]) for j in pair):
            continue
        a1, a2 = (CALIBRATION_ALPHAS[j] for j in pair)
        l1, l2 = ((a - 1) * curve[j] for a, j in zip((a1, a2), pair))
        reach = 1 + max(abs(alpha - a1), abs(alpha - a2)) / (a2 - a1)
        line = l1 + (l2 - l1) / (a2 - a1) * (alpha - a1) - (_BOUND_SLACK * (abs(l1) + abs(l2)) + _LN_A_SLACK * steps) * reach
        bound = max(bound, line / (alpha - 1))
    return bound


def _converted(curve, delta: float) -> tuple[float, int]:
    """ε over :data:`CALIBRATION_ALPHAS` (:func:`rdp_to_epsilon`) and the index of its order."""
    epsilon, order = rdp_to_epsilon(curve, CALIBRATION_ALPHAS, delta)
    return epsilon, CALIBRATION_ALPHAS.index(order)


@functools.lru_cache(maxsize=256)
def calibrate_noise_multiplier(sample_rate: float, steps: int, epsilon: float, delta: float, tolerance: float = 0.01) -> float:
    """A noise multiplier σ, found by bisection, with which ``steps`` steps at rate q reach
    at most (ε, δ) under the RDP accountant and at least (1 − ``tolerance``)·ε.

    The search of Opacus' ``get_noise_multiplier`` (``accountant="rdp"``,
    ``epsilon_tolerance = tolerance·ε``): double σ from 20 until ε(σ) ≤ ε, then bisect
    [0, σ] until ε − ε(σ) ≤ tolerance·ε, always keeping the upper end, which is within
    budget. Each evaluation starts from the order that gave the previous one's ε
    (:func:`_epsilon_and_order`), so that it computes the curve at the few orders near the
    minimiser; the σ is the one the whole-curve search finds, to the bit. Cached."""
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"DP-SGD needs a positive finite epsilon, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"DP-SGD needs 0 < delta < 1, got {delta!r}")
    low, high = 0.0, 10.0
    eps_high, order = math.inf, None
    while eps_high > epsilon:
        high = 2 * high
        eps_high, order = _epsilon_and_order(sample_rate, high, steps, delta, order)
        if high > MAX_NOISE_MULTIPLIER:
            raise ValueError(f"no noise level reaches epsilon={epsilon:g} in {steps} steps: the budget is too small")
    while epsilon - eps_high > tolerance * epsilon:
        middle = (low + high) / 2
        eps_middle, order = _epsilon_and_order(sample_rate, middle, steps, delta, order)
        if eps_middle < epsilon:
            high, eps_high = middle, eps_middle
        else:
            low = middle
    return high

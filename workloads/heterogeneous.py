"""DPack's heterogeneous RDP workload (Tholoniat et al., EuroSys'25, §6; docs/design.md §5.3).

The paper evaluates DPack on workloads whose tasks mix DP mechanisms, so that blocks have
different best orders α, and sweeps how heterogeneous those best orders are. We follow the
paper's construction, as published with its artifact (``privacypacking/utils/zoo.py`` and
``generate_curves.py``, and the Alibaba-DP methodology of its §6.1):

1. A *curve zoo* of real mechanisms: Gaussian (σ on a geometric grid 0.01–10), Laplace
   (scale on the same grid), DP-FTRL (a Gaussian composed ⌈ln n⌉ times for datasets of
   n = 10³…10⁸ records), compositions Laplace + Gaussian and Laplace + Laplace, and DP-SGD
   (Poisson-subsampled Gaussian: q ∈ {0.001…0.5}, noise ∈ {0.1…2}, 1 to 200 epochs of 1/q
   steps). The paper's subsampled Laplace has no RDP curve in :mod:`privsched.budgets`
   and is left out. Each curve is what the live ledger charges a pipeline running that
   mechanism (:func:`~privsched.budgets.mechanisms.demand_vector`): a Gaussian, a DP-FTRL
   and a DP-SGD plan are declared as such and charged their exact curves (Mironov 2017,
   Table II; Mironov et al. 2019), while Laplace noise of scale b is the noise of a
   Laplace statistic (OpenDP's floating-point-safe sampler), which the scheduler plans as
   pure (1/b)-DP and charges min(1/b, α/(2b²)) (Bun & Steinke 2016, Prop. 3.3;
   :func:`~privsched.statistics.queries.statistic_mechanism`), not the continuous
   Laplace curve the paper's zoo uses.
2. Each curve is normalised by the block's capacity curve (ε_G = 10, δ_G = 1e-7, the
   paper's block); its size is ``ε_min = min_α d(α)/capacity(α)`` and its best order the
   α that attains it. Curves with ε_min outside (0.01, 1) are dropped.
3. A task first draws the *bin* of its best order from a discrete Gaussian over the
   positions of the orders in the grid, centred on α = 5, of standard deviation
   ``alpha_std`` (the paper's σ_α, its heterogeneity knob: 0 puts every task's best order
   at α = 5; ``inf`` draws the bins uniformly), then a curve uniformly within the bin.
4. It asks for k blocks, k drawn from a discrete normal over 1..``max_blocks`` of mean
   ``blocks_mean`` and deviation ``blocks_std`` (σ_blocks; 0 makes every task ask for
   ``blocks_mean`` blocks): the most recent k, or k at random (see "Block selection").
   Every task has weight 1.
5. Online: blocks arrive every ``block_interval`` seconds (``initial_blocks`` at time 0),
   on average ``tasks_per_block`` tasks per block period arrive as a Poisson process, and
   they are submitted in batches at the end of each ``batch`` window, as the paper's
   scheduler runs in batches every scheduling period. Tasks never time out unless
   ``timeout`` is given (the paper's tasks wait until the end).

Task sizes. By default a task keeps its mechanism's own size, which ranges over two orders
of magnitude (0.01–1): then both DPF and DPack mostly prefer the small tasks, and which
order a block is best used at matters little. The paper's artifact (``normalize_zoo``)
controls sizes instead: it shifts each normalised curve vertically so that its ε_min becomes
``epsilon_min_avg + epsilon_min_std · z``, z being the curve's own size standardised within
its best-order bin, and it also bends each curve to set the spread of its values over
α ∈ {4, 5, 6, 8} (``range_avg``, ``range_std``). Its microbenchmark configurations use
ε_min 0.05 ± 0.01 and range 0.05 ± 0.03, with one block per task for the σ_α sweep and
blocks of mean 10 (at most 20) at σ_α = 0 for the σ_blocks sweep.

With ``size_mean`` set we control sizes too, keeping each demand a mechanism's curve up to
a constant: a task's curve d(α) is *scaled* to c·d(α), ``c = s / ε_min``, with s drawn from
a normal(``size_mean``, ``size_std``) truncated to :data:`SIZE_RANGE`. Its best order is
unchanged and its size is s. For an integer c, c·d(α) is the c-fold composition of the
mechanism (for a Gaussian of noise σ, any c gives the Gaussian of noise σ/√c); otherwise
it lies between the ⌊c⌋- and ⌈c⌉-fold compositions, a demand the scheduler charges like
any other curve. Scaled tasks carry their demand as an explicit ``curve`` in the trace and
their family in ``class``.

Curve range ("bending"). With ``range_mean`` set, each task's curve is also bent as the
artifact's ``normalize_zoo`` does. Let n(α) be the curve normalised by the block's capacity
(after scaling), ε_min = min_α n(α) and R = max − min of n over :data:`RANGE_ALPHAS`
(α ∈ {4, 5, 6, 8}, the orders a block is usually best used at). The task draws a range r
from a normal(``range_mean``, ``range_std``) truncated to (0, ∞), and its curve becomes

    n'(α) = ε_min + (r / R) · (n(α) − ε_min)        at every order live on the block,

a vertical stretch about ε_min: n' keeps the best order and ε_min, its range over
:data:`RANGE_ALPHAS` is exactly r, and n' ≥ ε_min > 0. (The artifact maps each curve's own
range to a z-score within its best-order bin instead of drawing r; it does not truncate, so
a negative r would flip a curve, and it shifts sizes additively instead of scaling; with a
bend the result is the same curve n'.) The demand is n'(α)·capacity(α) at live orders; at
orders dead on the paper's block (capacity 0, ignored by the ledger there) it keeps the
scaled mechanism's values. A bent curve is a *synthetic demand curve*, as in the paper: a
valid RDP demand for the ledger (finite, non-negative, charged like any curve) but not the
curve of a mechanism a job could run, since stretching changes its shape. Bent tasks carry
it as an explicit ``curve``.

Block selection. By default a task asks for the latest k blocks (``block_selection =
"latest"``), so the newest block is in every task. The artifact's microbenchmarks pick a
task's k blocks uniformly at random, without replacement, among the blocks that exist when
it arrives (``RandomBlocks``); ``block_selection = "random"`` does so (k capped at the
number of existing blocks) and writes the chosen blocks as an explicit list. Then different
blocks are contended by different tasks and may have different best orders.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Annotated, NamedTuple

import numpy as np

from privsched.budgets.accounting import DEFAULT_ALPHAS, Accounting
from privsched.budgets.capacity import rdp_capacity
from privsched.simulation.generated import GeneratedTrace, mechanism_demand
from privsched.simulation.params import Between
from workloads.microbenchmarks import MAX_BLOCKS, MAX_PIPELINES, block_times, poisson_arrivals

BLOCK_EPSILON, BLOCK_DELTA = 10.0, 1e-7
#: Normalised sizes a zoo curve may have (exclusive bounds), as in the paper's artifact.
SIZE_RANGE = (0.01, 1.0)
#: The order the best-order distribution is centred on.
CENTER_ALPHA = 5.0
#: Orders over which a curve's range is measured and controlled (the paper artifact's).
RANGE_ALPHAS = (4.0, 5.0, 6.0, 8.0)
#: Bounds of a drawn range (exclusive): any positive stretch keeps the best order.
RANGE_BOUNDS = (0.0, math.inf)
BLOCK_SELECTIONS = ("latest", "random")
FAMILIES = ("gaussian", "laplace", "dp-ftrl", "laplace+gaussian", "laplace+laplace", "dp-sgd")
FAMILY_INDEX = {family: i for i, family in enumerate(FAMILIES)}

_NOISE_GRID = np.geomspace(0.01, 10, 100)
_COMPOSITION_GRID = (0.05, 0.1, 0.5, 1, 2, 3, 4, 5)


#: The accounting the workload's block and demands use.
RDP = Accounting.rdp(DEFAULT_ALPHAS)


def _gaussian(sigma: float) -> dict:
    return {"kind": "gaussian", "sigma": float(sigma)}


def laplace(scale: float) -> dict:
    """Laplace noise of scale b on a sensitivity-1 quantity, as the scheduler charges a
    Laplace statistic: the mechanism it plans for ε = 1/b (module docstring, step 1), the
    pure-DP declaration :func:`~privsched.statistics.queries.statistic_mechanism` gives a
    Laplace count at ε = 1/b (tests/test_workloads_heterogeneous.py holds the two equal)."""
    return {"kind": "epsilon_delta", "epsilon": 1.0 / float(scale), "delta": 0.0}


def _candidates() -> list[tuple[str, dict]]:
    """Every (family, mechanism) of the zoo before filtering."""
    zoo = [("gaussian", _gaussian(s)) for s in _NOISE_GRID]
    zoo += [("laplace", laplace(b)) for b in _NOISE_GRID]
    for sigma in np.geomspace(0.01, 10, 10):
        for records in np.geomspace(1e3, 1e8, 10):
            rounds = math.ceil(math.log(records))
            zoo.append(("dp-ftrl", {"kind": "composed", "parts": [_gaussian(sigma)] * rounds}))
    for b in _COMPOSITION_GRID:
        for other in _COMPOSITION_GRID:
            zoo.append(("laplace+gaussian", {"kind": "composed", "parts": [laplace(b), _gaussian(other)]}))
            zoo.append(("laplace+laplace", {"kind": "composed", "parts": [laplace(b), laplace(other)]}))
    for epochs in (1, 10, 100, 200):
        for q in (0.001, 0.01, 0.05, 0.1, 0.2, 0.5):
            for noise in (0.1, 0.5, 1, 2):
                steps = round(epochs / q)
                zoo.append(("dp-sgd", {"kind": "subsampled_gaussian", "sample_rate": q, "noise_multiplier": noise, "steps": steps}))
    return zoo


def charged_curve(mechanism: dict) -> np.ndarray:
    """The curve the ledger charges for ``mechanism`` on the workload's orders."""
    return mechanism_demand(json.dumps(mechanism, sort_keys=True), RDP)


def normalized(curve: np.ndarray) -> np.ndarray:
    """``d(α) / capacity(α)`` at every order live on the paper's block (dead orders: inf)."""
    capacity = rdp_capacity(BLOCK_EPSILON, BLOCK_DELTA, DEFAULT_ALPHAS)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(capacity > 0, np.asarray(curve, dtype=float) / np.where(capacity > 0, capacity, 1), np.inf)


class Zoo(NamedTuple):
    """The filtered zoo, in a fixed order: each curve's family, mechanism, best order (index
    into the default grid), size ε_min and demand curve over the default grid."""

    families: tuple[str, ...]
    mechanisms: tuple[dict, ...]
    best: np.ndarray
    size: np.ndarray
    curves: np.ndarray


@lru_cache(maxsize=1)
def zoo() -> Zoo:
    """The zoo's curves whose size lies in :data:`SIZE_RANGE` (module docstring, step 2)."""
    families, mechanisms, best, size, curves = [], [], [], [], []
    for family, mechanism in _candidates():
        curve = charged_curve(mechanism)
        share = normalized(curve)
        if not np.all(np.isfinite(curve)):
            continue
        k = int(np.argmin(share))
        if SIZE_RANGE[0] < share[k] < SIZE_RANGE[1]:
            families.append(family)
            mechanisms.append(mechanism)
            best.append(k)
            size.append(float(share[k]))
            curves.append(curve)
    return Zoo(tuple(families), tuple(mechanisms), np.array(best), np.array(size), np.array(curves))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_sizes(size_mean: float | None, size_std: float) -> None:
    """Raise a one-line ValueError unless the size distribution's parameters make sense."""
    if size_mean is None:
        if size_std != 0:
            raise ValueError(f"size_std applies only with size_mean, got size_std={size_std!r} without it")
        return
    low, high = SIZE_RANGE
    if not _number(size_mean) or not low < size_mean < high:
        raise ValueError(f"size_mean must be a number in ({low:g}, {high:g}), got {size_mean!r}")
    if not _number(size_std) or not 0 <= size_std < math.inf:
        raise ValueError(f"size_std must be a finite non-negative number, got {size_std!r}")


def check_ranges(range_mean: float | None, range_std: float) -> None:
    """Raise a one-line ValueError unless the range distribution's parameters make sense."""
    if range_mean is None:
        if range_std != 0:
            raise ValueError(f"range_std applies only with range_mean, got range_std={range_std!r} without it")
        return
    if not _number(range_mean) or not 0 < range_mean < math.inf:
        raise ValueError(f"range_mean must be a finite positive number, got {range_mean!r}")
    if not _number(range_std) or not 0 <= range_std < math.inf:
        raise ValueError(f"range_std must be a finite non-negative number, got {range_std!r}")


def check_block_selection(block_selection: str) -> None:
    """Raise a one-line ValueError unless ``block_selection`` is one of :data:`BLOCK_SELECTIONS`."""
    if block_selection not in BLOCK_SELECTIONS:
        raise ValueError(f"block_selection must be 'latest' or 'random', got {block_selection!r}")


def truncated_normal(rng: np.random.Generator, mean: float, std: float, n: int, bounds: tuple[float, float] = SIZE_RANGE) -> np.ndarray:
    """``n`` draws from a normal(mean, std) truncated to ``bounds``, by inverting its CDF (one
    uniform per draw); ``std = 0`` gives ``mean`` itself."""
    low, high = bounds
    if std == 0:
        return np.full(n, float(mean))
    from scipy.special import ndtr, ndtri  # only sized or bent workloads draw from it

    a, b = ndtr((low - mean) / std), ndtr((high - mean) / std)
    return np.clip(mean + std * ndtri(a + rng.random(n) * (b - a)), low, high)


def curve_range(share: np.ndarray) -> np.ndarray:
    """Range of normalised curves (last axis: the default grid) over :data:`RANGE_ALPHAS`."""
    columns = [DEFAULT_ALPHAS.index(a) for a in RANGE_ALPHAS]
    window = np.asarray(share)[..., columns]
    return window.max(axis=-1) - window.min(axis=-1)


def bend(curves: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """The synthetic demands whose normalised curves are ``curves``' rows stretched about
    their size ε_min so that each one's range over :data:`RANGE_ALPHAS` is its ``spread``
    (module docstring, "Curve range"): ``n' = ε_min + spread / R · (n − ε_min)`` at live
    orders, the row's own values at dead ones."""
    share = normalized(curves)
    live = np.isfinite(share)
    size = np.where(live, share, np.inf).min(axis=-1, keepdims=True)
    capacity = rdp_capacity(BLOCK_EPSILON, BLOCK_DELTA, DEFAULT_ALPHAS)
    stretched = size + np.asarray(spread, dtype=float)[..., None] / curve_range(share)[..., None] * (share - size)
    return np.where(live, np.where(live, stretched, 0.0) * capacity, curves)


def bin_probabilities(alpha_std: float, bins: np.ndarray) -> np.ndarray:
    """Probability of each best-order bin (positions in the order grid): a discrete Gaussian
    centred on α = 5 of deviation ``alpha_std`` positions, over the bins the zoo fills."""
    if not alpha_std >= 0:
        raise ValueError(f"alpha_std must be non-negative, got {alpha_std!r}")
    center = list(DEFAULT_ALPHAS).index(CENTER_ALPHA)
    if alpha_std == 0:
        weight = (bins == center).astype(float)
    elif math.isinf(alpha_std):
        weight = np.ones(len(bins))
    else:
        weight = np.exp(-0.5 * ((bins - center) / alpha_std) ** 2)  # a denormal deviation overflows to weight 0 (NumPy warns)
    return weight / weight.sum()


def block_count_probabilities(blocks_mean: float, blocks_std: float, max_blocks: int) -> np.ndarray:
    """P(k blocks) for k = 1..max_blocks: a normal density of the given mean and deviation,
    evaluated at each k and normalised (a point mass at round(mean) when the deviation is 0)."""
    if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 1:
        raise ValueError(f"max_blocks must be a positive integer, got {max_blocks!r}")
    if not blocks_std >= 0 or not 1 <= blocks_mean <= max_blocks:
        raise ValueError(f"need 1 <= blocks_mean <= max_blocks and blocks_std >= 0, got {blocks_mean!r}, {blocks_std!r}")
    k = np.arange(1, max_blocks + 1)
    if blocks_std == 0:
        weight = (k == round(blocks_mean)).astype(float)
    else:
        weight = np.exp(-0.5 * ((k - blocks_mean) / blocks_std) ** 2)  # a denormal deviation overflows to 0 (NumPy warns)
        if not weight.any():  # a deviation so small that every k is infinitely far: the nearest k
            weight = (k == round(blocks_mean)).astype(float)
    return weight / weight.sum()


def heterogeneous(
    *,
    seed: int = 0,
    duration: float = 300.0,
    rate: float | None = None,
    tasks_per_block: Annotated[float, Between(0, MAX_PIPELINES)] = 100.0,
    initial_blocks: Annotated[int, Between(0, MAX_BLOCKS)] = 10,
    block_interval: float = 10.0,
    alpha_std: float = math.inf,
    blocks_mean: Annotated[float, Between(1, MAX_BLOCKS)] = 1.0,
    blocks_std: float = 5.0,
    max_blocks: Annotated[int, Between(1, MAX_BLOCKS)] = 10,
    timeout: float | None = None,
    batch: float | None = 10.0,
    size_mean: float | None = None,
    size_std: float = 0.0,
    range_mean: float | None = None,
    range_std: float = 0.0,
    block_selection: str = "latest",
) -> GeneratedTrace:
    """Blocks every ``block_interval`` s; tasks drawn from the curve zoo (see the module
    docstring) at ``rate`` per second (default: ``tasks_per_block`` per block period).
    With ``size_mean``, each task's curve is scaled to a size drawn from a normal
    (``size_mean``, ``size_std``) truncated to :data:`SIZE_RANGE`; with ``range_mean``, it is
    bent to a range over :data:`RANGE_ALPHAS` drawn from a normal (``range_mean``,
    ``range_std``) truncated to (0, ∞); ``block_selection`` picks the latest k blocks or k
    existing blocks at random."""
    if not block_interval > 0:
        raise ValueError(f"block_interval must be positive, got {block_interval!r}")
    rate = tasks_per_block / block_interval if rate is None else rate
    check_sizes(size_mean, size_std)
    check_ranges(range_mean, range_std)
    check_block_selection(block_selection)
    families, mechanisms, best, size, zoo_curves = zoo()
    bins = np.array(sorted(set(best.tolist())), dtype=np.intp)  # not np.unique, which loads numpy.ma
    p_bin = bin_probabilities(alpha_std, bins)
    p_blocks = block_count_probabilities(blocks_mean, blocks_std, max_blocks)
    members = [np.flatnonzero(best == b) for b in bins]

    rng = np.random.default_rng(seed)
    block_arrival = block_times(initial_blocks, block_interval, duration)
    times = poisson_arrivals(rng, rate, duration)
    if batch:
        times = np.ceil(times / batch) * batch
        if not np.all(np.isfinite(times)):
            raise ValueError(f"batch {batch!r} is so small that arrival times overflow: they must be finite")
    n = len(times)
    chosen_bin = rng.choice(len(bins), size=n, p=p_bin)
    pick = rng.random(n)
    curve = np.array([int(members[b][int(u * len(members[b]))]) for b, u in zip(chosen_bin.tolist(), pick.tolist())], dtype=np.intp)
    last = rng.choice(np.arange(1, max_blocks + 1), size=n, p=p_blocks)
    scale = np.ones(n) if size_mean is None else truncated_normal(rng, size_mean, size_std, n) / size[curve]
    spread = None if range_mean is None else truncated_normal(rng, range_mean, range_std, n, RANGE_BOUNDS)
    block_lists = None
    if block_selection == "random":
        existing = np.searchsorted(block_arrival, times, side="right")
        chosen = [np.sort(rng.choice(int(e), size=min(int(k), int(e)), replace=False)) for e, k in zip(existing.tolist(), last.tolist())]
        start = np.concatenate([[0], np.cumsum([len(c) for c in chosen], dtype=np.int64)])
        block_lists = (start, np.concatenate([np.zeros(0, np.int64), *chosen]))
    if size_mean is None and spread is None:
        used = np.array(sorted(set(curve.tolist())), dtype=np.intp)
        demand = np.searchsorted(used, curve)
        demands: tuple[dict, ...] = tuple({"mechanism": mechanisms[u]} for u in used.tolist())
        curves = None
    else:
        demand, demands = np.arange(n), ()
        curves = scale[:, None] * zoo_curves[curve]
        if spread is not None:
            curves = bend(curves, spread)
    return GeneratedTrace(
        accounting="rdp",
        block_ids=[f"b{j}" for j in range(len(block_arrival))],
        block_arrival=block_arrival,
        block_epsilon=np.full(len(block_arrival), BLOCK_EPSILON),
        block_delta=np.full(len(block_arrival), BLOCK_DELTA),
        pipeline_ids=[f"p{i}" for i in range(n)],
        arrival=times,
        last=None if block_lists is not None else last,
        demand=demand.reshape(-1),
        demands=demands,
        timeout=np.full(n, math.inf if timeout is None else timeout),
        klass=np.array([FAMILY_INDEX[families[c]] for c in curve.tolist()], dtype=np.intp),
        classes=FAMILIES,
        curves=curves,
        block_lists=block_lists,
    )

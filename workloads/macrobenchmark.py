"""An Amazon-Reviews-like macrobenchmark (Luo et al., OSDI'21 §6.2; docs/design.md §5.2).

One block per day (ε_G = 10, δ_G = 1e-7); pipelines arrive as a Poisson process,
300 per day for 50 days by default (``days`` and ``pipelines_per_day`` scale it down), and
time out after 5 block periods.
- 75 % mice: DP statistics, Laplace with ε ∈ {0.01, 0.05, 0.1}. A statistic's error
  shrinks like 1/(ε n), so it takes the fewest blocks reaching its target accuracy:
  ``ceil(target / ε)`` blocks with ``target`` ∈ {0.02, 0.05, 0.1} (1 to 10 blocks; total
  demand ε × blocks ≤ 0.1, what the paper saw basic composition still grant).
- 25 % elephants: DP-SGD models (linear, feed-forward, LSTM, small BERT), (ε, δ = 1e-9)
  with ε ∈ {0.5, 1, 5}; bigger models need more data, and more at smaller ε:
  ``ceil(base / ε)`` blocks, base 1, 2, 5, 50 (1 to 100 blocks, at most 500).

Every pipeline's demand is what the live scheduler charges the built-in job it stands for
(:func:`privsched.trainers.builtin.plan_mechanism`, docs/design.md §3.4): a mouse is a
Laplace ``count`` statistic, pure ε-DP, charged ε under basic accounting and
min(ε, αε²/2) under RDP (Bun & Steinke 2016, Prop. 3.3); an elephant is a ``dpsgd`` job,
charged its training, calibrated to (0.9 ε, δ) (the subsampled Gaussian of its plan under
RDP, Mironov et al. 2019), composed with its 0.1 ε-DP held-out accuracy release.
Time is in seconds; a block period is one day by default.

Elastic demands (``elastic`` m; docs/design.md §4.2): every pipeline accepts any ε in
[m·ε, ε]. Its demand is the charge at ε, and its minimum the smallest fraction of that
curve which covers, at every order, the charge of the same job calibrated to m·ε
(:func:`~privsched.simulation.generated.covering_fraction`): m for a mouse's Laplace count
(its curve min(ε, αε²/2) shrinks by m at the orders where it is ε, by m² at the others);
for an elephant, computed from its DP-SGD plan recalibrated to m·ε, or to the smallest ε
above m·ε its plan reaches in its steps where it reaches no m·ε.

Units of privacy (``unit``; Luo et al., OSDI'21 §3.1 and §6.2, docs/privacy.md). The
layouts follow PrivateKube's artifact, whose raw blocks are (day × user bucket), 100 buckets
by a hash of the reviewer id (``evaluation/macrobenchmark/dataset.py``):
- ``event``: one block per day, ``day{d}``; a pipeline asks for the last k of them.
- ``user-time``: ``partitions`` user partitions × days, block ``u{p}-day{d}`` holding the rows
  of the people of partition p on day d (their guarantee is per person and day); a pipeline
  asking for the last k days asks for every partition of each of those days (P·k blocks).
- ``user``: ``partitions`` user blocks ``u{p}``, each holding its people's whole history
  (the block grows; its budget is the person's budget for ever), all present from the
  start; a pipeline asks for every user block, whatever days it reads, since any person may
  have rows in them.
Every pipeline asks every partition alike, so the grants do not depend on ``partitions``
(4 unless given): it only shows the layout. At person level a statistic's sensitivity is
the contribution bound K (``rows_per_user``, 1 unless given; rows a person has per day
under ``user-time``): its error K/(ε n) reaches the target on K times the data, so a mouse
reads ``ceil(K·target / ε)`` days (PrivateKube's artifact selects, per unit, the fewest
blocks reaching the target at the unit's sensitivity: ``evaluation/macrobenchmark/models.py``,
20 rows a user-day there). An elephant reads the days it reads at event level: what
user-level DP-SGD needs in data is not modelled. Under ``user`` the days read do not change
the blocks asked (all of them).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Annotated

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.mechanisms import Mechanism
from privsched.simulation.params import Between
from privsched.simulation.generated import GeneratedTrace
from privsched.simulation.limits import MAX_TIME
from privsched.budgets.capacity import validate_epsilon_delta
from privsched.trainers.builtin import plan_mechanism
from privsched.trainers.plans import DPSGDJob, dpsgd_mechanism, parse_job
from workloads.microbenchmarks import MAX_BLOCKS as MAX_WORKLOAD_BLOCKS
from workloads.microbenchmarks import MAX_PIPELINES
from workloads.microbenchmarks import poisson_arrivals

DAY = 86_400.0
BLOCK_EPSILON, BLOCK_DELTA = 10.0, 1e-7
MICE_EPSILONS = (0.01, 0.05, 0.1)
MICE_TARGETS = (0.02, 0.05, 0.1)
ELEPHANT_EPSILONS = (0.5, 1.0, 5.0)
ELEPHANT_DELTA = 1e-9
MAX_BLOCKS = 500
UNITS = ("event", "user-time", "user")
#: Most user partitions, and most (pipeline, block) pairs a unit's layout may list.
MAX_PARTITIONS, MAX_EDGES = 1000, 50_000_000
#: Smallest ``elastic`` fraction: a range [m·ε, ε] with m below it is refused.
MIN_ELASTIC = 0.01

#: DP-SGD plans: (model, the built-in zoo model its job trains, blocks needed at ε = 1,
#: Poisson sampling rate, epochs). A small BERT stands as the zoo's text model.
MODELS = (
    ("linear", "logreg", 1, 0.01, 5),
    ("feedforward", "mlp", 2, 0.01, 10),
    ("lstm", "lstm", 5, 0.005, 10),
    ("bert", "text", 50, 0.002, 3),
)
#: The built-in job a mouse runs: a Laplace count (its charge depends only on ε).
MOUSE_JOB = {"kind": "statistic", "query": "count", "noise": "laplace"}
#: Learning rate of an elephant's ``dpsgd`` job (its charge does not depend on it).
ELEPHANT_LR = 0.05


def blocks_needed(base: float, epsilon: float) -> int:
    """``ceil(base / ε)``, immune to float noise such as 0.05 / 0.01 = 5.000000000000001."""
    return min(MAX_BLOCKS, math.ceil(round(base / epsilon, 9)))


def elephant_job(model: str, sample_rate: float, epochs: float) -> dict:
    """The built-in ``dpsgd`` job an elephant stands for."""
    return {"kind": "dpsgd", "model": model, "sample_rate": sample_rate, "epochs": epochs, "lr": ELEPHANT_LR}


@lru_cache(maxsize=64)
def _live_charge(job: tuple, epsilon: float, delta: float, accounting: str) -> Mechanism:
    mode = Accounting.rdp() if accounting == "rdp" else Accounting.basic()
    spec = parse_job(dict(job))
    if isinstance(spec, DPSGDJob) and not mode.is_rdp:
        # Under basic composition a DP-SGD plan is charged (ε − ε_acc, δ) and ε_acc, whatever
        # noise σ reaches them (the charge holds no σ): the σ the live scheduler calibrates (and every plan here has
        # one, tests/test_workloads_live_charges.py) is not part of the charge, so it is not
        # computed (the subsampled-Gaussian accountant is most of the workload's generation).
        validate_epsilon_delta(epsilon, delta)
        return dpsgd_mechanism(spec, None, epsilon, delta, mode)
    return plan_mechanism(dict(job), epsilon, delta, mode)


def live_charge(job: dict, epsilon: float, delta: float, accounting: str) -> dict:
    """The mechanism the live scheduler charges a built-in ``job`` submitted at (ε, δ), as
    a trace's mechanism description (computed once per distinct job)."""
    return _live_charge(tuple(sorted(job.items())), epsilon, delta, accounting).model_dump()


def _mouse(epsilon: float, accounting: str) -> dict:
    return {"mechanism": live_charge(MOUSE_JOB, epsilon, 0.0, accounting)}


def _elephant(model: int, epsilon: float, accounting: str) -> dict:
    _, job_model, _, sample_rate, epochs = MODELS[model]
    return {"mechanism": live_charge(elephant_job(job_model, sample_rate, epochs), epsilon, ELEPHANT_DELTA, accounting)}


#: Bisection steps towards the smallest ε of a range that an elephant's plan reaches.
PLAN_SEARCH_STEPS = 20


def _minimum(key: tuple, low: float, high: float, accounting: str) -> dict:
    """The description of the charge of what ``key`` drew at the smallest ε of its range
    [``low``, ``high``] that its job has a plan for: ``low``, or for a DP-SGD plan whose noise
    cannot reach ``low`` in its steps, the smallest ε found by bisection that it reaches
    (reaching an ε is monotone in ε: more budget needs less noise)."""
    if key[0] == "mouse":
        return _mouse(low, accounting)
    try:
        return _elephant(key[1], low, accounting)
    except ValueError:
        pass
    lo, hi = low, high  # lo unreachable, hi reachable (the pipeline's own ε)
    for _ in range(PLAN_SEARCH_STEPS):
        middle = (lo + hi) / 2
        try:
            _elephant(key[1], middle, accounting)
            hi = middle
        except ValueError:
            lo = middle
    return _elephant(key[1], hi, accounting)


def macrobenchmark(
    *,
    accounting: str = "rdp",
    seed: int = 0,
    days: Annotated[int, Between(1, MAX_WORKLOAD_BLOCKS)] = 50,
    pipelines_per_day: Annotated[float, Between(0, MAX_PIPELINES)] = 300.0,
    block_period: float = DAY,
    timeout_periods: float = 5.0,
    duration: float | None = None,
    unit: str = "event",
    partitions: Annotated[int | None, Between(1, MAX_PARTITIONS)] = None,
    rows_per_user: Annotated[int | None, Between(1, MAX_BLOCKS)] = None,
    elastic: Annotated[float | None, Between(MIN_ELASTIC, 1.0)] = None,
) -> GeneratedTrace:
    """Daily data and a mix of DP statistics (mice) and DP-SGD models (elephants), on the
    blocks of ``unit`` (``event``, ``user-time`` or ``user``: the module's docstring). With
    ``elastic`` m, every pipeline asks for the range [m·ε, ε] (the module's docstring)."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
    if unit == "event" and (partitions, rows_per_user) != (None, None):
        raise ValueError("partitions and rows_per_user apply to the user and user-time units only")
    partitions, rows_per_user = partitions or 4, rows_per_user or 1
    if not 0 < block_period <= MAX_TIME:
        raise ValueError(f"block_period must be positive and at most {MAX_TIME:g} seconds, got {block_period!r}")
    block_period = float(block_period)
    if duration is not None:
        periods = duration / block_period  # may overflow to inf: compared before it is rounded
        days = max(1, math.ceil(periods)) if periods <= MAX_WORKLOAD_BLOCKS else MAX_WORKLOAD_BLOCKS + 1
    if days > MAX_WORKLOAD_BLOCKS:
        raise ValueError(f"the workload would have {days} daily blocks, more than the limit of {MAX_WORKLOAD_BLOCKS}")
    rng = np.random.default_rng(seed)
    horizon = days * block_period if duration is None else duration
    times = poisson_arrivals(rng, pipelines_per_day / block_period, horizon)
    if unit == "user":
        _check_edges(len(times) * partitions)
    demands: dict[str, int] = {}  # a demand description (as JSON) -> its index
    minimums: dict[int, dict] = {}  # a demand's index -> the description of its minimum (elastic)
    drawn: dict[tuple, int] = {}  # what a pipeline drew (its kind, model and ε) -> its demand's index
    demand, last, elephant = np.zeros(len(times), dtype=np.intp), np.zeros(len(times), dtype=np.int64), np.zeros(len(times), dtype=np.intp)
    for i in range(len(times)):
        if rng.random() < 0.75:
            epsilon = float(MICE_EPSILONS[rng.integers(len(MICE_EPSILONS))])
            target = MICE_TARGETS[rng.integers(len(MICE_TARGETS))]
            key: tuple = ("mouse", epsilon)
            last[i] = blocks_needed(rows_per_user * target, epsilon)
        else:
            model = int(rng.integers(len(MODELS)))
            epsilon = float(ELEPHANT_EPSILONS[rng.integers(len(ELEPHANT_EPSILONS))])
            key = ("elephant", model, epsilon)
            last[i] = blocks_needed(MODELS[model][2], epsilon)
            elephant[i] = 1
        if key not in drawn:
            description = _mouse(epsilon, accounting) if key[0] == "mouse" else _elephant(model, epsilon, accounting)
            drawn[key] = demands.setdefault(json.dumps(description, sort_keys=True), len(demands))
            if elastic is not None and drawn[key] not in minimums:
                minimums[drawn[key]] = _minimum(key, elastic * epsilon, epsilon, accounting)
        demand[i] = drawn[key]
    block_ids, block_arrival, block_lists = unit_layout(unit, days, partitions, block_period, times, last)
    return GeneratedTrace(
        accounting=accounting,
        block_ids=block_ids,
        block_arrival=block_arrival,
        block_epsilon=np.full(len(block_ids), BLOCK_EPSILON),
        block_delta=np.full(len(block_ids), BLOCK_DELTA),
        pipeline_ids=[f"p{i}" for i in range(len(times))],
        arrival=times,
        last=last if block_lists is None else None,
        block_lists=block_lists,
        demand=demand,
        demands=tuple(json.loads(text) for text in demands),
        timeout=np.full(len(times), timeout_periods * block_period),
        klass=elephant,
        classes=("mice", "elephants"),
        minimums=None if elastic is None else tuple(minimums[d] for d in range(len(demands))),
    )


def unit_layout(
    unit: str, days: int, partitions: int, block_period: float, arrival: np.ndarray, last: np.ndarray
) -> tuple[list[str], np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """The blocks of ``unit`` (ids and arrival times) and, unless a pipeline simply asks for
    its ``last`` k blocks (``event``), each pipeline's list of blocks as offsets and block
    indices (:class:`~privsched.simulation.generated.GeneratedTrace`)."""
    if unit == "event":
        return [f"day{d}" for d in range(days)], np.arange(days) * block_period, None
    if unit == "user":
        ids = [f"u{p}" for p in range(partitions)]
        index = np.tile(np.arange(partitions, dtype=np.int64), len(arrival))
        start = np.arange(len(arrival) + 1, dtype=np.int64) * partitions
        return ids, np.zeros(partitions), (start, index)
    # user-time: block d·P + p is partition p of day d; the last k days existing at arrival
    if days * partitions > MAX_WORKLOAD_BLOCKS:
        raise ValueError(f"the workload would have {days * partitions} user-time blocks, more than the limit of {MAX_WORKLOAD_BLOCKS}")
    existing = np.minimum(np.floor(arrival / block_period).astype(np.int64) + 1, days)
    first_day = existing - np.minimum(last, existing)
    counts = (existing - first_day) * partitions
    _check_edges(int(counts.sum()))
    ids = [f"u{p}-day{d}" for d in range(days) for p in range(partitions)]
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    index = np.repeat(first_day * partitions - start[:-1], counts) + np.arange(int(start[-1]))
    return ids, np.repeat(np.arange(days) * block_period, partitions), (start, index.astype(np.int64))


def _check_edges(edges: int) -> None:
    if edges > MAX_EDGES:
        raise ValueError(f"the pipelines would ask for {edges} blocks in all, more than the limit of {MAX_EDGES}")

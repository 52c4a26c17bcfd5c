"""Answers from a cached noisy histogram (docs/privacy.md, "Answers from a cached histogram").

As Turbo does (Kostopoulou et al., SOSP'23), a count or a histogram that asks for an
``accuracy`` (α, β) instead of an ε is answered, at no charge, from the counts and histograms
already released on the same blocks when their noise proves the accuracy
(:mod:`privsched.statistics.accuracy`); otherwise it runs, pays and its release joins the
cache: at the ε the accuracy needs alone (:func:`accuracy_epsilon`), or, when the cached
releases half meet it, at the smallest ε whose release combined with theirs proves it
(:func:`update_epsilon`), answering that combination (:func:`combined_answer`).

There is no separate cache to drift from the ledger: the cache of a dataset's blocks *is*
its completed, charged built-in counts and histograms on exactly those blocks (not reuses,
not cached answers), read from the ledger with the noise scale their charged mechanism
fixes, and the values their jobs released. A histogram of B bins over [lo, hi] of a column
answers a histogram of b bins of the same column and bounds when b divides B (each bin a
sum of B/b bins), and a count from the sum of its bins (every record lands in one bin:
values are clipped to the bounds, NaN to lo). A block whose data changed (its SHA-256) or
that was retired answers nothing. The answer and the releases it came from are recorded
in the pipeline's job (:func:`~privsched.ledger.reuse.record_cache_answer`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import numpy as np

from privsched.budgets.mechanisms import EpsilonDelta, demand_vector, mechanism_json, parse_mechanism
from privsched.ledger import Ledger
from privsched.ledger.fingerprints import data_problem
from privsched.ledger.models import DatasetInfo, PipelineInfo, PipelineRequest
from privsched.ledger.reuse import ANSWERED_FROM_CACHE, CACHE_UPDATE, ELASTIC_MIN, REUSED_FROM
from privsched.spec import PipelineSpec, SpecError
from privsched.statistics.accuracy import SCALE_SLACK, Estimate, Source, best_estimate, laplace_epsilon
from privsched.statistics.noise import laplace_scale
from privsched.statistics.queries import StatisticJob, statistic_mechanism
from privsched.statistics.release import noise_of

#: What a released pipeline's job reported (its metrics), by pipeline id; None if nothing.
Released = Callable[[int], "dict[str, Any] | None"]


def accuracy_epsilon(spec: PipelineSpec, dataset: DatasetInfo) -> float:
    """The ε a statistic with an ``accuracy`` runs at: :func:`~privsched.statistics.accuracy.laplace_epsilon`
    for its bins (a count: 1) at the sensitivity of a person's K rows; refused above the
    spec's ``epsilon`` (the cap), for Gaussian noise, or for a query other than a count or
    a histogram."""
    assert spec.accuracy is not None
    job = StatisticJob.model_validate(spec.job.params)
    if job.query not in ("count", "histogram"):
        raise SpecError(f"'accuracy' is for a count or a histogram, not a {job.query}")
    if job.noise != "laplace":
        raise SpecError("'accuracy' is calibrated for laplace noise: give 'epsilon' for gaussian noise")
    bins = job.bins or 1
    epsilon = laplace_epsilon(spec.accuracy.alpha, spec.accuracy.beta, bins, float(dataset.max_rows_per_user))
    if spec.epsilon_max is not None and epsilon > spec.epsilon_max:
        raise SpecError(f"the accuracy asked for needs ε = {epsilon:.4g}, above the cap 'epsilon' {spec.epsilon_max:g}")
    return epsilon


def _statistic(job: dict[str, Any]) -> StatisticJob | None:
    try:
        return StatisticJob.model_validate(job.get("params") or {})
    except ValueError:
        return None


def _source(info: PipelineInfo, query: StatisticJob, values: list[float], sensitivity: float) -> Source | None:
    """``info``'s release as an estimate of ``query`` (module docstring), or None."""
    released = _statistic(info.job)
    if released is None or info.mechanism is None or released.query not in ("count", "histogram"):
        return None
    kind, scale = noise_of(parse_mechanism(info.mechanism), sensitivity, integer=True)
    data = np.asarray(values, dtype=float)
    width = len(data)
    if query.query == "count":
        return Source(np.array([data.sum()]), width, kind, scale * SCALE_SLACK)
    if released.query != "histogram" or (released.column, released.bounds) != (query.column, query.bounds):
        return None
    bins = query.bins or 1
    if width % bins:
        return None
    return Source(data.reshape(bins, width // bins).sum(axis=1), width // bins, kind, scale * SCALE_SLACK)


def _sources(
    ledger: Ledger, request: PipelineRequest, query: StatisticJob, released: Released, only: list[int] | None = None
) -> tuple[list[int], list[Source]] | None:
    """The ids and estimates of the cached releases that answer ``query`` on the request's
    blocks; None when a block changed or was retired. ``only``: the releases of these
    pipelines, whatever their blocks became since (an answer already made)."""
    blocks = {b.key: b for b in ledger.list_blocks(request.dataset)}
    wanted = set(request.block_keys)
    if only is None and any(
        k not in blocks or blocks[k].state != "active" or data_problem(blocks[k].location, blocks[k].sha256) is not None for k in wanted
    ):
        return None
    sensitivity = float(ledger.get_dataset(request.dataset).max_rows_per_user)
    ids, sources = [], []
    for info in ledger.list_pipelines("completed", request.dataset):
        if not cacheable(info) or set(info.block_keys) != wanted or (only is not None and info.id not in only):
            continue
        metrics = released(info.id)
        value = None if metrics is None else metrics.get("value")
        if value is None:
            continue
        source = _source(info, query, value if isinstance(value, list) else [value], sensitivity)
        if source is not None:
            ids.append(info.id)
            sources.append(source)
    return ids, sources


def _answer(query: StatisticJob, estimate: Estimate, ids: list[int]) -> dict[str, Any]:
    values = [float(v) for v in estimate.values]
    answer: dict[str, Any] = {"value": values if query.query == "histogram" else values[0]}
    if query.query == "histogram":
        lo, hi = query.bounds  # type: ignore[misc]
        answer["edges"] = np.linspace(lo, hi, len(values) + 1).tolist()
    return answer | {"sources": [ids[i] for i in estimate.used], "failure_bound": estimate.failure}


def _query(request: PipelineRequest) -> tuple[StatisticJob, dict[str, float]] | None:
    accuracy = request.job.get("accuracy")
    query = _statistic(request.job)
    if request.job.get("kind") != "statistic" or accuracy is None or query is None:
        return None
    return query, {"alpha": float(accuracy["alpha"]), "beta": float(accuracy["beta"])}


def cached_answer(ledger: Ledger, request: PipelineRequest, released: Released) -> dict[str, Any] | None:
    """The answer to ``request`` from the cache, as recorded in its job's
    :data:`~privsched.ledger.reuse.ANSWERED_FROM_CACHE` (its value, the releases used and
    the proven failure probability), or None when the cache cannot prove its accuracy."""
    asked = _query(request)
    found = None if asked is None else _sources(ledger, request, asked[0], released)
    if asked is None or found is None:
        return None
    estimate = best_estimate(found[1], asked[1]["alpha"])
    if estimate is None or estimate.failure > asked[1]["beta"]:
        return None
    return _answer(asked[0], estimate, found[0])


def update_epsilon(sources: list[Source], query: StatisticJob, alpha: float, beta: float, full: float, sensitivity: float) -> float:
    """The smallest ε (to 1e-4 relative, by bisection) at which a fresh release of
    ``query``, combined with the cached ``sources`` by :func:`best_estimate`, is proven
    within (α, β); ``full`` (the ε of a release alone, which always is) when no smaller one is."""
    bins = query.bins or 1

    def enough(epsilon: float) -> bool:
        fresh = Source(np.zeros(bins), 1, "laplace", laplace_scale(sensitivity, epsilon) * SCALE_SLACK)
        estimate = best_estimate([*sources, fresh], alpha)
        return estimate is not None and estimate.failure <= beta

    low, high = 0.0, full
    while high - low > 1e-4 * full:
        middle = (low + high) / 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high if high < full and enough(high) else full


def cacheable(info: PipelineInfo) -> bool:
    """Whether ``info`` is a release the cache holds: a completed built-in statistic that
    ran (neither a reuse nor a cached answer) at the mechanism recorded at submit (not
    elastic: an elastic release's noise follows its grant)."""
    job = info.job
    return job.get("kind") == "statistic" and all(job.get(name) is None for name in (REUSED_FROM, ANSWERED_FROM_CACHE, ELASTIC_MIN))


def with_cached_answer(ledger: Ledger, request: PipelineRequest, released: Released) -> PipelineRequest:
    """``request`` with its job carrying its answer from the cache, if the cache has one;
    else, if the cache's releases let a smaller ε meet its accuracy once combined with a
    fresh release (:func:`update_epsilon`), charged that ε, its job naming those releases
    (:data:`~privsched.ledger.reuse.CACHE_UPDATE`, its answer: :func:`combined_answer`)."""
    answer = cached_answer(ledger, request, released)
    if answer is not None:
        return dataclasses.replace(request, job={**request.job, ANSWERED_FROM_CACHE: json.loads(json.dumps(answer))})
    asked = _query(request)
    found = None if asked is None else _sources(ledger, request, asked[0], released)
    if asked is None or not found or not found[1] or request.mechanism is None:
        return request
    mechanism = parse_mechanism(request.mechanism)
    if not isinstance(mechanism, EpsilonDelta) or mechanism.delta != 0:
        return request
    dataset = ledger.get_dataset(request.dataset)
    sensitivity = float(dataset.max_rows_per_user)
    epsilon = update_epsilon(found[1], asked[0], asked[1]["alpha"], asked[1]["beta"], mechanism.epsilon, sensitivity)
    if epsilon >= mechanism.epsilon:
        return request
    charged = statistic_mechanism(asked[0], epsilon, 0.0, dataset.accounting, dataset.max_rows_per_user)
    job = {**request.job, CACHE_UPDATE: {"sources": found[0], "epsilon": epsilon}}
    return dataclasses.replace(
        request, job=job, mechanism=mechanism_json(charged), demand=demand_vector(charged, dataset.accounting), demands=None
    )


def combined_answer(ledger: Ledger, info: PipelineInfo, released: Released) -> dict[str, Any] | None:
    """The answer of a completed pipeline that ran as a cache update: its own release
    combined with the releases its job names, as :func:`best_estimate` chose at submit
    (the choice depends on the noise scales alone, so it is the same); None otherwise."""
    update = info.job.get(CACHE_UPDATE)
    if update is None or str(info.state) != "completed":
        return None
    query = _statistic(info.job)
    if query is None:
        return None
    request = PipelineRequest(info.name, info.dataset, info.block_keys)
    found = _sources(ledger, request, query, released, only=[*update["sources"], info.id])
    accuracy = info.job.get("accuracy") or {}
    if not found or info.id not in found[0]:
        return None
    estimate = best_estimate(found[1], float(accuracy["alpha"]))
    return None if estimate is None else _answer(query, estimate, found[0])

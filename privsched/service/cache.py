"""Answers from a cached noisy histogram (docs/privacy.md, "Answers from a cached histogram").

As Turbo does (Kostopoulou et al., SOSP'23), a count or a histogram that asks for an
``accuracy`` (α, β) instead of an ε is answered, at no charge, from the counts and histograms
already released on the same blocks when their noise proves the accuracy
(:mod:`privsched.statistics.accuracy`); otherwise it runs at the ε the accuracy needs
(:func:`accuracy_epsilon`), pays, and its release joins the cache.

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

from privsched.budgets.mechanisms import parse_mechanism
from privsched.ledger import Ledger
from privsched.ledger.fingerprints import data_problem
from privsched.ledger.models import DatasetInfo, PipelineInfo, PipelineRequest
from privsched.ledger.reuse import ANSWERED_FROM_CACHE, REUSED_FROM
from privsched.spec import PipelineSpec, SpecError
from privsched.statistics.accuracy import SCALE_SLACK, Source, best_estimate, laplace_epsilon
from privsched.statistics.queries import StatisticJob
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
    if spec.epsilon is not None and epsilon > spec.epsilon:
        raise SpecError(f"the accuracy asked for needs ε = {epsilon:.4g}, above the cap 'epsilon' {spec.epsilon:g}")
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


def cached_answer(ledger: Ledger, request: PipelineRequest, released: Released) -> dict[str, Any] | None:
    """The answer to ``request`` from the cache, as recorded in its job's
    :data:`~privsched.ledger.reuse.ANSWERED_FROM_CACHE` (its value, the releases used and
    the proven failure probability), or None when the cache cannot prove its accuracy."""
    accuracy = request.job.get("accuracy")
    query = _statistic(request.job)
    if request.job.get("kind") != "statistic" or accuracy is None or query is None:
        return None
    blocks = {b.key: b for b in ledger.list_blocks(request.dataset)}
    wanted = set(request.block_keys)
    if not wanted <= blocks.keys() or any(
        blocks[k].state != "active" or data_problem(blocks[k].location, blocks[k].sha256) is not None for k in wanted
    ):
        return None
    sensitivity = float(ledger.get_dataset(request.dataset).max_rows_per_user)
    ids, sources = [], []
    for info in ledger.list_pipelines("completed", request.dataset):
        if not cacheable(info) or set(info.block_keys) != wanted:
            continue
        metrics = released(info.id)
        value = None if metrics is None else metrics.get("value")
        if value is None or _statistic(info.job) is None:
            continue
        source = _source(info, query, value if isinstance(value, list) else [value], sensitivity)
        if source is not None:
            ids.append(info.id)
            sources.append(source)
    estimate = best_estimate(sources, float(accuracy["alpha"]))
    if estimate is None or estimate.failure > float(accuracy["beta"]):
        return None
    values = [float(v) for v in estimate.values]
    answer: dict[str, Any] = {"value": values if query.query == "histogram" else values[0]}
    if query.query == "histogram":
        lo, hi = query.bounds  # type: ignore[misc]
        answer["edges"] = np.linspace(lo, hi, len(values) + 1).tolist()
    return answer | {"sources": [ids[i] for i in estimate.used], "failure_bound": estimate.failure}


def cacheable(info: PipelineInfo) -> bool:
    """Whether ``info`` is a release the cache holds: a completed built-in statistic that
    ran (neither a reuse nor a cached answer)."""
    job = info.job
    return job.get("kind") == "statistic" and job.get(REUSED_FROM) is None and job.get(ANSWERED_FROM_CACHE) is None


def with_cached_answer(ledger: Ledger, request: PipelineRequest, released: Released) -> PipelineRequest:
    """``request`` with its job carrying its answer from the cache, if the cache has one."""
    answer = cached_answer(ledger, request, released)
    if answer is None:
        return request
    return dataclasses.replace(request, job={**request.job, ANSWERED_FROM_CACHE: json.loads(json.dumps(answer))})

"""Exact reuse of a released statistic (docs/privacy.md, "Reuse of released results").

A completed built-in statistic's release is public to the readers of its dataset, so
answering the same statistic again with that release is post-processing of a public output
and costs no budget (Dwork & Roth 2014, Prop. 2.1). The same statistic means the same
:func:`reuse_key`: dataset, job parameters (query, column, bounds, bins, noise, ...), ε, δ,
the mechanism charged, and the blocks in order (each block's fingerprint, recorded at its
creation, never changes in the ledger). A reused pipeline is recorded as submitted with the
demand it would have had, then completed at once with nothing consumed and no budget moved
(:func:`record_reuse`), so the event log, the balances and the audit stay exact.

A count or histogram answered from the cached releases of its blocks
(:mod:`privsched.service.cache`) is recorded alike (:func:`record_cache_answer`), its job
carrying the answer and the pipelines whose releases it came from.
"""

from __future__ import annotations

import json
from typing import Any

from privsched.ledger.errors import LedgerError
from privsched.ledger.schema import pack, unpack
from privsched.ledger.transaction import Transaction

#: The job field naming the pipeline whose release a reused pipeline returns.
REUSED_FROM = "reused_from"
#: The job field holding an answer from the cached releases of its blocks, and their ids.
ANSWERED_FROM_CACHE = "answered_from_cache"
#: The job field of a statistic that ran at a smaller ε to be combined with cached releases.
CACHE_UPDATE = "cache_update"
#: The job field of an elastic pipeline's least ε (its release is calibrated to its grant).
ELASTIC_MIN = "epsilon_min"
#: Job fields that do not change what a statistic releases.
_IGNORED = frozenset({REUSED_FROM, "max_runtime"})
_BLOCK_KEYS = "SELECT b.key FROM demands e JOIN blocks b ON b.id = e.block_id WHERE e.pipeline_id = ? ORDER BY e.position"


def reusable(job: dict[str, Any]) -> bool:
    """Whether a job's release may be served again: a built-in statistic's, neither itself a
    reuse nor an answer from the cache or combined with it, nor elastic (its noise follows
    its grant, not the mechanism recorded at submit)."""
    return job.get("kind") == "statistic" and all(
        job.get(name) is None for name in (REUSED_FROM, ANSWERED_FROM_CACHE, CACHE_UPDATE, ELASTIC_MIN)
    )


def reuse_key(dataset: str, mechanism: str | None, job: dict[str, Any], block_keys: list[str]) -> str:
    """The canonical text of a statistic: equal keys release the same query under the same
    mechanism on the same blocks."""
    kept = {name: value for name, value in job.items() if name not in _IGNORED}
    return json.dumps([dataset, json.loads(mechanism) if mechanism else None, kept, list(block_keys)], sort_keys=True)


def record_reuse(tx: Transaction, pipeline_id: int, source_id: int) -> None:
    """pending → completed for a just-submitted pipeline that returns ``source_id``'s
    release: nothing allocated, nothing consumed. Refused unless the source is a completed
    statistic, not itself a reuse, with the same :func:`reuse_key` on the same blocks."""
    rows = tx.sql(
        "SELECT p.id, p.state, p.dataset_id, d.name, p.mechanism, p.job FROM pipelines p JOIN datasets d ON d.id = p.dataset_id "
        "WHERE p.id IN (?, ?)",
        [pipeline_id, source_id],
    )
    found = {row[0]: row[1:] for row in rows}
    if source_id not in found or found[source_id][0] != "completed":
        raise LedgerError(f"pipeline {source_id} is no completed pipeline whose release can be reused")
    keys = {}
    for i in (pipeline_id, source_id):
        _, dataset_id, dataset, mechanism, job = found[i]
        blocks = [k for (k,) in tx.sql(_BLOCK_KEYS, [i])]
        keys[i] = (dataset_id, reuse_key(dataset, mechanism, json.loads(job), blocks))
    if not reusable(json.loads(found[source_id][4])) or keys[pipeline_id] != keys[source_id]:
        raise LedgerError(f"pipeline {source_id} released a different statistic: its release cannot be reused")
    _, dataset_id, _, _, _ = found[pipeline_id]
    _complete_free(tx, pipeline_id, dataset_id, f"reused the release of pipeline {source_id}")


def record_cache_answer(tx: Transaction, pipeline_id: int, answer: dict[str, Any]) -> None:
    """pending → completed for a just-submitted count or histogram answered from the
    releases ``answer["sources"]``: nothing allocated, nothing consumed. Refused unless each
    source is a completed count or histogram of the same dataset that ran (neither a reuse
    nor a cached answer), on the same set of blocks, and the pipeline asks for an accuracy."""
    sources = answer.get("sources") if isinstance(answer, dict) else None
    if not isinstance(sources, list) or not sources or not all(isinstance(i, int) and not isinstance(i, bool) for i in sources):
        raise LedgerError("an answer from the cache names the released pipelines it comes from")
    ((dataset_id, job),) = tx.sql("SELECT dataset_id, job FROM pipelines WHERE id = ?", [pipeline_id])
    if json.loads(job).get("accuracy") is None:
        raise LedgerError("only a statistic that asks for an accuracy is answered from the cache")
    blocks = sorted(k for (k,) in tx.sql(_BLOCK_KEYS, [pipeline_id]))
    for source in sources:
        found = tx.sql("SELECT state, dataset_id, job FROM pipelines WHERE id = ?", [source])
        if not found or found[0][0] != "completed" or found[0][1] != dataset_id:
            raise LedgerError(f"pipeline {source} is no completed pipeline of the dataset whose release can answer from the cache")
        params = json.loads(found[0][2])
        ran = params.get("kind") == "statistic" and params.get(REUSED_FROM) is None and params.get(ANSWERED_FROM_CACHE) is None
        if not ran or (params.get("params") or {}).get("query") not in ("count", "histogram"):
            raise LedgerError(f"pipeline {source} released no count or histogram that the cache holds")
        if sorted(k for (k,) in tx.sql(_BLOCK_KEYS, [source])) != blocks:
            raise LedgerError(f"pipeline {source} released on other blocks: it cannot answer from the cache")
    names = ", ".join(str(i) for i in sources)
    _complete_free(tx, pipeline_id, dataset_id, f"answered from the cached releases of pipelines {names}")


def _complete_free(tx: Transaction, pipeline_id: int, dataset_id: int, reason: str) -> None:
    """Complete a pending pipeline with nothing consumed and no budget moved."""
    import numpy as np

    zeros = [
        (pack(np.zeros_like(unpack(demand))), pipeline_id, block_id)
        for block_id, demand in tx.sql("SELECT block_id, demand FROM demands WHERE pipeline_id = ?", [pipeline_id])
    ]
    tx.db.conn.executemany("UPDATE demands SET consumed = ? WHERE pipeline_id = ? AND block_id = ?", zeros)
    tx.db.execute(
        "UPDATE pipelines SET state = 'completed', granted_at = ?, started_at = ?, finished_at = ? WHERE id = ?",
        [tx.at, tx.at, tx.at, pipeline_id],
    )
    tx.moves.state_event("reuse", "pending", "completed", dataset_id=dataset_id, pipeline_id=pipeline_id, reason=reason)

"""Finding a release a submitted statistic can reuse (:mod:`privsched.ledger.reuse`).

At submit, a built-in statistic whose :func:`~privsched.ledger.reuse.reuse_key` equals that
of a completed statistic of the same dataset names that pipeline as the release it returns,
provided each of its blocks is still active and its data still has the fingerprint recorded
when the block was created (:func:`~privsched.ledger.fingerprints.data_problem`). The ledger
then records it completed, at no charge, and checks the match again inside its transaction.
Only a submitter the dataset admits reaches this point (the API refuses the others first).
"""

from __future__ import annotations

import dataclasses

from privsched.ledger import Ledger
from privsched.ledger.fingerprints import data_problem
from privsched.ledger.models import PipelineInfo, PipelineRequest
from privsched.ledger.reuse import REUSED_FROM, reusable, reuse_key
from privsched.service.cache import Released, with_cached_answer


def reusable_source(ledger: Ledger, request: PipelineRequest) -> PipelineInfo | None:
    """The earliest completed pipeline whose release ``request`` may return, or None."""
    if not reusable(request.job):
        return None
    key = reuse_key(request.dataset, request.mechanism, request.job, request.block_keys)
    for info in ledger.released_statistics(request.dataset, request.mechanism):
        if reusable(info.job) and reuse_key(info.dataset, info.mechanism, info.job, info.block_keys) == key:
            blocks = {b.key: b for b in ledger.list_blocks(request.dataset)}
            if all(blocks[k].state == "active" and data_problem(blocks[k].location, blocks[k].sha256) is None for k in info.block_keys):
                return info
            return None
    return None


def with_reuse(ledger: Ledger, request: PipelineRequest, released: Released | None = None) -> PipelineRequest:
    """``request`` with its job naming the release it reuses, if there is one, else (given
    what released pipelines reported, ``released``) carrying its answer from the cache
    (:mod:`privsched.service.cache`), if the cache has one."""
    source = reusable_source(ledger, request)
    if source is not None:
        return dataclasses.replace(request, job={**request.job, REUSED_FROM: source.id})
    if released is None:
        return request
    return with_cached_answer(ledger, request, released)

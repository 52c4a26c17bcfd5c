"""The ledger in Prometheus' text format, read afresh at every scrape.

Names follow Kueue's and Ray's conventions: a ``privsched_`` prefix, ``_total`` on counters,
``_seconds`` on durations, gauges of current state labelled by state or bucket. Counters are
recomputed from the append-only event log, so they only ever grow and survive restarts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from privsched.dashboard.bars import BUCKETS, budget_bar
from privsched.ledger.models import PIPELINE_STATES

if TYPE_CHECKING:
    from privsched.client import Client
    from privsched.dashboard.views import Readable
    from privsched.service.waiting import WaitingReason

#: Upper bounds (seconds) of the waiting-time histograms' buckets.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
#: The final states in which a job process ran: the outcomes of job runs.
RUN_OUTCOMES = ("completed", "failed", "timed_out", "cancelled")
#: Why a pending pipeline waits (:class:`~privsched.service.waiting.WaitingReason` codes).
REASON_CODES = ("budget", "quota", "turn")


def histogram(name: str, documentation: str, values: Iterable[float]) -> HistogramMetricFamily:
    """A histogram family over ``values`` with cumulative ``WAIT_BUCKETS`` counts."""
    values = sorted(values)
    buckets = [(f"{bound:g}", float(sum(1 for v in values if v <= bound))) for bound in WAIT_BUCKETS]
    buckets.append(("+Inf", float(len(values))))
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=float(sum(values)))


class LedgerCollector(Collector):
    """Collects every metric of the readable datasets from one client's ledger when
    Prometheus scrapes; ``reasons`` are the pending pipelines' waiting reasons."""

    def __init__(self, client: Client, readable: Readable, reasons: dict[int, WaitingReason]) -> None:
        self.client = client
        self.datasets = [dataset for dataset in client.datasets() if readable(dataset)]
        self.reasons = reasons

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        names = {dataset.name for dataset in self.datasets}
        ids = {dataset.id for dataset in self.datasets}
        pipelines = [info for info in self.client.list() if info.dataset in names]
        states = Counter(info.state.value for info in pipelines)
        by_state = GaugeMetricFamily("privsched_pipelines", "Pipelines by state.", labels=["state"])
        for state in PIPELINE_STATES:
            by_state.add_metric([state], states.get(state, 0))
        yield by_state

        waiting = Counter(self.reasons[info.id].code for info in pipelines if info.state == "pending" and info.id in self.reasons)
        by_reason = GaugeMetricFamily("privsched_pending_pipelines", "Pending pipelines by why they wait.", labels=["reason"])
        for code in REASON_CODES:
            by_reason.add_metric([code], waiting.get(code, 0))
        yield by_reason

        yield histogram(
            "privsched_admission_wait_time_seconds",
            "Submit-to-grant time of granted pipelines.",
            [info.granted_at - info.submitted_at for info in pipelines if info.granted_at is not None],
        )
        yield histogram(
            "privsched_pending_wait_time_seconds",
            "How long each pending pipeline has waited so far.",
            [now - info.submitted_at for info in pipelines if info.state == "pending"],
        )

        runs = CounterMetricFamily("privsched_job_runs", "Ended job runs by outcome.", labels=["outcome"])
        outcomes = Counter(info.state.value for info in pipelines if info.started_at is not None and info.finished_at)
        for outcome in RUN_OUTCOMES:
            runs.add_metric([outcome], outcomes.get(outcome, 0))
        yield runs

        events = Counter(event.kind for event in self.client.events() if event.dataset_id in ids)
        grants = CounterMetricFamily("privsched_grants", "Pipelines granted since the ledger was created.")
        grants.add_metric([], sum(1 for info in pipelines if info.granted_at is not None))
        yield grants
        ledger_events = CounterMetricFamily("privsched_ledger_events", "Ledger events by kind.", labels=["kind"])
        for kind, count in sorted(events.items()):
            ledger_events.add_metric([kind], count)
        yield ledger_events

        fractions = GaugeMetricFamily(
            "privsched_block_budget_fraction",
            "Share of each block's capacity in each bucket, at the block's reference dimension.",
            labels=["dataset", "block", "bucket"],
        )
        for dataset in self.datasets:
            for block in self.client.blocks(dataset.name):
                bar = budget_bar(block, dataset.accounting)
                for bucket in BUCKETS:
                    fractions.add_metric([dataset.name, block.key, bucket], getattr(bar, bucket))
        yield fractions


def render(client: Client, readable: Readable, reasons: dict[int, WaitingReason]) -> bytes:
    """The metrics page body (Prometheus text exposition format 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(client, readable, reasons))
    return generate_latest(registry)

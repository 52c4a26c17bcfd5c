"""The Python API: connect to a database, manage datasets and blocks, submit pipelines,
follow their runs, and (for notebooks and tests) run a scheduler in-process.

    import privsched as ps
    client = ps.connect("privsched.db")                       # or $PRIVSCHED_DB
    client.create_dataset("reviews", epsilon=10, delta=1e-7, accounting="rdp")
    client.add_blocks("reviews", [("2026-01-01", "/data/2026-01-01.npz"), ...])

    @client.pipeline(dataset="reviews", blocks=ps.Last(10), epsilon=1.0, delta=1e-9, gpus=1)
    def train(ctx): ...                                       # ctx: privsched.JobContext

    run = train.submit(lr=0.1)                                 # keyword arguments -> ctx.params
    client.run_until_idle(policy="dpf-n", n=100)               # or `privsched serve` elsewhere
    run.wait(); print(run.status, run.consumed)
    print(run.metrics); run.download("out/")                   # what it released, its model

Every CLI command calls one method here (``privsched submit`` -> :meth:`Client.submit`,
``status`` -> :meth:`Client.status`, ``result`` -> :meth:`Client.result`, ``download`` ->
:meth:`Client.download`, ``serve`` -> :meth:`Client.serve`, ...).
"""

from __future__ import annotations

import builtins
import dataclasses
import getpass
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, TypeAlias

from privsched.blocks import BlockLike, block_spec
from privsched.handles import PipelineHandle
from privsched.ledger.errors import LedgerError
from privsched.ledger.states import PipelineState
from privsched.readouts import BudgetReads, QuotaUsage, demand_share
from privsched.service.rundirs import RunDirs

# What a command that only reads (``privsched list``, ``status``) does not use is imported
# where it is used: NumPy, the job runner, the specification models (pydantic, YAML), the
# request builder and the compute pool (issue 16: such a command answers within 0.3 s).
if TYPE_CHECKING:
    import numpy as np

    from privsched.data.importer import ImportReport
    from privsched.jobs.runner import JobResult
    from privsched.ledger import AuditReport, BlockInfo, DatasetInfo, DatasetSchema, Event, Ledger, PipelineInfo, PipelineRequest
    from privsched.ledger.identities import Identities
    from privsched.results import PipelineResult
    from privsched.service.dryrun import DryRun
    from privsched.service.resources import Pool
    from privsched.service.serve import ServeOptions, ServeSummary, Startup
    from privsched.service.waiting import WaitingReason
    from privsched.spec import BlockSelector, PipelineSpec

    SpecLike: TypeAlias = "PipelineSpec | Mapping[str, Any] | str | os.PathLike"


def open_client(path: str | os.PathLike | None = None, *, create: bool = True) -> Client:
    """A client of the database ``path``, else ``$PRIVSCHED_DB``, else ``privsched.db`` in the
    current folder (created on first use unless ``create=False``); :func:`privsched.connect`
    also reaches servers."""
    given = Path(path or os.environ.get("PRIVSCHED_DB") or "privsched.db")
    try:
        resolved = given.resolve()
    except (OSError, RuntimeError) as exc:  # a symbolic-link loop
        raise LedgerError(f"cannot open {given}: {exc}") from None
    return Client(resolved, create=create)


def function_reference(fn: Callable) -> tuple[str, list[str]]:
    """How a job process finds ``fn``: ``module:qualname`` and the folder to import it from.

    A function of a script run as ``python script.py`` is imported as module ``script`` from
    the script's folder: the script must guard its top-level work with
    ``if __name__ == "__main__":``, as with multiprocessing."""
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<" in qualname:
        raise ValueError(f"pipeline function {qualname or fn!r} must be defined at module level to run as a job")
    module = sys.modules.get(fn.__module__)
    file = getattr(module, "__file__", None)
    if module is None or file is None:
        raise ValueError(f"pipeline function {qualname} must live in an importable module (not a notebook cell)")
    path = Path(file).resolve()
    if fn.__module__ == "__main__":
        return f"{path.stem}:{qualname}", [str(path.parent)]
    parts = fn.__module__.split(".")
    root = path.parent
    for _ in range(len(parts) - (0 if path.name == "__init__.py" else 1)):
        root = root.parent
    return f"{fn.__module__}:{qualname}", [str(root)]


class Run(PipelineHandle):
    """A handle on one submitted pipeline; every property reads the ledger afresh."""

    client: Client

    @property
    def grant(self) -> dict[str, np.ndarray]:
        """The demand per block (allocated once the pipeline is granted)."""
        return self.info.demands

    @property
    def consumed(self) -> dict[str, np.ndarray] | None:
        """The budget consumed per block, once the pipeline has finished."""
        return self.info.consumed

    @property
    def message(self) -> str | None:
        return self.info.message

    @property
    def job_result(self) -> JobResult | None:
        """What the job's supervisor wrote of how it ended, once it has (None before)."""
        return self.client.job_result(self.id)


class PipelineFunction:
    """A function decorated with :meth:`Client.pipeline`: call it to run it directly, or
    :meth:`submit` it as a pipeline whose job calls it with its :class:`JobContext`."""

    def __init__(self, client: Client, fn: Callable, fields: dict[str, Any]) -> None:
        self.client = client
        self.fn = fn
        self.fields = fields
        self.function, self.pythonpath = function_reference(fn)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "pipeline")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def spec(self, **params: Any) -> PipelineSpec:
        """The pipeline specification, with ``params`` as the job's ``ctx.params``."""
        from privsched.spec import JobSpec, PipelineSpec

        job = JobSpec(function=self.function, params=params, pythonpath=self.pythonpath)
        return PipelineSpec.parse({**self.fields, "job": job}, source=self.function)

    def submit(self, **params: Any) -> Run:
        return self.client.submit(self.spec(**params))


class Client(BudgetReads):
    """A connection to one privsched database. Thread-compatible: use one per thread."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True) -> None:
        self.path = Path(path)
        self.runs = RunDirs(path)
        self._create = create
        self._pool: Pool | None = None

    @cached_property
    def ledger(self) -> Ledger:
        """The database, opened on first use: a module that connects at import time and
        defines pipeline functions can be imported by job processes (locally or on a cluster
        node) without touching the database."""
        from privsched.ledger.ledger import Ledger

        return Ledger(self.path, create=self._create)

    def close(self) -> None:
        if "ledger" in self.__dict__:
            self.ledger.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({str(self.path)!r})"

    def init(self) -> Path:
        """Create the database if it does not exist yet (an existing one is left as it
        is) and return its path."""
        return self.ledger.path

    # -- datasets and blocks ----------------------------------------------------------------

    def create_dataset(
        self,
        name: str,
        epsilon: float,
        delta: float,
        accounting: str = "rdp",
        alphas: Sequence[float] | None = None,
        conversion: str = "paper",
        *,
        actor: str | None = None,
        unit: str = "record",
        user_column: str | None = None,
        max_rows_per_user: int | None = None,
    ) -> DatasetInfo:
        """A dataset whose every block guarantees (ε_G, δ_G)-DP (docs/design.md §3.2) to its
        ``unit``: a record, or a person named by ``user_column`` (``user``: across the whole
        dataset; ``user-time``: in each period), every read holding at most
        ``max_rows_per_user`` rows of a person (docs/privacy.md "Units").
        ``actor`` (here and in every write): who the ledger records as causing it (default:
        the operator, :class:`~privsched.ledger.Ledger`)."""
        return self.ledger.create_dataset(
            name,
            epsilon,
            delta,
            accounting,
            alphas=alphas,
            conversion=conversion,
            actor=actor,
            unit=unit,
            user_column=user_column,
            max_rows_per_user=max_rows_per_user,
        )

    def datasets(self) -> list[DatasetInfo]:
        return self.ledger.list_datasets()

    def dataset(self, name: str) -> DatasetInfo:
        return self.ledger.get_dataset(name)

    def add_blocks(self, dataset: str, blocks: Iterable[BlockLike], *, unlocked: float = 0.0, actor: str | None = None) -> list[BlockInfo]:
        """Add blocks given as keys, ``(key, location)`` pairs, dicts or :class:`BlockSpec`,
        with ``unlocked`` × capacity unlocked at once."""
        return self.ledger.add_blocks(dataset, [block_spec(b) for b in blocks], unlocked_fraction=unlocked, actor=actor)

    def import_blocks(
        self,
        dataset: str,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        by: str | None = None,
        every: str | None = None,
        partitions: int | None = None,
        store: str | os.PathLike | None = None,
        bounds: Mapping[str, tuple[float, float]] | None = None,
        categories: Mapping[str, Sequence[str]] | None = None,
        unlocked: float = 0.0,
        actor: str | None = None,
    ) -> ImportReport:
        """Import a CSV, Parquet or JSON Lines file (or several, one transaction) into
        ``dataset``: one sealed Parquet block per value of column ``by``, or per ``every``
        day, week or month of it, in the block store (default ``<db>.blocks/``). ``bounds``
        and ``categories`` declare public column bounds and values at the first import
        (docs/design.md §9). A user-unit dataset's rows go to ``partitions`` user blocks
        (fixed at its first import; per period of ``by`` for ``user-time``), each person's
        always to the same one (:mod:`privsched.data.people`)."""
        from privsched.data.importer import import_blocks

        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        return import_blocks(
            self.ledger,
            dataset,
            paths,
            by=by,
            every=every,
            partitions=partitions,
            store=store,
            bounds=bounds,
            categories=categories,
            unlocked=unlocked,
            actor=actor,
        )

    def dataset_schema(self, dataset: str) -> DatasetSchema | None:
        """The dataset's columns, types and declared public bounds and categories (None until
        its first import)."""
        return self.ledger.dataset_schema(dataset)

    def blocks(self, dataset: str | None = None, *, active_only: bool = False) -> list[BlockInfo]:
        return self.ledger.list_blocks(dataset, active_only=active_only)

    def unlock(self, dataset: str, fraction: float, keys: Sequence[str] | None = None, *, actor: str | None = None) -> list[BlockInfo]:
        """Unlock ``fraction`` × capacity of the dataset's active blocks (only ``keys``, if
        given), capped at what each has locked; returns those blocks afterwards."""
        blocks = self.ledger.list_blocks(dataset, active_only=True)
        if keys is not None:
            unknown = sorted(set(keys) - {b.key for b in blocks})
            if unknown:
                raise LedgerError(f"no active block {unknown[0]!r} in dataset {dataset!r}")
            blocks = [b for b in blocks if b.key in set(keys)]
        self.ledger.unlock({b.id: fraction for b in blocks}, actor=actor)
        wanted = {b.key for b in blocks}
        return [b for b in self.ledger.list_blocks(dataset, active_only=True) if b.key in wanted]

    # -- pipelines --------------------------------------------------------------------------

    def pool(self) -> Pool:
        """The compute pool submissions are checked against: the one the scheduler last
        served with, else this machine's."""
        recorded = self.runs.recorded_pool()
        if recorded is not None:
            return recorded
        if self._pool is None:
            from privsched.service.resources import make_pool

            self._pool = make_pool()
        return self._pool

    def _spec(self, spec: SpecLike) -> PipelineSpec:
        from privsched.spec import PipelineSpec, load_spec

        if isinstance(spec, PipelineSpec):
            return spec
        if isinstance(spec, Mapping):
            return PipelineSpec.parse(dict(spec))
        return load_spec(os.fspath(spec))

    def _declared_bounds(self, spec: PipelineSpec) -> PipelineSpec:
        """A statistic without ``bounds`` on a column its dataset declared public bounds for
        takes those bounds (docs/design.md §9); any other spec is returned as it is."""
        params = spec.job.params
        if spec.job.kind != "statistic" or params.get("bounds") is not None or not isinstance(params.get("column"), str):
            return spec
        if params.get("query", "count") == "count":
            return spec
        try:
            schema = self.ledger.dataset_schema(spec.dataset)
        except LedgerError:  # an unknown dataset: refused, with its own message, when the request is built
            return spec
        if schema is None or params["column"] not in schema.bounds:
            return spec
        job = spec.job.model_copy(update={"params": {**params, "bounds": list(schema.bounds[params["column"]])}})
        return spec.model_copy(update={"job": job})

    def submit(
        self, spec: SpecLike, *, owner: str | None = None, claim: Callable[[list[int]], None] | None = None, actor: str | None = None
    ) -> Run:
        """Submit a pipeline (a :class:`PipelineSpec`, a mapping, or a YAML/JSON file).
        Invalid input raises ``ValueError`` with one line and records nothing."""
        return self.submit_many([spec], owner=owner, claim=claim, actor=actor)[0]

    def submit_many(
        self,
        specs: Iterable[SpecLike],
        *,
        owner: str | None = None,
        claim: Callable[[list[int]], None] | None = None,
        actor: str | None = None,
    ) -> list[Run]:
        """Submit several pipelines in one transaction: all are recorded, or none
        (``claim``: see :meth:`Ledger.submit_many`)."""
        from privsched.service import wakeup

        ids = self.ledger.submit_many(self.requests(specs, owner=owner), claim=claim, actor=actor)
        wakeup.notify(self.path)  # a scheduler of this process passes at once
        return [Run(self, i) for i in ids]

    def requests(self, specs: Iterable[SpecLike], *, owner: str | None = None) -> list[PipelineRequest]:
        """The ledger claims of ``specs`` (demands computed, compute checked, code jobs
        checked by their preflight once everything else passed), not yet recorded."""
        from privsched.service.submissions import build_request, checked_code

        parsed = [self._declared_bounds(self._spec(s)) for s in specs]
        datasets: dict[str, DatasetInfo] = {}
        blocks: dict[str, list[BlockInfo]] = {}
        pool = self.pool()

        def request(spec: PipelineSpec) -> PipelineRequest:
            return build_request(spec, datasets[spec.dataset], blocks.get(spec.dataset, []), pool, owner)

        requests = []
        for spec in parsed:
            if spec.dataset not in datasets:
                datasets[spec.dataset] = self.ledger.get_dataset(spec.dataset)
            if not isinstance(spec.blocks, list) and spec.dataset not in blocks:  # explicit keys need no listing
                blocks[spec.dataset] = self.ledger.list_blocks(spec.dataset)
            requests.append(request(spec))
        if any(spec.job.function for spec in parsed):  # the costly check last
            protected = self._protected()
            checked: dict[str, str | None] = {}
            requests = [request(checked_code(spec, protected, checked)) if spec.job.function else r for spec, r in zip(parsed, requests)]
        return [self._reused(r) if spec.reuse else r for spec, r in zip(parsed, requests)]

    def _reused(self, request: PipelineRequest) -> PipelineRequest:
        """``request`` naming the release it reuses (:mod:`privsched.service.reuse`), or as it is."""
        from privsched.service.reuse import with_reuse

        return with_reuse(self.ledger, request, self._released_metrics)

    def _released_metrics(self, pipeline_id: int) -> dict[str, Any] | None:
        """What pipeline ``pipeline_id``'s job reported (None when it wrote nothing)."""
        result = self.job_result(pipeline_id)
        return None if result is None else result.metrics

    def _protected(self) -> builtins.list[str]:
        """What a code job's paths must not overlap (:func:`privsched.service.preflight.protected_paths`)."""
        from privsched.service.preflight import protected_paths

        return protected_paths(self.path, self.runs.root, [b.location for b in self.ledger.list_blocks()])

    def dry_run(self, spec: SpecLike, *, owner: str | None = None, team: str | None = None) -> DryRun:
        """What submitting ``spec`` would claim and whether it would be granted: fits now,
        waits (and why) or can never fit, weighing ``team``'s quota (the submitter's team, if
        any), and the release it would reuse or the cached releases that would answer it (or
        lower its charge); writes nothing (:mod:`privsched.service.dryrun`)."""
        from privsched.ledger.reuse import ANSWERED_FROM_CACHE
        from privsched.service.cache import with_cached_answer
        from privsched.service.dryrun import dry_run
        from privsched.service.reuse import reusable_source
        from privsched.service.submissions import build_request, checked_code, ranks

        parsed = self._declared_bounds(self._spec(spec))
        dataset = self.ledger.get_dataset(parsed.dataset)
        blocks = self.ledger.list_blocks(parsed.dataset)
        compute = self.pool().refusal(parsed.resources, ranks(parsed))
        build_request(parsed, dataset, blocks, None, owner)  # its own errors before the costly check
        request = build_request(checked_code(parsed, self._protected()), dataset, blocks, None, owner)
        quota = None if team is None else self._quota(dataset, blocks, team)
        source = reusable_source(self.ledger, request) if parsed.reuse and compute is None else None
        if source is not None:
            plan = dry_run(request, dataset, blocks, quota=quota, compute=compute)
            return dataclasses.replace(plan, verdict="fits now", reason=None, reuses=source.id)
        if parsed.reuse and compute is None:  # answered from the cache, or charged less for it
            request = with_cached_answer(self.ledger, request, self._released_metrics)
        plan = dry_run(request, dataset, blocks, quota=quota, compute=compute)
        answer = request.job.get(ANSWERED_FROM_CACHE)
        if answer is None:
            return plan
        return dataclasses.replace(plan, verdict="fits now", reason=None, answered_from_cache=answer["sources"])

    def quota_usage(self, dataset: str | None = None, *, team: str | None = None) -> builtins.list[QuotaUsage]:
        """Every team quota (on ``dataset`` only, of ``team`` only, when given) with what the
        team holds and has consumed, each as the largest share of a block's capacity."""
        infos = [self.dataset(dataset)] if dataset is not None else self.datasets()
        found = []
        for info in infos:
            with self._identities() as identities:
                shares = identities.quotas(info.id)
            blocks = self.blocks(info.name)
            for name, share in shares.items():
                quota = self._quota(info, blocks, name) if team in (None, name) else None
                if quota is not None:
                    held, consumed = ([demand_share(v, info) for v in part.values()] for part in (quota.held, quota.consumed))
                    found.append(QuotaUsage(info.name, name, share, max(held, default=0.0), max(consumed, default=0.0)))
        return found

    def _quota(self, dataset: DatasetInfo, blocks: builtins.list[BlockInfo], team: str) -> Any:
        """``team``'s :class:`~privsched.service.dryrun.Quota` on ``dataset``, or None without one."""
        import numpy as np

        from privsched.budgets.exact import value
        from privsched.ledger.connection import open_database
        from privsched.ledger.quotas import QuotaCheck
        from privsched.service.dryrun import Quota

        keys = {b.id: b.key for b in blocks}
        db = open_database(self.path, create=False)  # its own connection, as reasons() takes
        try:
            check = QuotaCheck.load(db)
            if check is None or (dataset.id, team) not in check.shares:
                return None
            held = {keys[b]: value(np.asarray(q)) for b, q in check.held(dataset.id, team).items() if b in keys}  # quanta to budget
            consumed = {keys[b]: v for b, v in check.consumed(dataset.id, team).items() if b in keys}
            return Quota(team, check.shares[(dataset.id, team)], held, consumed)  # type: ignore[arg-type]
        finally:
            db.close()

    def pipeline(
        self,
        *,
        dataset: str,
        blocks: BlockSelector,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: Mapping[str, Any] | None = None,
        name: str | None = None,
        gpus: int = 0,
        cpus: float = 1.0,
        memory: int | str = 0,
        timeout: float | str | None = None,
        max_runtime: float | str | None = None,
        weight: float = 1.0,
        owner: str | None = None,
    ) -> Callable[[Callable], PipelineFunction]:
        """Decorate a job function ``fn(ctx)`` as a pipeline (see the module docstring)."""

        from privsched.spec import Resources

        def decorate(fn: Callable) -> PipelineFunction:
            fields = {
                "name": name or getattr(fn, "__name__", "pipeline"),
                "dataset": dataset,
                "blocks": blocks,
                "epsilon": epsilon,
                "delta": delta,
                "mechanism": dict(mechanism) if mechanism is not None else None,
                "resources": Resources.model_validate({"gpus": gpus, "cpus": cpus, "memory": memory}),
                "timeout": timeout,
                "max_runtime": max_runtime,
                "weight": weight,
                "owner": owner,
            }
            pipeline = PipelineFunction(self, fn, {k: v for k, v in fields.items() if v is not None})
            pipeline.spec()  # validate now, not at the first submission
            return pipeline

        return decorate

    def run(self, pipeline_id: int) -> Run:
        """A handle on an existing pipeline (``LedgerError`` if there is none)."""
        self.ledger.get_pipeline(pipeline_id)
        return Run(self, pipeline_id)

    def list(
        self,
        states: Iterable[str] | None = None,
        dataset: str | None = None,
        *,
        owner: str | None = None,
        mine: bool = False,
        limit: int | None = None,
    ) -> list[PipelineInfo]:
        """Pipelines, oldest first: only those in ``states``, on ``dataset``, of ``owner`` (or
        with ``mine`` of this machine's user, the local submitter), the ``limit`` most recent."""
        found = self.ledger.list_pipelines(states=states, dataset=dataset)
        return filter_pipelines(found, owner=getpass.getuser() if mine else owner, limit=limit)

    def status(self, pipeline_id: int) -> PipelineInfo:
        return self.ledger.get_pipeline(pipeline_id)

    def wait_for_change(self, pipeline_id: int, since: str, seconds: float = 25.0, *, poll: float = 0.01) -> PipelineInfo:
        """The pipeline once its state is no longer ``since`` (at once if it has ended), or
        after ``seconds`` with its state then; the remote client's request of the same name
        waits at the server, this one reads the ledger every ``poll`` seconds."""
        deadline = time.monotonic() + seconds
        info = self.status(pipeline_id)
        while info.state == since and not info.state.is_final() and time.monotonic() < deadline:
            time.sleep(poll)
            info = self.status(pipeline_id)
        return info

    def cancel(self, pipeline_id: int, *, actor: str | None = None) -> Literal["cancelled", "cancelling"]:
        """Cancel a pipeline. Pending or granted: cancelled now (a grant is released).
        Running: the request is recorded (a ``stop`` event), then the scheduler stops the job
        and fails the pipeline, both in ``actor``'s name (its allocation is consumed: the job
        may have touched data); returns ``"cancelling"``. Finished or unknown: ``LedgerError``."""
        info = self.ledger.get_pipeline(pipeline_id)
        if info.state is PipelineState.RUNNING:
            return self._stop(pipeline_id, actor)
        if info.state.is_final():
            raise LedgerError(f"pipeline {pipeline_id} has already ended ({info.state})")
        try:
            self.ledger.cancel(pipeline_id, actor=actor)
        except LedgerError:
            if self.ledger.get_pipeline(pipeline_id).state is not PipelineState.RUNNING:
                raise
            return self._stop(pipeline_id, actor)  # started meanwhile
        return "cancelled"

    def _stop(self, pipeline_id: int, actor: str | None) -> Literal["cancelling"]:
        """Ask the scheduler to stop a running job: the request in the ledger first (who asked;
        refused if the job has ended meanwhile), then the scheduler's cue in the runs folder."""
        try:
            self.ledger.request_stop(pipeline_id, actor=actor)
        except LedgerError:
            state = self.ledger.get_pipeline(pipeline_id).state
            if state.is_final():
                raise LedgerError(f"pipeline {pipeline_id} has already ended ({state})") from None
            raise
        self.runs.request_cancel(pipeline_id)
        return "cancelling"

    def job_result(self, pipeline_id: int) -> JobResult | None:
        """What the job's supervisor wrote of how it ended (None before it has, or when it
        wrote nothing)."""
        from privsched.jobs.runner import JobResult

        try:
            return JobResult.from_json(self.runs.result(pipeline_id).read_text())
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def result(self, pipeline_id: int) -> PipelineResult:
        """What a pipeline released (its job's metrics and primitives' values), its charge per
        block as ε at the dataset's δ_G, its state and reason, and its artifacts (listed once
        it has ended); a statistic that ran as a cache update answers its own release combined
        with the cached ones (:func:`privsched.service.cache.combined_answer`; its own is
        ``release``). The local operator reads every pipeline's."""
        from privsched.results import pipeline_result

        info = self.status(pipeline_id)
        ran = self.ran_by(info)
        artifacts = self.runs.artifacts(ran) if info.state.is_final() else []
        result = pipeline_result(info, self.dataset(info.dataset), self.job_result(ran), artifacts, info.message)
        return dataclasses.replace(result, metrics=self.combined_metrics(info, result.metrics))

    def combined_metrics(self, info: PipelineInfo, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` (what ``info``'s job released), with the answer of a statistic that ran
        as a cache update: its release (``release``) combined with the cached ones it names
        (:func:`privsched.service.cache.combined_answer`); other pipelines' as they are."""
        from privsched.service.cache import combined_answer

        combined = combined_answer(self.ledger, info, self._released_metrics)
        if combined is None:
            return metrics
        sources = combined.pop("sources")
        return metrics | combined | {"release": metrics.get("value"), "combined_with": sources}

    @staticmethod
    def ran_by(info: PipelineInfo) -> int:
        """The pipeline whose job made ``info``'s release: the one it reuses, else itself."""
        from privsched.ledger.reuse import REUSED_FROM

        source = info.job.get(REUSED_FROM)
        return int(source) if source is not None else info.id

    def open_artifact(self, pipeline_id: int, name: str) -> tuple[BinaryIO, int]:
        """A file an ended pipeline's job left in its work folder, open for reading, and its
        size (:meth:`~privsched.service.rundirs.RunDirs.open_artifact` says which are refused)."""
        from privsched.errors import NotFound

        info = self.status(pipeline_id)
        if not info.state.is_final():
            raise NotFound(f"pipeline {pipeline_id} has not ended: its artifacts are not ready")
        return self.runs.open_artifact(self.ran_by(info), name)

    def download(self, pipeline_id: int, out: str | os.PathLike, names: Sequence[str] | None = None) -> builtins.list[Path]:
        """Copy an ended pipeline's artifacts (all, or ``names``) into the folder ``out``,
        each under its name there; returns the files written."""
        from privsched.results import save_artifact

        wanted = [a.name for a in self.result(pipeline_id).artifacts] if names is None else builtins.list(names)
        written = []
        for name in wanted:
            stream, _ = self.open_artifact(pipeline_id, name)
            with stream:
                written.append(save_artifact(Path(out), name, iter(lambda: stream.read(1 << 20), b"")))
        return written

    def log_path(self, pipeline_id: int) -> Path:
        self.ledger.get_pipeline(pipeline_id)
        return self.runs.log(pipeline_id)

    def logs(self, pipeline_id: int) -> str:
        """The job's output so far (empty before it starts)."""
        path = self.log_path(pipeline_id)
        return path.read_text(errors="replace") if path.exists() else ""

    def reasons(self, dataset: str | None = None, policy: Any = None, *, pipeline_id: int | None = None) -> dict[int, WaitingReason]:
        """Why each pending or granted pipeline (of ``dataset``, else of every dataset) waits
        (:mod:`privsched.service.waiting`); with ``pipeline_id``, why that one waits (ranked
        among all, the others' reasons not computed). ``policy``: the serving
        :class:`~privsched.policies.base.PolicySpec` (or just its ranking
        :class:`~privsched.policies.base.Policy`); by default the policy the last scheduler
        recorded, else arrival order and no unlock estimate."""
        from privsched.ledger.connection import open_database
        from privsched.ledger.quotas import QuotaCheck
        from privsched.service.waiting import compute_reasons, waiting_reasons

        ranking, rule = self._serving_policy(policy)
        now = time.time()
        reserved = self.runs.recorded_reservations()  # round robin's, if it serves
        found: dict[int, WaitingReason] = {}
        db = open_database(self.path, create=False)  # its own connection: the ledger's may serve other threads
        try:
            quotas = QuotaCheck.load(db)
            for name in [dataset] if dataset is not None else [d.name for d in self.datasets()]:
                view = self.ledger.pending_view(name)
                if not len(view.pipelines.pipeline_ids):
                    continue
                info = self.ledger.get_dataset(name)
                blocks = self.ledger.list_blocks(name)
                keys = {b.id: b.key for b in blocks}
                quota = None if quotas is None else (lambda p, b, d, c, i=info: quotas.refusal(p, i.id, b, d, c, i.accounting))
                unlock = None if rule is None else self._unlock_state(name, view, blocks, rule, now)
                waiting = waiting_reasons(view, keys, ranking, quota=quota, unlock=unlock, reserved=reserved, only=pipeline_id)
                found.update((r.pipeline_id, r) for r in waiting)
        finally:
            db.close()
        granted = self.ledger.list_pipelines(states=["granted"])
        if granted:
            reasons = compute_reasons(granted, self.ledger.list_pipelines(states=["running"]), self.pool())
            mine = {info.id for info in granted if (dataset is None or info.dataset == dataset) and pipeline_id in (None, info.id)}
            found.update((r.pipeline_id, r) for r in reasons if r.pipeline_id in mine)
        return found

    def _serving_policy(self, policy: Any) -> tuple[Any, Any]:
        """The ranking policy and unlock rule of ``policy`` (a PolicySpec, a Policy, or None:
        the recorded one)."""
        spec = policy if hasattr(policy, "unlock") and hasattr(policy, "policy") else None
        if spec is None:
            recorded = self.runs.recorded_policy()
            if recorded is not None:
                from privsched.policies import make_policy

                try:
                    spec = make_policy(recorded[0], **recorded[1])
                except (TypeError, ValueError):  # not a record this version wrote
                    spec = None
        if spec is None:
            return policy, None
        return (spec.policy if policy is None or policy is spec else policy), spec.unlock

    def _unlock_state(self, dataset: str, view: Any, blocks: builtins.list[BlockInfo], rule: Any, now: float) -> Any:
        """What ``rule`` will still release on the view's blocks (:class:`~privsched.service.waiting.UnlockState`)."""
        import numpy as np

        from privsched.service.waiting import UnlockState

        by_id = {b.id: b for b in blocks}
        rows = [by_id[int(i)] for i in view.block_ids.tolist()]
        arrivals = np.zeros(len(rows))
        if rule.on_pipeline_arrival() > 0:  # the scheduler counts every pipeline that ever asked for a block
            asked: dict[str, int] = {}
            for info in self.ledger.list_pipelines(dataset=dataset):
                for key in info.block_keys:
                    asked[key] = asked.get(key, 0) + 1
            arrivals = np.array([asked.get(b.key, 0) for b in rows], dtype=float)
        return UnlockState(
            rule=rule,
            locked=np.array([b.locked for b in rows]).reshape(view.capacity.shape),
            created=np.array([b.created_at for b in rows]),
            arrivals=arrivals,
            now=now,
        )

    def log_chunk(self, pipeline_id: int, offset: int = 0, limit: int | None = None) -> tuple[bytes, bool]:
        """The job's output from byte ``offset`` on (at most ``limit`` bytes), and whether
        the pipeline had ended before it was read (so nothing more will come)."""
        ended = self.status(pipeline_id).state.is_final()
        path = self.runs.log(pipeline_id)
        if not path.exists():
            return b"", ended
        with open(path, "rb") as log:
            log.seek(offset)
            return log.read(-1 if limit is None else limit), ended

    def scheduler(self) -> str | None:
        """Who holds the scheduler lease of this database, if anyone."""
        holder = self.ledger.lease_holder()
        return None if holder is None else str(holder.get("holder"))

    def scheduler_condition(self) -> str | None:
        """What keeps the serving scheduler from making progress, as it reported it (e.g.
        "storage full since …: database or disk is full"; it retries every tick), or None.
        Read from the runs folder, not the ledger, so that it can be read while the ledger
        cannot be written (docs/recovery.md)."""
        return self.runs.read_condition()

    def scheduler_job_starts(self) -> str | None:
        """How the serving scheduler starts jobs, as it last recorded it: "warm" (forked from
        its fork server), "cold: " and why, or None (no scheduler serving, or an executor with
        one way only). Read from the runs folder."""
        return self.runs.read_job_starts()

    def audit(self, expect: str | None = None) -> AuditReport:
        """:meth:`Ledger.audit <privsched.ledger.Ledger.audit>`: the hash chain, every table
        rebuilt from the event log, every invariant (``expect``: a chain head kept earlier)."""
        return self.ledger.audit(expect=expect)

    def events(self, *, dataset: str | None = None, pipeline_id: int | None = None) -> builtins.list[Event]:
        """The ledger's event log, oldest first: all of it, one dataset's or one pipeline's."""
        found = self.ledger.events(pipeline_id=pipeline_id)
        if dataset is None:
            return found
        dataset_id = self.ledger.get_dataset(dataset).id
        return [event for event in found if event.dataset_id == dataset_id]

    # -- users and quotas -------------------------------------------------------------------

    def _identities(self) -> Identities:
        from privsched.ledger.identities import Identities

        return Identities(self.path)

    def add_user(self, name: str, role: str, team: str | None = None, *, code: bool = False) -> str:
        """Create a user of the HTTP API and return its bearer token (shown only this once);
        ``code``: a submitter that may submit code jobs (``function:``)."""
        with self._identities() as identities:
            return identities.add_user(name, role, team, code=code)

    def users(self) -> builtins.list[dict[str, Any]]:
        """Every user: name, role, team, created_at, revoked_at (None while valid) and code
        (whether it may submit code jobs)."""
        with self._identities() as identities:
            return [vars(user) for user in identities.users()]

    def revoke_user(self, name: str) -> None:
        """Revoke a user's token: every request with it is refused from now on."""
        with self._identities() as identities:
            identities.revoke(name)

    def set_code_rights(self, name: str, allowed: bool) -> dict[str, Any]:
        """Allow a submitter to submit code jobs, or deny it again (recorded in the user
        changes); returns the user afterwards."""
        with self._identities() as identities:
            return vars(identities.set_code(name, allowed))

    def set_quota(self, dataset: str, team: str, share: float | None) -> dict[str, float]:
        """Cap what ``team`` may hold (allocated plus consumed) on each block of ``dataset``
        at ``share`` × capacity (None lifts it); returns the dataset's quotas, team → share."""
        dataset_id = self.ledger.get_dataset(dataset).id
        with self._identities() as identities:
            identities.set_quota(dataset_id, team, share)
            return identities.quotas(dataset_id)

    # -- scheduling in-process --------------------------------------------------------------

    def serve(
        self,
        options: ServeOptions | str = "fcfs",
        *,
        stop: threading.Event | None = None,
        log: Callable[[str], None] | None = None,
        on_start: Callable[[Startup], None] | None = None,
        **fields: Any,
    ) -> ServeSummary:
        """Run a scheduler on this database in this process (what ``privsched serve`` does).

        ``options``: a :class:`~privsched.service.serve.ServeOptions`, or a policy name with
        the other options as keywords (``n``, ``lifetime``, ``tick``, ``until_idle``,
        ``gpus``/``cpus``/``memory`` declaring the pool, default this machine's; ``sandbox``
        confining jobs, ``landlock`` by default or ``none``: see ``docs/sandbox.md``;
        ``allow_network`` letting jobs that ask for it keep TCP access). Returns a :class:`~privsched.service.serve.ServeSummary`
        when ``stop`` is set or, with ``until_idle``, when nothing more can happen without
        new submissions. ``on_start`` is given the :class:`~privsched.service.serve.Startup`
        once the scheduler holds the database (a second scheduler fails before it)."""
        from privsched.service.serve import ServeOptions, serve_with

        if isinstance(options, str):
            options = ServeOptions.parse(policy=options, **fields)
        elif fields:
            raise TypeError("give the serve options either as ServeOptions or as keywords, not both")
        return serve_with(self.path, options, stop=stop, log=log, on_start=on_start)

    def run_until_idle(self, policy: str = "fcfs", **options: Any) -> ServeSummary:
        """Serve until every pipeline that can progress has ended (notebooks, tests)."""
        return self.serve(policy, until_idle=True, **options)


def filter_pipelines(pipelines: list[PipelineInfo], *, owner: str | None = None, limit: int | None = None) -> list[PipelineInfo]:
    """``pipelines`` (oldest first) of ``owner`` only, and the ``limit`` most recent of them."""
    if limit is not None and limit < 1:
        raise LedgerError(f"limit must be a positive number of pipelines, got {limit}")
    kept = [p for p in pipelines if owner is None or p.owner == owner]
    return kept if limit is None else kept[-limit:]

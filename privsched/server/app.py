"""The HTTP API over one ledger file: every client operation, behind bearer tokens and roles.

Routes call the same :class:`privsched.client.Client` methods as the command line; the
only logic here is who may do what (:mod:`privsched.server.access`). Every error is one
JSON line ``{"error": "..."}`` with a 4xx status, and a refused request changes nothing.
The OpenAPI schema is at ``/openapi.json``; FastAPI's page at ``/docs`` is off (it loads scripts
from a CDN), and every response carries :mod:`privsched.server.headers`.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from dataclasses import asdict
from typing import Annotated, Any, BinaryIO

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from privsched.client import Client, filter_pipelines
from privsched.data.store import BlockStore, default_store
from privsched.data.tables import FORMATS, parse_declarations
from privsched.errors import BadInput
from privsched.server.dashboard import dashboard_router
from privsched.server.headers import SecurityHeaders
from privsched.ledger.errors import one_line
from privsched.ledger.identities import DuplicateSubmission, Identities, Submission, User
from privsched.server import access
from privsched.server.access import ApiError
from privsched.server.batching import SubmitBatcher
from privsched.server.connections import ConnectionPool, Reads
from privsched.server.limits import BodyLimit
from privsched.server.views import Views
from privsched.server.watching import MAX_WAIT, StateChanges
from privsched.service import wakeup
from privsched.ledger import PipelineInfo
from privsched.ledger.states import PipelineState
from privsched.server.models import (
    MAX_BODY,
    MAX_UPLOAD,
    UPLOAD_SUFFIX,
    AuditOut,
    BlockOut,
    BlocksIn,
    CancelOut,
    CodeIn,
    DatasetIn,
    DatasetOut,
    ImportOut,
    BudgetOut,
    DryRunOut,
    QuotaUsageOut,
    ErrorOut,
    EventOut,
    LogsOut,
    PipelineOut,
    QuotaIn,
    QuotaOut,
    ResultOut,
    SchedulerOut,
    SubmitIn,
    TokenOut,
    UnlockIn,
    UserIn,
    UserOut,
    WaitingOut,
)
from privsched.spec import PipelineSpec

#: The most bytes of a job log one request returns.
LOG_CHUNK = 1 << 20


def reply(content: Any, status: int = 200) -> Response:
    """JSON with infinities written as ``Infinity`` (RDP curves may hold them). Models (and
    lists of them) are written by pydantic's serialiser, which skips the Python dictionaries
    of ``model_dump`` and ``json.dumps``; other values by ``json``."""
    if isinstance(content, BaseModel):
        body = content.model_dump_json()
    elif isinstance(content, list) and all(isinstance(v, BaseModel) for v in content):
        body = "[" + ",".join(v.model_dump_json() for v in content) + "]"
    else:
        body = json.dumps(content, allow_nan=True)
    return Response(body, status_code=status, media_type="application/json")


async def current_user(request: Request) -> User:
    """The caller, from its bearer token (401 without a live one). Looked up on the event
    loop, on a connection only the loop uses: one indexed read (the token's SHA-256) costs
    less than the hop to a worker thread that a synchronous dependency takes, and a WAL
    reader never waits for a writer. Nothing is cached: a revoked token is refused on its
    next request."""
    return access.authenticate(request.app.state.tokens, request.headers.get("authorization"))


#: A route parameter that authenticates the caller.
Caller = Annotated[User, Depends(current_user)]


def create_app(path: str | os.PathLike, policy: Any = None) -> FastAPI:
    """The API of the privsched database at ``path`` (which must exist); ``policy`` (the
    serving scheduler's :class:`~privsched.policies.base.PolicySpec`, or its ranking policy)
    ranks pending pipelines in waiting reasons and gives their unlock estimates."""
    client = Client(path, create=False)
    client.ledger  # noqa: B018 -- open now: a missing database fails at start, not at the first request
    identities = Identities(path)
    tokens = Identities(path)  # the event loop's own connection (current_user)
    batcher = SubmitBatcher(client.ledger)
    connections = ConnectionPool(path)  # the pipeline routes' reads, one connection per request

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.changes = StateChanges(path)
        yield
        app.state.changes.close()
        batcher.close()
        connections.close()
        tokens.close()
        identities.close()
        client.close()

    app = FastAPI(
        title="privsched",
        summary="Privacy-budget-aware job scheduler: the HTTP API",
        lifespan=lifespan,
        responses={code: {"model": ErrorOut} for code in (400, 401, 403, 404, 413, 422)},
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(BodyLimit, limit=MAX_BODY, upload_limit=MAX_UPLOAD, upload_suffix=UPLOAD_SUFFIX)
    app.add_middleware(SecurityHeaders)  # added last: outermost, so its headers reach every response
    app.state.client, app.state.identities, app.state.tokens = client, identities, tokens
    _errors(app)
    app.include_router(dashboard_router(client, identities, current_user, policy))

    views = Views(client, identities)

    def resubmitted(reads: Reads, pipeline_id: int, submission_id: str | None, caller: User) -> Response:
        access.check_same_submitter(caller, reads.identities.submissions([pipeline_id]).get(pipeline_id), submission_id)
        return reply(reads.views.pipeline_out(reads.client.status(pipeline_id), caller))

    # -- datasets and blocks ------------------------------------------------------------------
    @app.get("/v1/datasets", response_model=list[DatasetOut], tags=["datasets"])
    def list_datasets(caller: Caller) -> Response:
        return reply([DatasetOut.of(d, identities.dataset_teams(d.id)) for d in client.datasets() if identities.may_read(caller, d.id)])

    @app.post("/v1/datasets", response_model=DatasetOut, status_code=201, tags=["datasets"])
    def create_dataset(body: DatasetIn, caller: Caller) -> Response:
        access.require_admin(caller, "create a dataset")
        for team in body.teams:  # check before writing: nothing is created on bad input
            access.check_team(team)
        info = client.create_dataset(
            body.name,
            body.epsilon,
            body.delta,
            body.accounting,
            body.alphas,
            body.conversion,
            actor=caller.name,
            unit=body.unit,
            user_column=body.user_column,
            max_rows_per_user=body.max_rows_per_user,
        )
        if body.teams:
            identities.restrict(info.id, body.teams)
        return reply(DatasetOut.of(info, identities.dataset_teams(info.id)), 201)

    @app.get("/v1/datasets/{name}", response_model=DatasetOut, tags=["datasets"])
    def get_dataset(name: str, caller: Caller) -> Response:
        return reply(views.dataset(name, caller))

    @app.get("/v1/blocks", response_model=list[BlockOut], tags=["datasets"])
    def list_blocks(caller: Caller, dataset: str | None = None, active_only: bool = False) -> Response:
        if dataset is not None:
            access.readable_dataset(client, identities, caller, dataset)
        readable = {d.name for d in client.datasets() if identities.may_read(caller, d.id)}
        return reply([BlockOut.of(b, caller.is_admin) for b in client.blocks(dataset, active_only=active_only) if b.dataset in readable])

    @app.post("/v1/datasets/{name}/blocks", response_model=list[BlockOut], status_code=201, tags=["datasets"])
    def add_blocks(name: str, body: BlocksIn, caller: Caller) -> Response:
        access.require_admin(caller, "add blocks")
        added = client.add_blocks(name, [(b.key, b.location) for b in body.blocks], unlocked=body.unlocked, actor=caller.name)
        return reply([BlockOut.of(b, caller.is_admin) for b in added], 201)

    @app.post("/v1/datasets/{name}/import", response_model=ImportOut, status_code=201, tags=["datasets"])
    async def import_blocks(
        name: str,
        request: Request,
        caller: Caller,
        by: str | None = None,
        every: str | None = None,
        partitions: int | None = None,
        format: str = "csv",
        bounds: Annotated[list[str], Query()] = [],  # noqa: B006 -- FastAPI copies the default
        categories: Annotated[list[str], Query()] = [],  # noqa: B006
        unlocked: float = 0.0,
    ) -> Response:
        """Import the table in the request body (``format``: csv, parquet or json, for JSON
        Lines) as blocks keyed by column ``by`` (in ``partitions`` user blocks for a user-unit
        dataset), as ``privsched blocks import`` does (administrators)."""
        access.require_admin(caller, "import blocks")
        suffix = next((ending for ending, kind in FORMATS.items() if kind == format), None)
        if suffix is None:
            raise BadInput(f"format must be one of {', '.join(sorted(set(FORMATS.values())))}, got {format!r}")
        store = BlockStore(default_store(client.path))
        with store.incoming() as staging:
            table = staging / f"upload{suffix}"
            with open(table, "wb") as handle:
                async for chunk in request.stream():
                    handle.write(chunk)
            declared_bounds, declared_categories = parse_declarations(bounds, categories)
            report = await run_in_threadpool(
                partial(client.import_blocks, bounds=declared_bounds, categories=declared_categories),
                name,
                table,
                by=by,
                every=every,
                partitions=partitions,
                unlocked=unlocked,
                actor=caller.name,
            )
        return reply(ImportOut.of(report), 201)

    @app.post("/v1/datasets/{name}/unlock", response_model=list[BlockOut], tags=["datasets"])
    def unlock(name: str, body: UnlockIn, caller: Caller) -> Response:
        access.require_admin(caller, "release budget")
        return reply([BlockOut.of(b) for b in client.unlock(name, body.fraction, body.keys, actor=caller.name)])

    @app.put("/v1/datasets/{name}/quotas/{team}", response_model=QuotaOut, tags=["datasets"])
    def set_quota(name: str, team: str, body: QuotaIn, caller: Caller) -> Response:
        """Cap the share of each block's capacity ``team`` may hold on the dataset (null lifts it)."""
        access.require_admin(caller, "set quotas")
        info = access.readable_dataset(client, identities, caller, name)
        identities.set_quota(info.id, team, body.share)
        return reply(QuotaOut(dataset=name, quotas=identities.quotas(info.id)))

    # -- pipelines ----------------------------------------------------------------------------
    @app.get("/v1/budget", response_model=list[BudgetOut], tags=["datasets"])
    def budget(caller: Caller, dataset: str | None = None, detail: bool = False) -> Response:
        """Each block's budget in people's terms, per dataset the caller may read: the shares
        of its capacity consumed, allocated and left (they add up to 1) and ε at δ_G; with
        ``detail`` its budget vectors too."""
        if dataset is not None:
            access.readable_dataset(client, identities, caller, dataset)
        found = [b for b in client.balances(dataset) if identities.may_read(caller, b.dataset.id)]
        return reply([BudgetOut.of(b, detail=detail, teams=identities.dataset_teams(b.dataset.id)) for b in found])

    @app.get("/v1/quotas", response_model=list[QuotaUsageOut], tags=["datasets"])
    def list_quotas(caller: Caller, dataset: str | None = None) -> Response:
        """Team quotas on the datasets the caller may read, with what each team holds and
        consumed; a caller who is not an admin sees only its own team's."""
        if dataset is not None:
            access.readable_dataset(client, identities, caller, dataset)
        readable = {d.name for d in client.datasets() if identities.may_read(caller, d.id)}
        found = (
            client.quota_usage(dataset) if caller.is_admin else [] if caller.team is None else client.quota_usage(dataset, team=caller.team)
        )
        return reply([QuotaUsageOut(**vars(q)) for q in found if q.dataset in readable])

    @app.post("/v1/pipelines", response_model=PipelineOut, status_code=201, tags=["pipelines"])
    def submit(body: SubmitIn, caller: Caller) -> Response:
        """Submit a pipeline. With an ``id`` already used, the pipeline it names is returned
        (status 200) and nothing is written. In a worker thread: its reads and its wait for
        the submission writer's commit release the interpreter lock to the other requests
        (on the event loop they would hold up every request; benchmarks/README.md)."""
        access.require_submitter(caller)
        spec = PipelineSpec.parse(body.spec, source="pipeline")
        access.require_code_rights(caller, spec.job)
        with connections.reads() as reads:
            access.readable_dataset(reads.client, reads.identities, caller, spec.dataset)
            if body.id is not None:
                access.check_submission_id(body.id)
                if (existing := reads.identities.submission(body.id)) is not None:
                    return resubmitted(reads, existing, body.id, caller)
            if not caller.is_admin:
                spec = spec.model_copy(update={"owner": caller.name})
            (request,) = reads.client.requests([spec], owner=caller.name)
        try:  # no connection held while the writer commits
            pipeline_id = batcher.enqueue(request, caller, body.id).result()
        except DuplicateSubmission as exc:  # a concurrent request with the same id won
            with connections.reads() as reads:
                return resubmitted(reads, exc.pipeline_id, body.id, caller)
        with connections.reads() as reads:
            info = reads.client.status(pipeline_id)
        # The writer recorded the caller's team with the pipeline (Identities.claim): no read for it.
        submission = Submission(pipeline_id, caller.name, caller.team, body.id)
        return reply(PipelineOut.of(info, caller.team, access.visible_message(info, caller, submission)), 201)

    @app.post("/v1/pipelines/dry-run", response_model=DryRunOut, tags=["pipelines"])
    def dry_run(body: SubmitIn, caller: Caller) -> Response:
        """The demand a submission would be charged, whether it fits each block now, and the
        verdict: fits now, waits (and why) or can never fit, under the caller's team quota; writes nothing."""
        access.require_submitter(caller)
        spec = PipelineSpec.parse(body.spec, source="pipeline")
        access.require_code_rights(caller, spec.job)
        with connections.reads() as reads:
            access.readable_dataset(reads.client, reads.identities, caller, spec.dataset)
            return reply(DryRunOut.model_validate(asdict(reads.client.dry_run(spec, owner=caller.name, team=caller.team))))

    @app.get("/v1/pipelines", response_model=list[PipelineOut], tags=["pipelines"])
    def list_pipelines(
        caller: Caller,
        state: Annotated[list[str] | None, Query()] = None,
        dataset: str | None = None,
        owner: Annotated[str | None, Query(description="only this user's pipelines")] = None,
        mine: Annotated[bool, Query(description="only the caller's own pipelines")] = False,
        limit: Annotated[int | None, Query(ge=1, description="only the most recent ones")] = None,
    ) -> Response:
        if dataset is not None:
            access.readable_dataset(client, identities, caller, dataset)
        readable = {d.name for d in client.datasets() if identities.may_read(caller, d.id)}
        listed = [p for p in client.list(states=state, dataset=dataset) if p.dataset in readable]
        infos = filter_pipelines(listed, owner=caller.name if mine else owner, limit=limit)
        teams = identities.submissions([p.id for p in infos])
        out = []
        for p in infos:
            submission = teams.get(p.id)
            out.append(PipelineOut.of(p, submission.team if submission else None, access.visible_message(p, caller, submission)))
        return reply(out)

    @app.get("/v1/pipelines/{pipeline_id}", response_model=PipelineOut, tags=["pipelines"])
    async def status(
        pipeline_id: int,
        caller: Caller,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT, description="seconds to wait for a change of state")] = 0.0,
        since: Annotated[PipelineState | None, Query(description="the state to wait out (default: the current one)")] = None,
    ) -> Response:
        """A pipeline. With ``wait``: answered once its state is no longer ``since`` (at
        once if it has ended), or after ``wait`` seconds (:mod:`privsched.server.watching`).
        Each read runs in a worker thread, as a synchronous route's would (SQLite on the
        event loop would hold up every request), and a waiting request holds none between
        its reads."""
        if wait == 0:
            return reply(await run_in_threadpool(read_status, pipeline_id, caller))
        info = await run_in_threadpool(read_pipeline, pipeline_id, caller)
        before = since or info.state

        def moved(found: tuple[PipelineInfo, PipelineOut]) -> bool:
            return found[0].state != before or found[0].state.is_final()

        _, out = await app.state.changes.until(pipeline_id, lambda: run_in_threadpool(read_answer, pipeline_id, caller), moved, wait)
        return reply(out)

    def read_status(pipeline_id: int, caller: User) -> PipelineOut:
        with connections.reads() as reads:
            return reads.views.status(pipeline_id, caller)

    def read_pipeline(pipeline_id: int, caller: User) -> PipelineInfo:
        with connections.reads() as reads:
            return reads.views.pipeline(pipeline_id, caller)

    def read_answer(pipeline_id: int, caller: User) -> tuple[PipelineInfo, PipelineOut]:
        """A waiting request's look: the pipeline and its answer, in one worker-thread hop."""
        with connections.reads() as reads:
            info = reads.client.status(pipeline_id)
            return info, reads.views.pipeline_out(info, caller)

    @app.post("/v1/pipelines/{pipeline_id}/cancel", response_model=CancelOut, tags=["pipelines"])
    def cancel(pipeline_id: int, caller: Caller) -> Response:
        info = views.pipeline(pipeline_id, caller)
        submission = identities.submissions([pipeline_id]).get(pipeline_id)
        access.require_owner(caller, info, submission)
        outcome = client.cancel(pipeline_id, actor=caller.name)
        wakeup.changed(client.path, [pipeline_id])  # requests waiting on its state look again
        return reply(CancelOut(id=pipeline_id, outcome=outcome))

    @app.get("/v1/pipelines/{pipeline_id}/result", response_model=ResultOut, tags=["pipelines"])
    def result(pipeline_id: int, caller: Caller) -> Response:
        """What a pipeline released: its job's metrics and primitives' values, its charge per
        block as ε at the dataset's δ_G, its state and reason, its artifacts. Read by its
        submitter, admins and, for a built-in job, its dataset's readers."""
        with connections.reads() as reads:
            return reply(reads.views.result(pipeline_id, caller))

    @app.get(
        "/v1/pipelines/{pipeline_id}/artifacts/{name:path}",
        tags=["pipelines"],
        response_class=StreamingResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    def artifact(pipeline_id: int, name: str, caller: Caller) -> Response:
        """A file the ended pipeline's job left in its work folder, streamed (at most
        :data:`~privsched.results.MAX_ARTIFACT` bytes; a name is a path below that folder,
        never through a link). Read by whoever may read the pipeline's result."""
        with connections.reads() as reads:
            reads.views.result_reader(pipeline_id, caller)
            stream, size = reads.client.open_artifact(pipeline_id, name)
        return StreamingResponse(_chunks(stream, size), media_type="application/octet-stream", headers={"Content-Length": str(size)})

    @app.get("/v1/pipelines/{pipeline_id}/events", response_model=list[EventOut], tags=["pipelines"])
    def events(pipeline_id: int, caller: Caller) -> Response:
        """A pipeline's events, oldest first, each with who caused it. A failure's message
        that the job wrote itself is shown as its message is (:func:`access.visible_message`)."""
        info = views.pipeline(pipeline_id, caller)
        job_text = access.can_read_job_text(caller, info, identities.submissions([pipeline_id]).get(pipeline_id))
        return reply([EventOut.of(e, job_text or not access.written_by_job(e.reason)) for e in client.events(pipeline_id=pipeline_id)])

    @app.get("/v1/pipelines/{pipeline_id}/logs", response_model=LogsOut, tags=["pipelines"])
    def logs(pipeline_id: int, caller: Caller, offset: Annotated[int, Query(ge=0)] = 0) -> Response:
        """A job's output from byte ``offset`` on: a code job's to its submitter and admins, a
        declarative job's to admins (its output may quote raw data; :func:`access.can_read_job_text`)."""
        info = views.pipeline(pipeline_id, caller)
        access.require_job_text(caller, info, identities.submissions([pipeline_id]).get(pipeline_id))
        chunk, ended = client.log_chunk(pipeline_id, offset, LOG_CHUNK)
        return reply(LogsOut(text=chunk.decode(errors="replace"), offset=offset + len(chunk), ended=ended and len(chunk) < LOG_CHUNK))

    @app.get("/v1/reasons", response_model=list[WaitingOut], tags=["pipelines"])
    def reasons(caller: Caller, dataset: str | None = None) -> Response:
        """Why each pending pipeline waits: the block and dimension where its demand falls
        shortest of the unlocked budget, when the unlock rule will have released enough, and
        its rank in the serving policy's order; and what compute each granted one waits for."""
        names = (
            [access.readable_dataset(client, identities, caller, dataset).name]
            if dataset is not None
            else [d.name for d in client.datasets() if identities.may_read(caller, d.id)]
        )
        found = [r for name in names for r in client.reasons(name, policy).values()]
        return reply([WaitingOut(**r.to_dict()) for r in found])

    @app.get("/v1/scheduler", response_model=SchedulerOut, tags=["pipelines"])
    def scheduler(caller: Caller) -> Response:
        """Who holds the scheduler lease, and what keeps the scheduler from making progress."""
        state = SchedulerOut(holder=client.scheduler(), condition=client.scheduler_condition(), job_starts=client.scheduler_job_starts())
        return reply(state)

    @app.get("/v1/audit", response_model=AuditOut, tags=["ledger"])
    def audit(caller: Caller, expect: Annotated[str | None, Query()] = None) -> Response:
        """The hash chain verified and every balance rebuilt from the event log (``expect``:
        a chain head kept earlier, which the log must still hold)."""
        access.require_admin(caller, "audit the ledger")
        report = client.audit(expect=expect)
        return reply(AuditOut(ok=report.ok, violations=report.violations, blocks=report.blocks, events=report.events, head=report.head))

    # -- users --------------------------------------------------------------------------------
    @app.get("/v1/users", response_model=list[UserOut], tags=["users"])
    def list_users(caller: Caller) -> Response:
        access.require_admin(caller, "list users")
        return reply([UserOut(**vars(u)) for u in identities.users()])

    @app.post("/v1/users", response_model=TokenOut, status_code=201, tags=["users"])
    def add_user(body: UserIn, caller: Caller) -> Response:
        access.require_admin(caller, "add users")
        token = identities.add_user(body.name, body.role, body.team, code=body.code, actor=caller.name)
        return reply(TokenOut(name=body.name, token=token), 201)

    @app.post("/v1/users/{name}/revoke", response_model=UserOut, tags=["users"])
    def revoke_user(name: str, caller: Caller) -> Response:
        access.require_admin(caller, "revoke users")
        identities.revoke(name, actor=caller.name)
        return reply(next(UserOut(**vars(u)) for u in identities.users() if u.name == name))

    @app.post("/v1/users/{name}/code", response_model=UserOut, tags=["users"])
    def set_code_rights(name: str, body: CodeIn, caller: Caller) -> Response:
        """Allow a submitter to submit code jobs (``function:``), or deny it again."""
        access.require_admin(caller, "grant or revoke code rights")
        return reply(UserOut(**vars(identities.set_code(name, body.allowed, actor=caller.name))))

    return app


def _chunks(stream: BinaryIO, size: int) -> Iterator[bytes]:
    """The first ``size`` bytes of ``stream`` (the length the answer announced), in chunks;
    the stream is closed at the end."""
    with stream:
        while size > 0:
            chunk = stream.read(min(size, 1 << 20))
            if not chunk:
                return
            size -= len(chunk)
            yield chunk


def _errors(app: FastAPI) -> None:
    """Every failure as one JSON line with its status."""

    @app.exception_handler(ApiError)
    def api_error(request: Request, exc: ApiError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        response = reply({"error": str(exc)}, exc.status)
        response.headers.update(headers or {})
        return response

    @app.exception_handler(ValueError)  # LedgerError, SpecError, pydantic and budget errors
    def bad_input(request: Request, exc: ValueError) -> Response:
        return reply({"error": one_line(str(exc))}, 400)

    @app.exception_handler(RequestValidationError)
    def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return reply({"error": one_line(f"invalid request: {problems}")}, 422)

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return reply({"error": one_line(str(exc.detail))}, exc.status_code)

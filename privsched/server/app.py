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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from privsched.client import Client
from privsched.server.dashboard import dashboard_router
from privsched.server.headers import SecurityHeaders
from privsched.ledger.errors import one_line
from privsched.ledger.identities import DuplicateSubmission, Identities, User
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
    AuditOut,
    BlockOut,
    BlocksIn,
    CancelOut,
    DatasetIn,
    DatasetOut,
    DryRunOut,
    ErrorOut,
    EventOut,
    LogsOut,
    PipelineOut,
    QuotaIn,
    QuotaOut,
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
    app.add_middleware(BodyLimit, limit=MAX_BODY)
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
        info = client.create_dataset(body.name, body.epsilon, body.delta, body.accounting, body.alphas, body.conversion, actor=caller.name)
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
        return reply([BlockOut.of(b) for b in client.blocks(dataset, active_only=active_only) if b.dataset in readable])

    @app.post("/v1/datasets/{name}/blocks", response_model=list[BlockOut], status_code=201, tags=["datasets"])
    def add_blocks(name: str, body: BlocksIn, caller: Caller) -> Response:
        access.require_admin(caller, "add blocks")
        added = client.add_blocks(name, [(b.key, b.location) for b in body.blocks], unlocked=body.unlocked, actor=caller.name)
        return reply([BlockOut.of(b) for b in added], 201)

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
    @app.post("/v1/pipelines", response_model=PipelineOut, status_code=201, tags=["pipelines"])
    def submit(body: SubmitIn, caller: Caller) -> Response:
        """Submit a pipeline. With an ``id`` already used, the pipeline it names is returned
        (status 200) and nothing is written. In a worker thread: its reads and its wait for
        the submission writer's commit release the interpreter lock to the other requests
        (on the event loop they would hold up every request; benchmarks/README.md)."""
        access.require_submitter(caller)
        spec = PipelineSpec.parse(body.spec, source="pipeline")
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
        return reply(PipelineOut.of(info, caller.team, access.visible_message(info, caller)), 201)

    @app.post("/v1/pipelines/dry-run", response_model=DryRunOut, tags=["pipelines"])
    def dry_run(body: SubmitIn, caller: Caller) -> Response:
        """The demand a submission would be charged and whether it fits each block now; writes nothing."""
        access.require_submitter(caller)
        spec = PipelineSpec.parse(body.spec, source="pipeline")
        with connections.reads() as reads:
            access.readable_dataset(reads.client, reads.identities, caller, spec.dataset)
            return reply(DryRunOut.model_validate(asdict(reads.client.dry_run(spec, owner=caller.name))))

    @app.get("/v1/pipelines", response_model=list[PipelineOut], tags=["pipelines"])
    def list_pipelines(caller: Caller, state: Annotated[list[str] | None, Query()] = None, dataset: str | None = None) -> Response:
        if dataset is not None:
            access.readable_dataset(client, identities, caller, dataset)
        readable = {d.name for d in client.datasets() if identities.may_read(caller, d.id)}
        infos = [p for p in client.list(states=state, dataset=dataset) if p.dataset in readable]
        teams = identities.submissions([p.id for p in infos])
        return reply([PipelineOut.of(p, teams[p.id].team if p.id in teams else None, access.visible_message(p, caller)) for p in infos])

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

    @app.get("/v1/pipelines/{pipeline_id}/events", response_model=list[EventOut], tags=["pipelines"])
    def events(pipeline_id: int, caller: Caller) -> Response:
        """A pipeline's events, oldest first, each with who caused it. A failure's message
        is shown to admins only (the job that ended may have written it)."""
        views.pipeline(pipeline_id, caller)
        return reply([EventOut.of(e, caller.is_admin or e.kind != "fail") for e in client.events(pipeline_id=pipeline_id)])

    @app.get("/v1/pipelines/{pipeline_id}/logs", response_model=LogsOut, tags=["pipelines"])
    def logs(pipeline_id: int, caller: Caller, offset: Annotated[int, Query(ge=0)] = 0) -> Response:
        """A job's output from byte ``offset`` on. Admins only: a job is untrusted code and
        its output may hold raw data, which no submitter may read."""
        access.require_admin(caller, "read job logs")
        views.pipeline(pipeline_id, caller)
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
        return reply(TokenOut(name=body.name, token=identities.add_user(body.name, body.role, body.team)), 201)

    @app.post("/v1/users/{name}/revoke", response_model=UserOut, tags=["users"])
    def revoke_user(name: str, caller: Caller) -> Response:
        access.require_admin(caller, "revoke users")
        identities.revoke(name)
        return reply(next(UserOut(**vars(u)) for u in identities.users() if u.name == name))

    return app


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

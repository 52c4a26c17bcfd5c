"""The dashboard over HTTP: the page and its assets (public: they hold no data), the JSON
views the page polls and ``/metrics``, each showing only the datasets the caller's team may
read (admins: all). What a job released or wrote reaches whom :mod:`privsched.server.access`
says: a code job's metrics, log and own messages its submitter and admins only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse, Response

from privsched.client import Client
from privsched.dashboard import metrics, views
from privsched.ledger import LedgerError, PipelineInfo
from privsched.results import released_metrics
from privsched.ledger.identities import Identities, User
from privsched.server import access

#: The files the page is made of, with their media types; nothing else is served from disk.
ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",  # the budget chart's library (uPlot.LICENSE)
    "uPlot.min.css": "text/css; charset=utf-8",
}
#: Media type of Prometheus' text exposition format.
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _asset(name: str) -> str:
    return resources.files("privsched.dashboard").joinpath("static").joinpath(name).read_text(encoding="utf-8")


def dashboard_router(client: Client, identities: Identities, current_user: Callable[..., Awaitable[User]], policy: Any = None) -> APIRouter:
    """The dashboard's routes on the served database; ``current_user`` authenticates (401),
    ``policy`` (the serving scheduler's) orders the queue."""
    router = APIRouter()
    signed_in = Depends(current_user)

    def readable(caller: User) -> views.Readable:
        return lambda dataset: identities.may_read(caller, dataset.id)

    def message(caller: User) -> Callable[[PipelineInfo], str | None]:
        def visible(info: PipelineInfo) -> str | None:
            if not access.written_by_job(info.message):  # privsched's own words: every reader's
                return info.message
            return access.visible_message(info, caller, identities.submissions([info.id]).get(info.id))

        return visible

    def metrics_of(caller: User) -> Callable[[PipelineInfo], dict[str, Any] | None]:
        """What a pipeline's job released as ``caller`` may read it (None: withheld)."""

        def released(info: PipelineInfo) -> dict[str, Any] | None:
            if not access.can_read_outputs(caller, info, identities.submissions([info.id]).get(info.id)):
                return None
            return client.combined_metrics(info, released_metrics(info, client.job_result(client.ran_by(info))))

        return released

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(_asset("index.html"))

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise access.NotFound(f"no dashboard asset {name!r}")
        return Response(_asset(name), media_type=ASSETS[name])

    @router.get(
        "/v1/dashboard/blocks", tags=["dashboard"], summary="Every readable dataset's blocks as budget bars, and its budget over time"
    )
    def blocks(caller: User = signed_in) -> list[dict[str, Any]]:
        return views.blocks_page(client, readable(caller))

    @router.get(
        "/v1/dashboard/queue",
        tags=["dashboard"],
        summary="Pending pipelines in policy order with their reasons; granted, running, recently ended; "
        "what keeps the scheduler from making progress",
    )
    def queue(caller: User = signed_in) -> dict[str, Any]:
        return views.queue_page(client, readable(caller), client.reasons(policy=policy), message(caller))

    @router.get(
        "/v1/dashboard/pipelines",
        tags=["dashboard"],
        summary="Every readable pipeline, newest first, filtered and searched, one page at a time, with its result",
    )
    def pipelines(
        caller: User = signed_in,
        state: str | None = None,
        owner: str | None = None,
        dataset: str | None = None,
        search: Annotated[str | None, Query(max_length=200)] = None,
        page: Annotated[int, Query(ge=1)] = 1,
        per_page: Annotated[int, Query(ge=1, le=views.MAX_PAGE_SIZE)] = views.PAGE_SIZE,
    ) -> dict[str, Any]:
        return views.pipelines_page(
            client,
            readable(caller),
            message(caller),
            metrics_of(caller),
            state=state or None,
            owner=owner or None,
            dataset=dataset or None,
            search=search or None,
            page=page,
            per_page=per_page,
        )

    @router.get("/v1/dashboard/teams", tags=["dashboard"], summary="Each readable dataset's teams: quota, share held and consumed")
    def teams(caller: User = signed_in) -> list[dict[str, Any]]:
        def team_of(ids: list[int]) -> dict[int, str]:
            return {i: s.team for i, s in identities.submissions(ids).items() if s.team is not None}

        return views.teams_page(client, readable(caller), team_of, lambda dataset: identities.quotas(dataset.id))

    @router.get(
        "/v1/dashboard/pipelines/{pipeline_id}",
        tags=["dashboard"],
        summary="One pipeline: timeline, job, demand per block as shares of capacity, its result and log as far as the reader may read",
    )
    def pipeline(pipeline_id: int, caller: User = signed_in) -> dict[str, Any]:
        try:
            info = client.status(pipeline_id)
        except LedgerError:
            raise access.NotFound(f"unknown pipeline {pipeline_id}") from None
        access.readable_dataset(client, identities, caller, info.dataset)
        reason = client.reasons(info.dataset, policy).get(pipeline_id) if info.state in ("pending", "granted") else None
        submission = identities.submissions([pipeline_id]).get(pipeline_id)
        return views.pipeline_page(
            client,
            info,
            access.visible_message(info, caller, submission),
            outputs=access.can_read_outputs(caller, info, submission),
            job_text=access.can_read_job_text(caller, info, submission),
            reason=reason,
        )

    @router.get("/v1/dashboard/audit", tags=["dashboard"], summary="A fresh audit of the ledger and its chain head")
    def audit(caller: User = signed_in) -> dict[str, Any]:
        access.require_admin(caller, "audit the ledger")
        return views.audit_page(client)

    @router.get("/metrics", tags=["dashboard"], summary="Prometheus metrics of the readable datasets", response_class=Response)
    def prometheus(caller: User = signed_in) -> Response:
        return Response(metrics.render(client, readable(caller), client.reasons(policy=policy)), media_type=METRICS_TYPE)

    return router

"""HTTP routes of the dashboard: the page and its assets (public: they hold no data), the
JSON views the page polls and ``/metrics`` (both behind the server's token check)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import HTMLResponse, Response

from privsched.dashboard import metrics, views

if TYPE_CHECKING:
    from privsched.client import Client

#: The files the page is made of, with their media types; nothing else is served from disk.
ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
#: Media type of Prometheus' text exposition format.
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _asset(name: str) -> str:
    return resources.files("privsched.dashboard").joinpath("static", name).read_text(encoding="utf-8")


def dashboard_router(client: Callable[[], Client], viewer: Callable[..., Any]) -> APIRouter:
    """The dashboard's routes. ``client`` returns a client of the served database usable from
    the calling thread; ``viewer`` is the dependency that admits any valid token (it raises
    401 otherwise)."""
    router = APIRouter()
    secured = APIRouter(dependencies=[Depends(viewer)])

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(_asset("index.html"))

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, f"no dashboard asset {name!r}")
        return Response(_asset(name), media_type=ASSETS[name])

    @secured.get("/api/dashboard/blocks", summary="Every dataset's blocks as budget bars, and its budget over time")
    def blocks() -> list[dict[str, Any]]:
        return views.blocks_page(client())

    @secured.get("/api/dashboard/queue", summary="Pending, granted, running and recently ended pipelines")
    def queue() -> dict[str, list[dict[str, Any]]]:
        return views.queue_page(client())

    @secured.get("/api/dashboard/pipelines/{pipeline_id}", summary="One pipeline: demand, timeline, metrics, log tail")
    def pipeline(pipeline_id: int) -> dict[str, Any]:
        return views.pipeline_page(client(), pipeline_id)

    @secured.get("/api/dashboard/audit", summary="A fresh audit of the ledger")
    def audit() -> dict[str, Any]:
        return views.audit_page(client())

    @secured.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def prometheus() -> Response:
        return Response(metrics.render(client()), media_type=METRICS_TYPE)

    router.include_router(secured)
    return router

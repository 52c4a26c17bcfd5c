"""A client of a privsched server over its HTTP API, with the local client's methods.

    import privsched as ps
    client = ps.connect("https://sched.example:8470", token=os.environ["PRIVSCHED_TOKEN"])
    run = client.submit("pipeline.yaml", id="nightly-2026-11-25")   # the same id: the same pipeline
    print(run.wait().status)

It speaks JSON over one keep-alive connection (``http.client``; use one client per
thread) and never imports torch, opacus or ray: the server computes every demand. A
refused request raises :class:`RemoteError`, a ``ValueError`` whose message is the
server's one-line error, like the local client's ``LedgerError``.
"""

from __future__ import annotations

import builtins
import http.client
import json
import os
import select
import ssl
import time
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from privsched.errors import PrivschedError
from privsched.handles import PipelineHandle
from privsched.readouts import BudgetReads, QuotaUsage

if TYPE_CHECKING:
    from privsched.data.importer import ImportReport
    from privsched.ledger.models import AuditReport, BlockInfo, DatasetInfo, DatasetSchema, Event, PipelineInfo
    from privsched.results import PipelineResult
    from privsched.service.dryrun import DryRun
    from privsched.service.waiting import WaitingReason


def _models() -> types.ModuleType:
    """The API's models (pydantic, NumPy), loaded by the first answer that needs them: a
    remote ``privsched submit`` reads only the new pipeline's id (benchmarks/http_api.py)."""
    from privsched.server import models

    return models


#: Seconds to wait for the server to answer one request.
TIMEOUT = 60.0

#: The longest one request waits at the server for a pipeline's change of state, in seconds
#: (at most the server's ``MAX_WAIT``, and below :data:`TIMEOUT`).
LONG_POLL = 25.0


class RemoteError(PrivschedError, ValueError):
    """The server refused a request (``status`` is its HTTP status, 0 if unreachable)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(" ".join(str(message).split()))
        self.status = status


class RemoteRun(PipelineHandle):
    """A handle on one pipeline of the server; every property asks the server afresh."""

    POLL = 0.2
    client: RemoteClient

    def wait(self, timeout: float | None = None, poll: float | None = None) -> RemoteRun:
        """Block until the pipeline ends; ``TimeoutError`` after ``timeout`` seconds. Each
        request waits at the server for the next change of state (a long poll) instead of
        asking every ``poll`` seconds; ``poll`` paces the asking only against a server
        that answers at once (one without waiting requests)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        info = self.client.status(self.id)
        while not info.state.is_final():
            left = LONG_POLL if deadline is None else min(LONG_POLL, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"pipeline {self.id} is still {info.state} after {timeout:g} s")
            asked = time.monotonic()
            before, info = info.state, self.client.wait_for_change(self.id, info.state, left)
            if info.state == before and time.monotonic() - asked < left / 2:
                time.sleep(self.POLL if poll is None else poll)
        return self


def _spec_dict(spec: Any, owner: str | None) -> dict[str, Any]:
    """A specification as the JSON the server parses, validated here first (same errors
    as local use; the server validates it again)."""
    from privsched.spec import PipelineSpec, load_spec

    if isinstance(spec, PipelineSpec):
        parsed = spec
    elif isinstance(spec, Mapping):
        parsed = PipelineSpec.parse(dict(spec))
    else:
        parsed = load_spec(spec)
    return _with_owner(parsed.to_dict(), owner)


def _with_owner(data: dict[str, Any], owner: str | None) -> dict[str, Any]:
    if owner is not None and "owner" not in data:
        data = {**data, "owner": owner}
    return data


def _plain_document(spec: Any) -> tuple[dict[str, Any], str] | None:
    """A specification file or mapping as read (a file strictly: :func:`privsched.spec_files.read_spec`)
    and the name its errors give, when it holds only JSON values (so that the server parses
    exactly what the local models would); None for anything else (a
    :class:`~privsched.spec.PipelineSpec`, a YAML date), which is validated here first."""
    if isinstance(spec, Mapping):
        data, source = dict(spec), "pipeline"
    elif isinstance(spec, (str, os.PathLike)):
        from privsched.spec_files import read_spec

        data, source = read_spec(spec), os.fspath(spec)
    else:
        return None
    return (data, source) if isinstance(data, dict) and _json_values(data) else None


def _json_values(value: Any) -> bool:
    """Whether ``value`` is made of dicts with string keys, lists, strings, numbers, booleans
    and None only (checked without recursion: documents are depth-bounded, mappings are not)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                return False
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None and not isinstance(item, (str, int, float)):  # bool is an int
            return False
    return True


def _closed_by_server(conn: http.client.HTTPConnection) -> bool:
    """Whether the server has closed an idle keep-alive connection (as it does after its
    keep-alive timeout): its socket reads as ready while no answer is due. A request sent on
    it would be lost, so a new connection is opened (urllib3 checks the same before reuse)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class RemoteClient(BudgetReads):
    """The methods of :class:`privsched.client.Client`, served by a privsched server."""

    def __init__(self, url: str, token: str | None = None, *, cafile: str | None = None, timeout: float = TIMEOUT) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(f"server address must be http(s)://HOST[:PORT], got {url!r}")
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("PRIVSCHED_TOKEN")
        self._parts = parts
        self._context = ssl.create_default_context(cafile=cafile or os.environ.get("PRIVSCHED_CA")) if parts.scheme == "https" else None
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def __repr__(self) -> str:
        return f"RemoteClient({self.url!r})"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is not None and _closed_by_server(self._conn):
            self.close()
        if self._conn is None:
            host, port = self._parts.hostname or "", self._parts.port
            if self._context is not None:
                self._conn = http.client.HTTPSConnection(host, port or 443, timeout=self._timeout, context=self._context)
            else:
                self._conn = http.client.HTTPConnection(host, port or 80, timeout=self._timeout)
        return self._conn

    def request(
        self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None, *, retry: bool | None = None
    ) -> Any:
        """One API call: the decoded JSON answer, or :class:`RemoteError`. A keep-alive
        connection the server closed while idle is replaced before sending; one dropped
        during the call is reopened and a request that is safe to repeat (reads, and
        submissions with an id) is sent again once."""
        response, data = self._send(method, path, body, query, retry)
        return self._answer(response, data)

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        retry: bool | None = None,
        *,
        whole: bool = True,
    ) -> tuple[http.client.HTTPResponse, bytes]:
        """Send one request and read its answer's status and headers, and its body when
        ``whole`` (else the caller reads it, then calls :meth:`_done`); see :meth:`request`."""
        target = self._parts.path.rstrip("/") + path
        if query:
            target += "?" + urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
        payload = None if body is None else json.dumps(body, allow_nan=True).encode()
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        repeat = method == "GET" if retry is None else retry
        for attempt in (0, 1):
            try:
                conn = self._connection()
                conn.request(method, target, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read() if whole or response.status >= 400 else b""
                break
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                self.close()
                if attempt == 0 and repeat and not isinstance(exc, (TimeoutError, ssl.SSLCertVerificationError)):
                    continue
                raise RemoteError(f"cannot reach privsched server at {self.url}: {exc}") from None
        if whole or response.status >= 400:
            self._done(response)
        return response, data

    def _done(self, response: http.client.HTTPResponse) -> None:
        """Close the connection after an answer whose server closes it."""
        if response.will_close:
            self.close()

    def _answer(self, response: http.client.HTTPResponse, data: bytes) -> Any:
        """An answer's decoded JSON, or :class:`RemoteError` for a refusal."""
        try:
            answer = json.loads(data) if data else None
        except ValueError:
            raise RemoteError(f"server answered {response.status} with a body that is not JSON", response.status) from None
        if response.status >= 400:
            message = answer.get("error") if isinstance(answer, dict) else None
            raise RemoteError(message or f"server answered {response.status}", response.status)
        return answer

    def upload(self, path: str, handle: Any, query: Mapping[str, Any]) -> Any:
        """POST a file's bytes (streamed, never retried) and decode the JSON answer."""
        target = self._parts.path.rstrip("/") + path + "?" + urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
        headers = {"Accept": "application/json", "Content-Type": "application/octet-stream"}
        headers["Content-Length"] = str(os.fstat(handle.fileno()).st_size)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn = self._connection()
            conn.request("POST", target, body=handle, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            self.close()
            raise RemoteError(f"cannot reach privsched server at {self.url}: {exc}") from None
        if response.will_close:
            self.close()
        answer = json.loads(data) if data else None
        if response.status >= 400:
            message = answer.get("error") if isinstance(answer, dict) else None
            raise RemoteError(message or f"server answered {response.status}", response.status)
        return answer

    def init(self) -> str:
        """The server's address: its database exists already (the server opened it)."""
        return self.url

    # -- datasets and blocks ------------------------------------------------------------------
    def create_dataset(
        self,
        name: str,
        epsilon: float,
        delta: float,
        accounting: str = "rdp",
        alphas: Sequence[float] | None = None,
        conversion: str = "paper",
        teams: Sequence[str] = (),
        *,
        unit: str = "record",
        user_column: str | None = None,
        max_rows_per_user: int | None = None,
    ) -> DatasetInfo:
        body = {
            "name": name,
            "epsilon": epsilon,
            "delta": delta,
            "accounting": accounting,
            "alphas": None if alphas is None else list(alphas),
            "conversion": conversion,
            "teams": list(teams),
            "unit": unit,
            "user_column": user_column,
            "max_rows_per_user": max_rows_per_user,
        }
        return _models().DatasetOut.model_validate(self.request("POST", "/v1/datasets", body)).info()

    def datasets(self) -> list[DatasetInfo]:
        return [_models().DatasetOut.model_validate(d).info() for d in self.request("GET", "/v1/datasets")]

    def dataset(self, name: str) -> DatasetInfo:
        return _models().DatasetOut.model_validate(self.request("GET", f"/v1/datasets/{quote(name, safe='')}")).info()

    def add_blocks(self, dataset: str, blocks: Iterable[Any], *, unlocked: float = 0.0) -> list[BlockInfo]:
        from privsched.blocks import block_spec

        specs = [block_spec(b) for b in blocks]
        body = {"blocks": [{"key": b.key, "location": b.location} for b in specs], "unlocked": unlocked}
        answer = self.request("POST", f"/v1/datasets/{quote(dataset, safe='')}/blocks", body)
        return [_models().BlockOut.model_validate(b).info() for b in answer]

    def import_blocks(
        self,
        dataset: str,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        by: str | None = None,
        every: str | None = None,
        partitions: int | None = None,
        bounds: Mapping[str, Sequence[float]] | None = None,
        categories: Mapping[str, Sequence[str]] | None = None,
        unlocked: float = 0.0,
        store: str | os.PathLike | None = None,
    ) -> ImportReport:
        """Upload one table file (.csv, .parquet or .jsonl) to be imported as the local
        client's :meth:`~privsched.client.Client.import_blocks` does (administrators only;
        the server keeps the blocks in its own block store)."""
        if store is not None:
            raise RemoteError("a server keeps imported blocks in its own block store: --store is for a local database")
        files = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        if len(files) != 1:
            raise RemoteError("a server imports one file per request")
        from privsched.data.tables import file_format

        name = os.fspath(files[0])
        kind = file_format(Path(name))
        query: dict[str, Any] = {"by": by, "every": every, "partitions": partitions, "format": kind, "unlocked": unlocked}
        query["bounds"] = [f"{column}={low!r}:{high!r}" for column, (low, high) in (bounds or {}).items()]
        query["categories"] = [f"{column}={','.join(values)}" for column, values in (categories or {}).items()]
        try:
            with open(name, "rb") as handle:
                answer = self.upload(f"/v1/datasets/{quote(dataset, safe='')}/import", handle, query)
        except OSError as exc:
            raise RemoteError(f"{name}: {exc.strerror or exc}") from None
        return _models().ImportOut.model_validate(answer).report()

    def dataset_schema(self, dataset: str) -> DatasetSchema | None:
        """The dataset's columns and declared public bounds and categories (None until its
        first import)."""
        from privsched.ledger.models import DatasetSchema

        table = self.request("GET", f"/v1/datasets/{quote(dataset, safe='')}").get("table")
        return None if table is None else DatasetSchema.from_dict(table)

    def blocks(self, dataset: str | None = None, *, active_only: bool = False) -> list[BlockInfo]:
        answer = self.request("GET", "/v1/blocks", query={"dataset": dataset, "active_only": active_only})
        return [_models().BlockOut.model_validate(b).info() for b in answer]

    def unlock(self, dataset: str, fraction: float, keys: Sequence[str] | None = None) -> list[BlockInfo]:
        body = {"fraction": fraction, "keys": None if keys is None else list(keys)}
        answer = self.request("POST", f"/v1/datasets/{quote(dataset, safe='')}/unlock", body)
        return [_models().BlockOut.model_validate(b).info() for b in answer]

    def quota_usage(self, dataset: str | None = None, *, team: str | None = None) -> builtins.list[QuotaUsage]:
        """The team quotas the caller may see (an admin: every team's; others: their own
        team's), with what each team holds and consumed (``GET /v1/quotas``)."""
        found = [QuotaUsage(**q) for q in self.request("GET", "/v1/quotas", query={"dataset": dataset})]
        return [q for q in found if team in (None, q.team)]

    def set_quota(self, dataset: str, team: str, share: float | None) -> dict[str, float]:
        """Cap what ``team`` may hold on each block of ``dataset`` (admins; None lifts it)."""
        path = f"/v1/datasets/{quote(dataset, safe='')}/quotas/{quote(team, safe='')}"
        return self.request("PUT", path, {"share": share}, retry=True)["quotas"]

    # -- pipelines ----------------------------------------------------------------------------
    def _send_spec(self, path: str, spec: Any, owner: str | None, fields: Mapping[str, Any], retry: bool | None = None) -> Any:
        """POST a specification to ``path`` with the other ``fields`` of the body.

        The server validates every specification. A file or mapping of plain JSON values is
        sent as read, and checked against the local models (pydantic) only if the request
        fails: an invalid one then raises the same one-line error it raises without a server,
        whatever the server answered, so a valid submission never builds the models
        (benchmarks/README.md). Anything else is validated here first."""
        plain = _plain_document(spec)
        if plain is None:
            return self.request("POST", path, {"spec": _spec_dict(spec, owner), **fields}, retry=retry)
        data, source = plain
        try:
            return self.request("POST", path, {"spec": _with_owner(data, owner), **fields}, retry=retry)
        except RemoteError:
            from privsched.spec import PipelineSpec

            PipelineSpec.parse(data, source=source)  # an invalid specification: its own error
            raise

    def submit(self, spec: Any, *, owner: str | None = None, id: str | None = None) -> RemoteRun:
        """Submit a pipeline; with a submission ``id``, a repeat returns the pipeline
        the first one created (and the request is safely resent if the connection drops)."""
        answer = self._send_spec("/v1/pipelines", spec, owner, {"id": id}, retry=id is not None)
        return RemoteRun(self, answer["id"])

    def dry_run(self, spec: Any, *, owner: str | None = None) -> DryRun:
        """What submitting ``spec`` would claim and whether it would be granted (fits now,
        waits or can never fit, under the caller's team quota); writes nothing."""
        from privsched.service.dryrun import BlockFit, DryRun

        answer = self._send_spec("/v1/pipelines/dry-run", spec, owner, {})
        return DryRun(**{**answer, "blocks": [BlockFit(**b) for b in answer["blocks"]]})

    def submit_many(self, specs: Iterable[Any], *, owner: str | None = None) -> list[RemoteRun]:
        return [self.submit(spec, owner=owner) for spec in specs]

    def run(self, pipeline_id: int) -> RemoteRun:
        self.status(pipeline_id)
        return RemoteRun(self, pipeline_id)

    def list(
        self,
        states: Iterable[str] | None = None,
        dataset: str | None = None,
        *,
        owner: str | None = None,
        mine: bool = False,
        limit: int | None = None,
    ) -> list[PipelineInfo]:
        """Pipelines the caller may read, oldest first: only those in ``states``, on
        ``dataset``, of ``owner`` (or with ``mine`` the caller's own), the ``limit`` most recent."""
        wanted = None if states is None else [states] if isinstance(states, str) else list(states)
        query = {"state": wanted, "dataset": dataset, "owner": owner, "mine": "true" if mine else None, "limit": limit}
        answer = self.request("GET", "/v1/pipelines", query=query)
        return [_models().PipelineOut.model_validate(p).info() for p in answer]

    def status(self, pipeline_id: int) -> PipelineInfo:
        return _models().PipelineOut.model_validate(self.request("GET", f"/v1/pipelines/{int(pipeline_id)}")).info()

    def wait_for_change(self, pipeline_id: int, since: str, seconds: float = LONG_POLL) -> PipelineInfo:
        """The pipeline once its state is no longer ``since``, or after ``seconds`` (at
        most :data:`LONG_POLL`) with its state then: the server holds the request until
        its scheduler changes the state (``GET /v1/pipelines/{id}?wait=&since=``)."""
        query = {"wait": max(0.0, min(seconds, LONG_POLL)), "since": str(since)}
        return _models().PipelineOut.model_validate(self.request("GET", f"/v1/pipelines/{int(pipeline_id)}", query=query)).info()

    def cancel(self, pipeline_id: int) -> str:
        return self.request("POST", f"/v1/pipelines/{int(pipeline_id)}/cancel")["outcome"]

    def events(self, *, pipeline_id: int) -> builtins.list[Event]:
        """A pipeline's events, oldest first, each with who caused it (the server's log)."""
        return [_models().EventOut.model_validate(e).event() for e in self.request("GET", f"/v1/pipelines/{int(pipeline_id)}/events")]

    def log_chunk(self, pipeline_id: int, offset: int = 0, limit: int | None = None) -> tuple[bytes, bool]:
        answer = self.request("GET", f"/v1/pipelines/{int(pipeline_id)}/logs", query={"offset": offset})
        return answer["text"].encode(), bool(answer["ended"])

    def result(self, pipeline_id: int) -> PipelineResult:
        """What a pipeline released, its charge, state, reason and artifacts (its submitter,
        admins and, for a built-in job, its dataset's readers may read it)."""
        from privsched.results import PipelineResult

        return PipelineResult.from_dict(self.request("GET", f"/v1/pipelines/{int(pipeline_id)}/result"))

    def download(self, pipeline_id: int, out: str | os.PathLike, names: Sequence[str] | None = None) -> builtins.list[Path]:
        """Copy an ended pipeline's artifacts (all, or ``names``) into the folder ``out``,
        streamed; returns the files written."""
        from privsched.results import check_artifact_name, save_artifact

        wanted = [a.name for a in self.result(pipeline_id).artifacts] if names is None else builtins.list(names)
        written = []
        for name in wanted:
            check_artifact_name(name)  # a name from the server, too, stays below ``out``
            response, data = self._send("GET", f"/v1/pipelines/{int(pipeline_id)}/artifacts/{quote(name)}", whole=False)
            if response.status >= 400:
                self._answer(response, data)  # raises the server's refusal
            try:
                written.append(save_artifact(Path(out), name, iter(lambda: response.read(1 << 20), b"")))
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                self.close()
                raise RemoteError(f"the download of {name!r} broke off: {exc}") from None
            except BaseException:  # refused (too large): the rest of the answer is never read
                self.close()
                raise
            self._done(response)
        return written

    def logs(self, pipeline_id: int) -> str:
        text, offset = [], 0
        while True:
            chunk, ended = self.log_chunk(pipeline_id, offset)
            text.append(chunk.decode(errors="replace"))
            offset += len(chunk)
            if not chunk or ended:
                return "".join(text)

    def reasons(self, dataset: str | None = None, policy: None = None, *, pipeline_id: int | None = None) -> dict[int, WaitingReason]:
        """Why each pending pipeline waits (with ``pipeline_id``: that one), ranked in the
        serving scheduler's order."""
        from privsched.service.waiting import WaitingReason

        found = self.request("GET", "/v1/reasons", query={"dataset": dataset})
        return {r["pipeline_id"]: WaitingReason(**r) for r in found if pipeline_id in (None, r["pipeline_id"])}

    def scheduler(self) -> str | None:
        return self.request("GET", "/v1/scheduler")["holder"]

    def scheduler_condition(self) -> str | None:
        return self.request("GET", "/v1/scheduler")["condition"]

    def scheduler_job_starts(self) -> str | None:
        return self.request("GET", "/v1/scheduler")["job_starts"]

    def audit(self, expect: str | None = None) -> AuditReport:
        from privsched.ledger.models import AuditReport

        return AuditReport(**self.request("GET", "/v1/audit", query={"expect": expect}))

    # -- users --------------------------------------------------------------------------------
    def add_user(self, name: str, role: str, team: str | None = None, *, code: bool = False) -> str:
        return self.request("POST", "/v1/users", {"name": name, "role": role, "team": team, "code": code})["token"]

    def users(self) -> builtins.list[dict[str, Any]]:
        return self.request("GET", "/v1/users")

    def revoke_user(self, name: str) -> None:
        self.request("POST", f"/v1/users/{quote(name, safe='')}/revoke")

    def set_code_rights(self, name: str, allowed: bool) -> dict[str, Any]:
        return self.request("POST", f"/v1/users/{quote(name, safe='')}/code", {"allowed": allowed})

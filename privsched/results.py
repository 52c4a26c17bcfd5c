"""What a pipeline released, as its readers get it back: ``privsched result``,
:meth:`Client.result <privsched.client.Client.result>`, ``GET /v1/pipelines/ID/result``.

A :class:`PipelineResult` holds the pipeline's state and reason, its job's metrics (a
built-in job's DP releases, or what a code job reported), the values its privacy primitives
released, its charge per block and in all as ε at the dataset's δ_G (the reading of every
other command, :mod:`privsched.readouts`), and the files its job left in its work folder
(its artifacts: a DP-SGD job's ``model.pt``, a ``torch.save``\\ d state dict). The local and
the remote client build the same object; who may read it is
:func:`privsched.server.access.require_result_reader`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privsched.errors import BadInput

if TYPE_CHECKING:
    from privsched.jobs.runner import JobResult
    from privsched.ledger.models import DatasetInfo, PipelineInfo


#: Largest artifact served or saved, in bytes.
MAX_ARTIFACT = 4 << 30
#: An artifact's name: path parts of letters, digits, ``.``, ``_``, ``-`` (not starting with a
#: dot, so never ``..``), joined by ``/``: it names a file below its run's work folder and
#: nothing outside it, there and where it is downloaded to.
ARTIFACT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}(/[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}){0,15}")


@dataclass(frozen=True)
class Artifact:
    """A file a job left in its work folder, by its path there (``/``-separated)."""

    name: str
    size: int  # bytes


@dataclass(frozen=True)
class PipelineResult:
    """What a pipeline released and what it cost (see the module docstring)."""

    id: int  # the pipeline's id
    name: str  # its submitter's name for it
    dataset: str  # its dataset's name
    state: str  # its state (completed, failed, ...)
    reason: str | None  # why it failed or was released, if it did
    job: str  # a built-in job's kind, or "function" for a code job
    delta: float  # the dataset's δ_G, at which every ε here is read
    epsilon: float | None  # its charge: the largest ε over its blocks (None until it ended)
    charged: dict[str, float] | None  # its charge per block, as ε at ``delta`` (None until it ended)
    metrics: dict[str, Any] = field(default_factory=dict)  # what its job released (reported)
    releases: list[dict[str, Any]] = field(default_factory=list)  # each primitive's query, ε, δ and value
    first_access: float | None = None  # when its job first reached its data (None: never)
    artifacts: list[Artifact] = field(default_factory=list)  # files its job left
    reused_from: int | None = None  # the pipeline whose release it returned, at no charge
    answered_from_cache: list[int] | None = None  # the pipelines whose releases answered it, at no charge

    @property
    def declarative(self) -> bool:
        """Whether a built-in job ran (everything it released is DP), not user code."""
        return self.job != "function"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipelineResult:
        fields = {**data, "artifacts": [Artifact(str(a["name"]), int(a["size"])) for a in data.get("artifacts") or []]}
        return cls(**fields)

    def lines(self) -> list[str]:
        """The result as text, one line per field, metric, release and artifact."""
        out = [f"pipeline {self.id} ({self.name}): {self.state}" + (f": {self.reason}" if self.reason else "")]
        out.append(f"job: {self.job}, dataset {self.dataset}")
        if self.epsilon is not None and self.charged is not None:
            blocks = ", ".join(f"{key} {value:.4g}" for key, value in self.charged.items())
            out.append(f"charged: ε {self.epsilon:.4g} at δ={self.delta:g} ({blocks})")
        if self.reused_from is not None:
            out.append(f"reused_from: {self.reused_from} (its release, returned at no charge)")
        if self.answered_from_cache is not None:
            sources = ", ".join(str(i) for i in self.answered_from_cache)
            out.append(f"answered_from_cache: pipelines {sources} (their releases, at no charge)")
        return out + self.output_lines()

    def output_lines(self) -> list[str]:
        """What the job released and left, one line per metric, release and artifact."""
        out = []
        for key, value in self.metrics.items():
            out.append(f"metric {key}: {json.dumps(value, default=str)}")
        for release in self.releases:
            noise = f", δ={release['delta']:g}" if release.get("delta") else ""
            out.append(f"released {release['query']} (ε={release['epsilon']:g}{noise}): {json.dumps(release['value'], default=str)}")
        for artifact in self.artifacts:
            out.append(f"artifact {artifact.name} ({artifact.size} bytes)")
        return out


def job_label(job: dict[str, Any]) -> str:
    """A job's kind, or "function" for user code."""
    return str(job.get("kind") or "function")


def released_metrics(info: PipelineInfo, job_result: JobResult | None) -> dict[str, Any]:
    """What ``info``'s job released (``job_result``: that of the pipeline that ran it), and,
    for a pipeline that reused another's release, ``reused_from``: that pipeline's id; for
    one answered from the cache, its answer, ``answered_from_cache`` and ``reused_from``: the
    pipelines whose releases answered it."""
    from privsched.ledger.reuse import ANSWERED_FROM_CACHE, REUSED_FROM

    answer = info.job.get(ANSWERED_FROM_CACHE)
    if answer is not None:
        params = info.job.get("params") or {}
        shown = {name: answer[name] for name in ("value", "edges", "failure_bound") if name in answer}
        described = {"query": params.get("query"), "column": params.get("column"), "accuracy": info.job.get("accuracy")}
        return described | shown | {ANSWERED_FROM_CACHE: True, REUSED_FROM: answer["sources"]}
    source = info.job.get(REUSED_FROM)
    return (dict(job_result.metrics) if job_result is not None else {}) | ({} if source is None else {REUSED_FROM: source})


def pipeline_result(
    info: PipelineInfo, dataset: DatasetInfo, job_result: JobResult | None, artifacts: list[Artifact], reason: str | None
) -> PipelineResult:
    """The result of pipeline ``info`` from the ledger's record (its charge) and its job's
    result file (``job_result``, None when it has none), with ``reason`` as its readers may
    see it."""
    from privsched.ledger.reuse import ANSWERED_FROM_CACHE, REUSED_FROM
    from privsched.readouts import readout

    charged = None if info.consumed is None else {key: readout(info.consumed[key], dataset).epsilon for key in info.block_keys}
    return PipelineResult(
        id=info.id,
        name=info.name,
        dataset=info.dataset,
        state=str(info.state),
        reason=reason,
        job=job_label(info.job),
        delta=dataset.delta,
        epsilon=None if charged is None else max(charged.values(), default=0.0),
        charged=charged,
        metrics=released_metrics(info, job_result),
        releases=list(job_result.releases) if job_result is not None else [],
        first_access=job_result.first_access if job_result is not None else None,
        artifacts=artifacts,
        reused_from=info.job.get(REUSED_FROM),
        answered_from_cache=(info.job.get(ANSWERED_FROM_CACHE) or {}).get("sources"),
    )


def check_artifact_name(name: str) -> None:
    """Refuse (:class:`~privsched.errors.BadInput`) a name :data:`ARTIFACT_NAME` does not match."""
    if not ARTIFACT_NAME.fullmatch(name):
        raise BadInput(f"{name!r} is not an artifact name (path parts of letters, digits, '.', '_' and '-')")


def save_artifact(out: Path, name: str, chunks: Iterable[bytes]) -> Path:
    """Write an artifact's ``chunks`` to ``out/name`` (its folders created), whole or not at
    all: through a temporary file renamed at the end; more than :data:`MAX_ARTIFACT` bytes
    raise :class:`~privsched.errors.BadInput` and leave nothing."""
    check_artifact_name(name)
    target = out / name
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as stream:
            written = 0
            for chunk in chunks:
                written += len(chunk)
                if written > MAX_ARTIFACT:
                    raise BadInput(f"artifact {name!r} is over the {MAX_ARTIFACT}-byte limit")
                stream.write(chunk)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target

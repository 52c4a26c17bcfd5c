"""Runs one granted job in its own process and writes what happened to a result file.

    python -m privsched.jobs.runner CONTEXT.json RESULT.json

The context file is a :class:`~privsched.jobs.context.JobContext` in JSON with one more key,
``job``: a built-in trainer (``{"kind": ...}``) or user code (``{"function":
"module:qualname"}`` or ``"path/to/file.py:function"``, plus ``pythonpath`` folders to import
it from). The job is called with the context. The result file says whether it completed and
what it spent on each granted block — its grant in full when it did not call
``report_spent`` (docs/design.md §4.4: a job is charged what it was granted unless it reports less) —
or that it failed. A job that started may have read its blocks by any path (it knows their
locations), so a failure always counts as having touched data: its grant is consumed. An executor that finds no result file
after the process ended fails the pipeline conservatively.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from privsched.jobs.context import JobContext


@dataclass(frozen=True)
class JobResult:
    """How a job ended, as the scheduler settles it in the ledger."""

    pipeline_id: int
    completed: bool
    #: Per granted block key, the budget spent (completed jobs only).
    spent: dict[str, list[float]] | None = None
    touched_data: bool = True
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=_jsonable)

    @classmethod
    def from_json(cls, text: str) -> JobResult:
        data = json.loads(text)
        return cls(
            pipeline_id=int(data["pipeline_id"]),
            completed=bool(data["completed"]),
            spent=data.get("spent"),
            touched_data=bool(data.get("touched_data", True)),
            message=str(data.get("message", "")),
            metrics=dict(data.get("metrics") or {}),
        )


def _jsonable(value: Any) -> Any:
    """Metrics may hold NumPy or torch scalars and arrays."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see either nothing or the whole text."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_function(entry: str, pythonpath: list[str] | tuple[str, ...] = ()) -> Callable[..., Any]:
    """The callable named ``module:qualname`` (or ``file.py:qualname``)."""
    for folder in reversed(pythonpath):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    module_name, _, qualname = entry.rpartition(":")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load job file {module_name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"job {entry} is not callable")
    return target


def job_callable(job: dict[str, Any]) -> Callable[[JobContext], Any]:
    if job.get("kind"):
        from privsched.jobs.builtin import run_builtin

        return run_builtin
    return load_function(job["function"], job.get("pythonpath", ()))


def spent_per_block(ctx: JobContext) -> dict[str, list[float]]:
    """What a finished job is charged on each block: its report, or else its whole grant."""
    if ctx.spent is None:
        return {key: grant.grant.tolist() for key, grant in ctx.blocks.items()}
    return {key: ctx.spent.tolist() for key in ctx.blocks}


def run_job(context_path: Path) -> JobResult:
    """Run the job a context file describes; any exception becomes a failed result."""
    text = context_path.read_text()
    ctx = JobContext.from_json(text)
    try:
        job_callable(json.loads(text)["job"])(ctx)
    except BaseException as exc:  # the job's own failure, whatever it is, is its result
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return JobResult(ctx.pipeline_id, False, touched_data=True, message=message, metrics=ctx.metrics)
    return JobResult(ctx.pipeline_id, True, spent_per_block(ctx), ctx.touched_data, "", ctx.metrics)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m privsched.jobs.runner CONTEXT.json RESULT.json", file=sys.stderr)
        return 2
    result = run_job(Path(args[0]))
    write_atomic(Path(args[1]), result.to_json())
    sys.stdout.flush()
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())

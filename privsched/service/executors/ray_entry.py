"""What a Ray job runs on the cluster, and how it talks back to the scheduler.

    python -m privsched.service.executors.ray_entry

The job travels with its submission: the runner's context document (a
:class:`~privsched.jobs.context.JobContext` plus its ``job`` entry) is compressed into the
environment variable ``PRIVSCHED_JOB``, so a worker never needs the database file or the
scheduler's run folders. The entry runs the job under its supervisor and sandbox
(:func:`privsched.jobs.runner.run_job`; the mode in ``PRIVSCHED_SANDBOX``, refused when the
worker's kernel has no Landlock) and prints the :class:`~privsched.jobs.runner.JobResult` as the last line of its output,
prefixed by :data:`RESULT_MARKER`; the scheduler reads it from the Ray job's logs and alone
settles it in the ledger (docs/design.md §4.4). The exit status is 0 when the job completed.

Ray's authentication token never reaches a job: when the cluster's processes carry it in their
environment (:data:`~privsched.service.executors.base.SECRET_VARIABLES`), the entry first starts itself again without it, so
that neither the job's environment nor its ``/proc/self/environ`` holds it.

A data-parallel job whose ranks train across nodes (:data:`~.ray_train.RANKS_VARIABLE` set) runs
as Ray Train's ``TorchTrainer`` instead (:mod:`.ray_train`): this process is then only its
driver, keeps the cluster's token to talk to the cluster, and starts each rank's supervisor
without it.

The job's working directory is its scheduler-side work folder when its run folder exists on the
worker (a shared file system, or a one-machine cluster), else the Ray job's own folder.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
import zlib
from pathlib import Path

from privsched.jobs.runner import JobResult, run_job
from privsched.jobs.sandbox import SandboxError, require_sandbox, sandbox_mode
from privsched.service.executors.base import SECRET_VARIABLES, without_secrets
from privsched.service.executors.ray_train import RANKS_VARIABLE, RankShape, run_across_nodes

#: Environment variable carrying the job's context document.
JOB_VARIABLE = "PRIVSCHED_JOB"
#: Environment variable: "1" when the operator lets jobs that ask for it keep TCP access.
NETWORK_VARIABLE = "PRIVSCHED_ALLOW_NETWORK"
#: Prefix of the log line that carries the job's result.
RESULT_MARKER = "@@privsched-result "


def encode_document(document: str) -> str:
    """The context document as it travels in :data:`JOB_VARIABLE` (zlib, then base64)."""
    return base64.b64encode(zlib.compress(document.encode(), 9)).decode("ascii")


def decode_document(encoded: str) -> str:
    return zlib.decompress(base64.b64decode(encoded)).decode()


def result_line(result: JobResult) -> str:
    return RESULT_MARKER + result.to_json()


def parse_result(logs: str, pipeline_id: int) -> JobResult | None:
    """The result the job printed last, or None if it printed none (it was killed, or never
    started). A result of another pipeline, or one that does not parse, is a failure."""
    for line in reversed(logs.splitlines()):
        if not line.startswith(RESULT_MARKER):
            continue
        try:
            result = JobResult.from_json(line[len(RESULT_MARKER) :])
        except (ValueError, KeyError, TypeError):
            return JobResult(pipeline_id, False, message="job printed a result that does not parse")
        if result.pipeline_id != pipeline_id:
            return JobResult(pipeline_id, False, message="job printed the result of another pipeline")
        return result
    return None


def main() -> int:
    ranks = os.environ.get(RANKS_VARIABLE)
    if not ranks and any(name in os.environ for name in SECRET_VARIABLES):  # a fresh image: /proc/self/environ forgets them too
        os.execve(sys.executable, [sys.executable, "-m", "privsched.service.executors.ray_entry"], without_secrets(os.environ))
    encoded = os.environ.get(JOB_VARIABLE)
    if not encoded:
        print(f"{JOB_VARIABLE} is not set: this module runs a job the ray executor submitted", file=sys.stderr)
        return 2
    document = json.loads(decode_document(encoded))
    workdir = Path(document["workdir"])
    if workdir.parent.is_dir():
        workdir.mkdir(mode=0o700, exist_ok=True)
        os.chdir(workdir)
    else:
        document["workdir"] = os.getcwd()
    mode = sandbox_mode()
    try:
        require_sandbox(mode)
        if ranks:  # the driver talks to the cluster (with its token); each rank's supervisor starts without it
            result = run_across_nodes(document, RankShape.from_json(ranks), mode)
        else:
            result = _run_here(document, mode)
    except SandboxError as exc:
        result = JobResult(int(document["pipeline_id"]), False, touched_data=False, message=f"not started: {exc}")
    sys.stdout.flush()
    sys.stderr.flush()
    print("\n" + result_line(result), flush=True)
    return 0 if result.completed else 1


def _run_here(document: dict, mode: str) -> JobResult:
    """Supervise the job in this process (one host)."""
    with tempfile.TemporaryDirectory(prefix="privsched-job-") as folder:
        context = Path(folder) / "context.json"
        context.write_text(json.dumps(document))
        return run_job(context, mode, os.environ.get(NETWORK_VARIABLE) == "1")


if __name__ == "__main__":
    sys.exit(main())

"""Checks a job before budget is spent on it: a code job at submit (:func:`code_problem`),
a built-in job's inputs before it starts (:func:`input_problem`).

A code job (``function:``) is checked when it is submitted, free of charge: its
``pythonpath`` folders and its ``file.py`` (if it names one) are made absolute
(:func:`resolve_code`) and must not overlap a protected path (the database's folder, its runs,
the blocks' files and the folders that hold them) in either direction (:func:`overlap`); then
a separate process confines itself exactly as the job will (the job's Landlock rules,
:func:`privsched.jobs.runner.job_confinement`, with no block), imports the job's module and
checks that it defines the named function taking one argument (its context); where jobs
run unconfined (``PRIVSCHED_SANDBOX=none``, or no Landlock, which ``serve`` refuses without
``--sandbox none``) the import runs unconfined in that process, as the job would. No data is
read and nothing is charged; a problem is one line and the submission is refused. A job that
passed is not checked again while its code (the files of its module's top-level package, or
its file) and what it is checked against stay the same: a check costs a Python start-up.

A built-in job (``kind: statistic`` or ``dpsgd``) reads each granted block's Parquet or
``.npz`` file (:mod:`privsched.jobs.records`). Before it is started, every granted block
must have a location naming an existing file, and that file must hold the per-record
columns the job reads (a statistic's ``column``; DP-SGD's ``tokens`` and its ``target``).
Only a Parquet file's footer, or an ``.npz`` file's array names and shapes (its zip
directory and ``.npy`` headers), are read, never its records, so the check releases nothing
about the data. Its parameters must be valid too (a pipeline stored by an older privsched
may name a statistic's noise ``mechanism``, now refused). A job that fails the check is
failed before it touched data, so its grant is released (docs/design.md §4.4). User code
is not checked: what it
reads is up to it, and a failure after reading is charged as usual.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from privsched.jobs.records import METADATA, is_parquet

#: Longest a code job's module may take to import at submit, in seconds.
IMPORT_LIMIT = 60.0
#: Checks passed in this process, by what they checked (:func:`_passed_key`); at most this many.
_PASSED: set[tuple] = set()
_PASSED_MOST = 1024


def resolve_code(job: dict[str, Any], base: Path | None = None) -> dict[str, Any]:
    """A code job with its ``pythonpath`` folders and its ``file.py`` made absolute (from
    ``base``, by default the current folder); raises ``ValueError`` (one line) for a folder or
    a file that does not exist."""
    here = Path.cwd() if base is None else base
    folders = []
    for entry in job.get("pythonpath") or []:
        folder = (here / entry).resolve()
        if not folder.is_dir():
            raise ValueError(f"pythonpath entry {entry!r} is not a folder ({folder})")
        folders.append(str(folder))
    module, _, name = str(job["function"]).rpartition(":")
    if module.endswith(".py"):
        file = (here / module).resolve()
        if not file.is_file():
            raise ValueError(f"the job's file {module!r} does not exist ({file})")
        module = str(file)
    return {**job, "function": f"{module}:{name}", "pythonpath": folders}


def protected_paths(db: Path, runs: Path, locations: Iterable[str | None]) -> list[str]:
    """What no job's code may overlap: the database's folder, its runs folder, every block's
    file and the folder holding it (its store)."""
    found = {str(db.resolve().parent), str(runs.resolve())}
    for location in locations:
        if location:
            path = Path(location).resolve()
            found.update((str(path), str(path.parent)))
    return sorted(found)


def overlap(roots: Iterable[str], protected: Iterable[str]) -> str | None:
    """Why one of ``roots`` overlaps a protected path, either beneath it or holding it, or None."""
    guarded = [Path(p).resolve() for p in protected]
    for root in map(Path, roots):
        for path in guarded:
            if root == path or path in root.parents:
                return f"{root} lies beneath {path}, which jobs must not reach (keep code away from the ledger and the data)"
            if root in path.parents:
                return f"{root} holds {path}, which jobs must not reach (keep code away from the ledger and the data)"
    return None


def code_problem(job: dict[str, Any], protected: list[str], limit: float = IMPORT_LIMIT) -> str | None:
    """Why a code job (paths resolved, :func:`resolve_code`) cannot run, or None: its code
    overlaps a protected path, or it does not import, confined and without data, into a
    function taking one argument (module docstring)."""
    module = str(job["function"]).rpartition(":")[0]
    roots = [*job.get("pythonpath", []), *([module] if module.endswith(".py") else [])]
    found = overlap(roots, protected)
    if found is not None:
        return found
    key = _passed_key(job, protected)
    if key in _PASSED:
        return None
    problem = _confined_check(job, protected, limit)
    if problem is None:
        if len(_PASSED) >= _PASSED_MOST:
            _PASSED.clear()
        _PASSED.add(key)
    return problem


def _passed_key(job: dict[str, Any], protected: list[str]) -> tuple:
    """What a passed check depends on: the job's entry and folders, the protected paths, the
    sandbox mode, and the size and modification time of every file of the job's code. A
    package the code imports from elsewhere that changes later is not seen: the job's run
    then fails as it would have without the check."""
    from privsched.jobs.runner import _code_roots
    from privsched.jobs.sandbox import sandbox_mode

    pythonpath = list(job.get("pythonpath", []))
    files = []
    for root in _code_roots(str(job["function"]), pythonpath):
        for folder, _, names in os.walk(root) if os.path.isdir(root) else [(os.path.dirname(root), [], [os.path.basename(root)])]:
            if "__pycache__" in Path(folder).parts:  # compiled copies, rewritten by imports
                continue
            for name in names:
                try:
                    info = os.stat(os.path.join(folder, name))
                except OSError:
                    continue
                files.append((folder, name, info.st_size, info.st_mtime_ns))
    return (job["function"], tuple(pythonpath), tuple(protected), sandbox_mode(), tuple(sorted(files)))


def _confined_check(job: dict[str, Any], protected: list[str], limit: float) -> str | None:
    """Run the check in a process of its own (:func:`_main`)."""
    from privsched.service.executors.base import LAUNCH_TOKEN_ENV, without_secrets

    env = without_secrets(os.environ)
    env.pop(LAUNCH_TOKEN_ENV, None)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    private = Path(tempfile.mkdtemp(prefix="privsched-preflight-"))
    document = json.dumps({"job": job, "protected": protected, "private": str(private)})
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "privsched.service.preflight"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=private,
            env=env,
            start_new_session=True,
            text=True,
        )
        try:
            verdict, _ = process.communicate(document, timeout=limit)
        except subprocess.TimeoutExpired:
            return f"the job's module did not finish importing within {limit:g} s"
        finally:
            _end_group(process)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    if process.returncode == 0:
        return None
    lines = verdict.strip().splitlines()
    return lines[-1] if lines else f"the import check ended with code {process.returncode}"


def _end_group(process: subprocess.Popen) -> None:
    """Kill the check's process and whatever it started."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _check_in_sandbox(document: dict[str, Any]) -> str | None:
    """In the check's own process: confine it as the job will be, import the job and check its
    function; why it fails, or None."""
    import inspect

    from privsched.budgets.accounting import Accounting
    from privsched.jobs.context import JobContext
    from privsched.jobs.runner import job_confinement, load_function
    from privsched.jobs.sandbox import SandboxError, abi_version, confine, exposed, sandbox_mode

    job, private = document["job"], Path(document["private"])
    workdir = private / "work"
    for folder in (workdir, private / "tmp"):
        folder.mkdir(mode=0o700)
    if sandbox_mode() == "landlock" and abi_version() > 0:  # else no job runs confined here either
        ctx = JobContext(0, "preflight", "", Accounting.basic(), 0.0, {}, workdir=workdir)
        rules = job_confinement({"job": job}, ctx, private, False)
        hits = exposed(rules.read + rules.write, document["protected"])
        if hits:
            keep = "keep the ledger and the data out of the Python environment and the job's code"
            return f"{hits[0]} lies in a folder the job may read ({keep})"
        try:
            confine(rules)
        except SandboxError as exc:
            return f"the job cannot be confined: {exc}"
    os.chdir(workdir)
    try:
        function = load_function(job["function"], job.get("pythonpath", ()))
    except BaseException as exc:  # the job's own import failure, whatever it is
        return f"{job['function']} does not import: {type(exc).__name__}: {exc}"
    try:
        inspect.signature(function).bind(None)
    except TypeError:
        return f"{job['function']} must take one argument (the job's context)"
    except ValueError:  # no signature to read (a builtin): let the job's run decide
        pass
    return None


def _main() -> int:
    """The check's process: reads its document on stdin, prints why the job cannot run."""
    verdict = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the job's module prints goes nowhere near the verdict
    problem = _check_in_sandbox(json.loads(sys.stdin.read()))
    if problem is None:
        return 0
    from privsched.errors import one_line

    verdict.write(one_line(problem) + "\n")
    verdict.flush()
    return 1


def needed_columns(job: dict) -> list[str]:
    """The per-record columns a built-in job reads (none for user code)."""
    params = job.get("params") or {}
    if job.get("kind") == "statistic":
        return [params["column"]] if params.get("column") else []
    if job.get("kind") == "dpsgd":
        from privsched.trainers.plans import parse_job

        return parse_job({"kind": "dpsgd", **params}).columns  # type: ignore[union-attr]
    return []


def input_problem(job: dict, locations: dict[str, str | None], workdir: Path) -> str | None:
    """Why a built-in job could not read its granted blocks (relative locations resolve
    from ``workdir``, the job's working folder), or None when it can."""
    if not job.get("kind"):
        return None
    from privsched.trainers.plans import parse_job

    try:
        parse_job({"kind": job["kind"], **(job.get("params") or {})})
    except ValueError as exc:
        return f"its parameters are not valid ({exc})"
    wanted = needed_columns(job)
    for key, location in locations.items():
        if location is None:
            return f"block {key!r} has no data location"
        path = workdir / location
        if not (path.is_file() or path.is_dir() and is_parquet(path)):
            return f"the data of block {key!r} is missing ({location})"
        try:
            columns = record_columns(path)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            return f"the data of block {key!r} cannot be read ({type(exc).__name__}: {exc})"
        for name in wanted:
            if name not in columns:
                held = ", ".join(sorted(columns)) or "none"
                return f"block {key!r} has no column {name!r} (it holds {held})"
        if job.get("kind") == "dpsgd":
            from privsched.trainers.plans import parse_job, undeclared

            problem = undeclared(parse_job({"kind": "dpsgd", **(job.get("params") or {})}), record_dtypes(path))  # type: ignore[arg-type]
            if problem is not None:
                return f"block {key!r}: {problem}"
    return None


def record_columns(path: Path) -> set[str]:
    """Names of the per-record columns of a block file: a Parquet file's columns, read from
    its footer only (a user block's folder: its first segment's); an ``.npz`` file's
    per-record arrays, read from the array headers only."""
    if is_parquet(path):
        import pyarrow.parquet as pq

        return set(pq.read_schema(_footer_file(path)).names)
    return {name for name, (shape, _) in array_headers(path).items() if name not in METADATA and len(shape) >= 1}


def record_dtypes(path: Path) -> dict[str, str]:
    """The kind (NumPy's ``dtype.kind``) of every column of a block file, from a Parquet
    file's footer or an ``.npz`` file's array headers (its declared scalars included)."""
    if is_parquet(path):
        import pyarrow.parquet as pq

        return {field.name: _arrow_kind(field.type) for field in pq.read_schema(_footer_file(path))}
    return {name: dtype.kind for name, (_, dtype) in array_headers(path).items()}


def _footer_file(path: Path) -> Path:
    """The Parquet file whose footer tells a block's columns: the block's file, or a user
    block folder's first segment."""
    if not path.is_dir():
        return path
    segments = sorted(path.glob("*.parquet"))
    if not segments:
        raise ValueError("the user block holds no segment")
    return segments[0]


def _arrow_kind(arrow_type: Any) -> str:
    """The NumPy kind an Arrow column reads as (``O`` for strings and other objects)."""
    try:
        return np.dtype(arrow_type.to_pandas_dtype()).kind
    except (NotImplementedError, TypeError):
        return "O"


def array_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The shape and type of every array in a ``.npz`` file, read from its headers only."""
    headers = {}
    with zipfile.ZipFile(path) as archive:
        for entry in archive.namelist():
            if not entry.endswith(".npy"):
                continue
            with archive.open(entry) as member:
                version = np.lib.format.read_magic(member)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read_header(member)
            headers[entry.removesuffix(".npy")] = (shape, dtype)
    return headers


if __name__ == "__main__":
    sys.exit(_main())

"""Checks a built-in job's inputs before it starts, so that budget is never burnt on a job
that could not read its data.

A built-in job (``kind: statistic`` or ``dpsgd``) reads each granted block's ``.npz`` file
(:mod:`privsched.jobs.records`). Before it is started, every granted block must have a
location naming an existing file, and that file must hold the per-record columns the job
reads (a statistic's ``column``; DP-SGD's ``tokens`` and its ``target``). Only the file's
array names and shapes are read (its zip directory and ``.npy`` headers), never its records,
so the check releases nothing about the data. Its parameters must be valid too (a pipeline
stored by an older privsched may name a statistic's noise ``mechanism``, now refused). A job
that fails the check is failed before it touched data, so its grant is released
(docs/design.md §4.4). User code is not checked: what it
reads is up to it, and a failure after reading is charged as usual.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from privsched.jobs.records import METADATA


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
        if not path.is_file():
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
    """Names of the per-record arrays (one row per record) in a block's ``.npz`` file, read
    from the array headers only."""
    return {name for name, (shape, _) in array_headers(path).items() if name not in METADATA and len(shape) >= 1}


def record_dtypes(path: Path) -> dict[str, str]:
    """The kind (NumPy's ``dtype.kind``) of every array in a block's ``.npz`` file, its
    declared scalars included, from the array headers only."""
    return {name: dtype.kind for name, (_, dtype) in array_headers(path).items()}


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

"""Checks a built-in job's inputs before it starts, so that budget is never burnt on a job
that could not read its data.

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

import zipfile
from pathlib import Path

import numpy as np

from privsched.jobs.records import METADATA, is_parquet


def needed_columns(job: dict) -> list[str]:
    """The per-record columns a built-in job reads (none for user code)."""
    params = job.get("params") or {}
    if job.get("kind") == "statistic":
        return [params["column"]] if params.get("column") else []
    if job.get("kind") == "dpsgd":
        return ["tokens", str(params.get("target", "sentiment"))]
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
    return None


def record_columns(path: Path) -> set[str]:
    """Names of the per-record columns of a block file: a Parquet file's columns, read from
    its footer only (a user block's folder: its first segment's); an ``.npz`` file's
    per-record arrays, read from the array headers only."""
    if is_parquet(path):
        import pyarrow.parquet as pq

        if path.is_dir():
            segments = sorted(path.glob("*.parquet"))
            if not segments:
                raise ValueError("the user block holds no segment")
            path = segments[0]
        return set(pq.read_schema(path).names)
    columns = set()
    with zipfile.ZipFile(path) as archive:
        for entry in archive.namelist():
            name = entry.removesuffix(".npy")
            if name in METADATA or not entry.endswith(".npy"):
                continue
            with archive.open(entry) as member:
                version = np.lib.format.read_magic(member)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, _ = read_header(member)
            if len(shape) >= 1:
                columns.add(name)
    return columns

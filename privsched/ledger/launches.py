"""Launch records: whether the job process of a running pipeline ever started.

A launch goes ``launching`` → ``started``. The scheduler records ``launching`` with a fresh
random token in the same transaction that moves the pipeline granted → running, before any
process exists, and ``started`` with the process id and start time once it does. A
recovering scheduler reads the record: ``launching`` with no process ever spawned means the
job never touched data (its grant is released); a process that was spawned is found (by its
id, or by the token in its environment) and adopted, or settled conservatively
(docs/design.md §4.4). ``docs/recovery.md`` walks through every crash point.
"""

from __future__ import annotations

from dataclasses import dataclass

from privsched.ledger.database import Database


@dataclass(frozen=True)
class LaunchRecord:
    pipeline_id: int
    token: str  # put in the job process's environment, to find it by
    generation: int | None  # the scheduler lease generation that launched it
    state: str  # "launching" or "started"
    pid: int | None  # the job process (local executor), once started
    start_ticks: str | None  # its start time in clock ticks since boot, telling it from a reused pid
    at: float


def create_table(db: Database) -> None:
    db.table("launches").create(
        {"pipeline_id": int, "token": str, "generation": int, "state": str, "pid": int, "start_ticks": str, "at": float},
        pk="pipeline_id",
        foreign_keys=[("pipeline_id", "pipelines", "id")],
        not_null=["token", "state", "at"],
        strict=True,
    )


def record_launching(db: Database, pipeline_id: int, token: str, generation: int | None, now: float) -> None:
    db.execute(
        "INSERT OR REPLACE INTO launches (pipeline_id, token, generation, state, at) VALUES (?, ?, ?, 'launching', ?)",
        [pipeline_id, token, generation, now],
    )


def record_started(db: Database, pipeline_id: int, token: str, pid: int | None, start_ticks: str | None, now: float) -> bool:
    """Mark a launch started; False if no launch of that pipeline has this token."""
    cursor = db.execute(
        "UPDATE launches SET state = 'started', pid = ?, start_ticks = ?, at = ? WHERE pipeline_id = ? AND token = ?",
        [pid, start_ticks, now, pipeline_id, token],
    )
    return cursor.rowcount == 1


def read(db: Database, pipeline_ids: list[int]) -> dict[int, LaunchRecord]:
    found = db.execute(
        "SELECT pipeline_id, token, generation, state, pid, start_ticks, at FROM launches "
        "WHERE pipeline_id IN (SELECT value FROM json_each(?))",
        [str(list(pipeline_ids))],
    ).fetchall()
    return {row[0]: LaunchRecord(*row) for row in found}

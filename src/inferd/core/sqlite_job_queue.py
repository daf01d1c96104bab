"""`SqliteJobQueue`: the embedded durable job queue, one SQLite database in the state directory.

SQLite in WAL mode: a commit is in the log before `submit` returns, so a `kill -9` at any moment
loses no job that was answered 202 (synchronous=NORMAL: a power cut may lose the last commits, a
process crash none). Every change is one transaction, so a job is never half leased or half ended.

The log is copied into the database by SQLite's own checkpoints (inside the commit that fills it
past 1,000 pages), and cut back to JOURNAL_SIZE_LIMIT after each: with bodies in the rows, a log
left to grow would fill the state disk while a backlog drains. (A checkpoint on a thread of its
own, tried once, never let the log start over under a steady load of commits.)

One server owns the database (SQLite does not share a queue between hosts: that is what
`--async-queue redis://` is for). Leases still matter to it: a job that was running when the
server died has a lease that runs out, and the next lease (after the restart) runs it again,
with a token one higher, so nothing the dead run could still do ends it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferd.core.async_jobs import Backlog, Job, JobDoor, JobEnd, JobQuery, JobRequest, JobState, Lease, LeaseLength

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    door TEXT NOT NULL,
    content_type TEXT NOT NULL,
    accept TEXT NOT NULL,
    header_length INTEGER,
    input_location TEXT NOT NULL,
    output_location TEXT NOT NULL,
    failure_location TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    ttl_s REAL,
    timeout_s REAL,
    priority INTEGER NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    token INTEGER NOT NULL,
    lease_until REAL NOT NULL,
    not_before REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    error TEXT NOT NULL,
    error_code TEXT NOT NULL,
    notify_pending INTEGER NOT NULL,
    dead_lettered INTEGER NOT NULL,
    body BLOB
);
CREATE INDEX IF NOT EXISTS jobs_to_run ON jobs (state, priority DESC, submitted_at);
CREATE INDEX IF NOT EXISTS jobs_by_model ON jobs (model, state);
CREATE INDEX IF NOT EXISTS jobs_by_lease ON jobs (state, lease_until);
CREATE INDEX IF NOT EXISTS jobs_to_notify ON jobs (notify_pending) WHERE notify_pending = 1;
"""

_COLUMNS = (
    "id", "model", "version", "door", "content_type", "accept", "header_length", "input_location",
    "output_location", "failure_location", "submitted_at", "ttl_s", "timeout_s", "priority", "state", "attempts",
    "token", "lease_until", "not_before", "started_at", "ended_at", "error", "error_code", "notify_pending",
    "dead_lettered",
)  # fmt: skip
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
# A lease reads the body the queue keeps too (no other read does: a list of jobs is not their bodies).
_SELECT_WITH_BODY = f"SELECT {', '.join(_COLUMNS)}, body FROM jobs"


# The log's size on disk after a checkpoint (see the module's docstring).
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024


class SqliteJobQueue:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # One connection, used under a lock: the queue's calls come from the server's worker
        # threads and its /metrics thread alike.
        self._connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._lock = threading.Lock()
        with self._lock:
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=NORMAL")
            self._connection.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
            self._connection.executescript(_SCHEMA)
            columns = {row[1] for row in self._connection.execute("PRAGMA table_info(jobs)")}
            if "body" not in columns:  # a state directory from before the queue kept bodies
                self._connection.execute("ALTER TABLE jobs ADD COLUMN body BLOB")

    def submit(self, job: Job, body: bytes | None = None) -> tuple[Job, bool]:
        with self._lock, self._transaction() as db:
            inserted = db.execute(
                f"INSERT OR IGNORE INTO jobs ({', '.join(_COLUMNS)}, body)"
                f" VALUES ({', '.join('?' * (len(_COLUMNS) + 1))})",
                (*_row(job), body),
            ).rowcount
            kept = job if inserted else self._one(db, job.id)
        assert kept is not None
        return kept, bool(inserted)

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._one(self._connection, job_id)

    def query(self, query: JobQuery) -> list[Job]:
        clauses, values = [], []
        if query.model:
            clauses.append("model = ?")
            values.append(query.model)
        if query.state is not None:
            clauses.append("state = ?")
            values.append(query.state.value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._lock:
            rows = self._connection.execute(
                f"{_SELECT}{where} ORDER BY submitted_at DESC LIMIT ?", (*values, query.limit)
            ).fetchall()
        return [_job(row) for row in rows]

    def recover(self, now: float) -> int:
        # This server owns the database: whatever is running is what it was running.
        with self._lock:
            return int(
                self._connection.execute(
                    "UPDATE jobs SET lease_until = 0 WHERE state = 'running' AND lease_until >= ?", (now,)
                ).rowcount
            )

    def lease(self, now: float, lease_s: LeaseLength) -> Lease | None:
        leases = self.lease_many(now, lease_s, 1)
        return leases[0] if leases else None

    def lease_many(self, now: float, lease_s: LeaseLength, limit: int) -> list[Lease]:
        # Two walks of an index, each stopping at `limit`: running jobs whose lease ran out, and
        # queued ones by priority and age (a job waiting out a backoff is skipped; they are few);
        # then the two merged by priority and age. One `OR` of both would scan every open job.
        with self._lock, self._transaction() as db:
            expired = db.execute(
                f"{_SELECT_WITH_BODY} WHERE state = 'running' AND lease_until < ?"
                " ORDER BY priority DESC, submitted_at LIMIT ?",
                (now, limit),
            ).fetchall()
            queued = db.execute(
                f"{_SELECT_WITH_BODY} WHERE state = 'queued' AND not_before <= ?"
                " ORDER BY priority DESC, submitted_at LIMIT ?",
                (now, limit),
            ).fetchall()
            found = sorted(((_job(row[:-1]), row[-1]) for row in expired + queued),
                           key=lambda found: (-found[0].priority, found[0].submitted_at))[:limit]  # fmt: skip
            leases = []
            for job, body in found:
                leased = job.with_state(
                    JobState.RUNNING,
                    attempts=job.attempts + 1,
                    token=job.token + 1,
                    lease_until=now + lease_s(job.timeout_s),
                    started_at=job.started_at if job.started_at is not None else now,
                )
                db.execute(
                    "UPDATE jobs SET state = 'running', attempts = ?, token = ?, lease_until = ?, started_at = ?"
                    " WHERE id = ?",
                    (leased.attempts, leased.token, leased.lease_until, leased.started_at, job.id),
                )
                leases.append(Lease(leased, leased.token, body))
        return leases

    def extend(self, lease: Lease, until: float) -> bool:
        with self._lock:
            changed = self._connection.execute(
                "UPDATE jobs SET lease_until = ? WHERE id = ? AND token = ? AND state = 'running'",
                (until, lease.job.id, lease.token),
            ).rowcount
        return bool(changed)

    def end_many(self, ends: Sequence[JobEnd], now: float) -> list[bool]:
        with self._lock, self._transaction() as db:
            return [
                bool(
                    db.execute(
                        "UPDATE jobs SET state = ?, ended_at = ?, error = ?, error_code = ?, notify_pending = ?,"
                        " dead_lettered = ?, body = NULL WHERE id = ? AND token = ? AND state = 'running'",
                        (end.state.value, now, end.error, end.error_code, int(end.notify), int(end.dead_lettered),
                         end.lease.job.id, end.lease.token),
                    ).rowcount
                )
                for end in ends
            ]  # fmt: skip

    def requeue(self, lease: Lease, not_before: float, error: str) -> bool:
        with self._lock:
            changed = self._connection.execute(
                "UPDATE jobs SET state = 'queued', not_before = ?, error = ? WHERE id = ? AND token = ?"
                " AND state = 'running'",
                (not_before, error, lease.job.id, lease.token),
            ).rowcount
        return bool(changed)

    def cancel(self, job_id: str, now: float) -> Job | None:
        with self._lock, self._transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'cancelled', ended_at = ?, body = NULL WHERE id = ? AND state = 'queued'",
                (now, job_id),
            )
            return self._one(db, job_id)

    def expire(self, now: float) -> list[Job]:
        with self._lock, self._transaction() as db:
            rows = db.execute(
                f"{_SELECT} WHERE state = 'queued' AND ttl_s IS NOT NULL AND submitted_at + ttl_s < ?", (now,)
            ).fetchall()
            for row in rows:
                db.execute(
                    "UPDATE jobs SET state = 'expired', ended_at = ?, error = ?, body = NULL WHERE id = ?",
                    (now, "its TTL passed before it ran", row[0]),
                )
        return [_job(row).with_state(JobState.EXPIRED, ended_at=now) for row in rows]

    def pending_notifications(self, limit: int) -> list[Job]:
        with self._lock:
            rows = self._connection.execute(f"{_SELECT} WHERE notify_pending = 1 LIMIT ?", (limit,)).fetchall()
        return [_job(row) for row in rows]

    def notified(self, job_id: str) -> None:
        with self._lock:
            self._connection.execute("UPDATE jobs SET notify_pending = 0 WHERE id = ?", (job_id,))

    def backlog(self, now: float) -> Sequence[Backlog]:
        with self._lock:
            rows = self._connection.execute(
                "SELECT model, COUNT(*), MIN(submitted_at) FROM jobs WHERE state IN ('queued', 'running')"
                " GROUP BY model ORDER BY model"
            ).fetchall()
        return [Backlog(model, count, max(0.0, now - oldest)) for model, count, oldest in rows]

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._connection)

    @staticmethod
    def _one(db: sqlite3.Connection, job_id: str) -> Job | None:
        row = db.execute(f"{_SELECT} WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an exception): the write lock taken at the start, so
    a read and the write it decides are one step."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def __enter__(self) -> sqlite3.Connection:
        self._connection.execute("BEGIN IMMEDIATE")
        return self._connection

    def __exit__(self, kind: object, *_: object) -> None:
        self._connection.execute("COMMIT" if kind is None else "ROLLBACK")


def _row(job: Job) -> tuple[Any, ...]:
    request = job.request
    return (
        job.id, request.model, request.version, request.door.value, request.content_type, request.accept,
        request.header_length, job.input_location, job.output_location, job.failure_location, job.submitted_at,
        job.ttl_s, job.timeout_s, job.priority, job.state.value, job.attempts, job.token, job.lease_until,
        job.not_before, job.started_at, job.ended_at, job.error, job.error_code, int(job.notify_pending),
        int(job.dead_lettered),
    )  # fmt: skip


def _job(row: Sequence[Any]) -> Job:
    values = dict(zip(_COLUMNS, row, strict=True))
    request = JobRequest(
        values["model"], values["version"], JobDoor(values["door"]), values["content_type"], values["accept"],
        values["header_length"],
    )  # fmt: skip
    return Job(
        id=values["id"],
        request=request,
        input_location=values["input_location"],
        output_location=values["output_location"],
        failure_location=values["failure_location"],
        submitted_at=values["submitted_at"],
        ttl_s=values["ttl_s"],
        timeout_s=values["timeout_s"],
        priority=values["priority"],
        state=JobState(values["state"]),
        attempts=values["attempts"],
        token=values["token"],
        lease_until=values["lease_until"],
        not_before=values["not_before"],
        started_at=values["started_at"],
        ended_at=values["ended_at"],
        error=values["error"],
        error_code=values["error_code"],
        notify_pending=bool(values["notify_pending"]),
        dead_lettered=bool(values["dead_lettered"]),
    )

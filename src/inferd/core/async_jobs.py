"""Asynchronous inference jobs: what a job is, the states it moves through, and the queue it waits
in (`JobQueue`, which `core.sqlite_job_queue` implements in the state directory).

A job is a request kept for later: submitted now (answered 202 at once), run in the background
admission class when a worker leases it, and ended by exactly one result (or one failure
document) at a location the operator chose. Delivery is at least once: a worker that dies
holding a job loses its lease, and another lease runs the job again. So every step after the
lease is idempotent (the result is written once per key, a retry finds it) and fenced: each lease
carries a token one higher than the last, and only the holder of the latest token may end the job.

States (SageMaker's async inference has the same, bar `cancelled` and `expired`):

    queued -> running -> succeeded | failed
    queued -> cancelled (DELETE, only while queued) | expired (its TTL passed before it ran)
    running -> queued (a transient refusal: overloaded, not ready; retried with backoff)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any, Protocol


def iso_time(seconds: float) -> str:
    """A wall-clock time (time.time()) as RFC 3339 in UTC, to the millisecond: how jobs report times."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def ended(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


class JobDoor(enum.StrEnum):
    """The door a job came by: its stored body is read, and its result written, as that door's."""

    KSERVE = "kserve"
    SAGEMAKER = "sagemaker"


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a submit asks for: the model (or endpoint) and how to read its body, kept with the job."""

    model: str
    version: str = ""
    door: JobDoor = JobDoor.KSERVE
    # The stored body's headers, as the door reads them (content type, v2's binary header length, accept).
    content_type: str = "application/json"
    accept: str = ""
    header_length: int | None = None


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    request: JobRequest
    # Where the body is (a payload the server stored, the caller's location, or IN_QUEUE: a small
    # body kept in the queue with the job), and where the result or the failure document goes (the
    # server chose both).
    input_location: str
    output_location: str
    failure_location: str
    submitted_at: float  # wall clock (time.time()), as reported
    ttl_s: float | None = None
    timeout_s: float | None = None
    priority: int = 0
    state: JobState = JobState.QUEUED
    attempts: int = 0
    # The fencing token of the latest lease; 0 before any.
    token: int = 0
    # Until when the latest lease holds (time.time()); a running job past it may be leased again.
    lease_until: float = 0.0
    # Not before this (time.time()): a job put back after a transient refusal waits out its backoff.
    not_before: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    error: str = ""
    error_code: str = ""
    # Notifications still owed for this job's end (its outbox): sent at least once each.
    notify_pending: bool = False
    dead_lettered: bool = False

    def with_state(self, state: JobState, **changes: object) -> Job:
        return replace(self, state=state, **changes)  # type: ignore[arg-type]

    def document(self) -> dict[str, Any]:
        """The job as plain JSON values (what a queue that stores documents keeps)."""
        document = {f.name: getattr(self, f.name) for f in fields(self)}
        document["request"] = {f.name: getattr(self.request, f.name) for f in fields(self.request)}
        return document

    @staticmethod
    def from_document(document: dict[str, Any]) -> Job:
        values = dict(document)
        request = dict(values.pop("request"))
        request["door"] = JobDoor(request["door"])
        values["state"] = JobState(values["state"])
        return Job(request=JobRequest(**request), **values)


# The input location of a job whose body the queue keeps with it (a small inline body: one row,
# no object to write, flush and delete).
IN_QUEUE = ""

# How long a lease holds for a job of a timeout (None: the job gave none).
LeaseLength = Callable[[float | None], float]


@dataclass(frozen=True, slots=True)
class Lease:
    """A job a worker holds: only `token` may end it (a later lease's token fences this one out)."""

    job: Job
    token: int
    # The body, when the queue keeps it (the job's input location is IN_QUEUE).
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class JobEnd:
    """How a leased job ends: its state, why (for a failure), and whether notices are owed."""

    lease: Lease
    state: JobState
    error: str = ""
    error_code: str = ""
    notify: bool = False
    dead_lettered: bool = False


@dataclass(frozen=True, slots=True)
class Backlog:
    """One model's jobs not ended yet (queued or running): how many, and how long the oldest has waited."""

    model: str
    jobs: int
    oldest_age_s: float


@dataclass(frozen=True, slots=True)
class JobQuery:
    model: str = ""
    state: JobState | None = None
    limit: int = 100


class JobQueue(Protocol):
    """A durable queue of jobs. Every method is blocking (a database or a network call): the server
    calls them on a thread of their own."""

    def submit(self, job: Job, body: bytes | None = None) -> tuple[Job, bool]:
        """Keep `job` queued (with `body`, when its input location is IN_QUEUE); when a job of its
        id exists, that job, untouched. True when new."""
        ...

    def get(self, job_id: str) -> Job | None: ...

    def query(self, query: JobQuery) -> list[Job]:
        """Jobs, newest first."""
        ...

    def recover(self, now: float) -> int:
        """At a server's start: jobs this server was running when it stopped may be leased again at
        once (a queue shared by several servers leaves them to their leases); how many."""
        ...

    def lease(self, now: float, lease_s: LeaseLength) -> Lease | None:
        """The next job to run (highest priority, then oldest; a running job whose lease ran out
        counts as queued), now running under a new token until `now + lease_s(its timeout_s)`, with
        its body when the queue keeps it; None when none."""
        ...

    def lease_many(self, now: float, lease_s: LeaseLength, limit: int) -> list[Lease]:
        """Up to `limit` jobs leased at once, in `lease`'s order (one round trip, where the queue can)."""
        ...

    def extend(self, lease: Lease, until: float) -> bool:
        """Hold the lease until `until`; False when it was fenced out (another lease holds the job)."""
        ...

    def end_many(self, ends: Sequence[JobEnd], now: float) -> list[bool]:
        """End leased jobs (at once, where the queue can: the ends of jobs that finish together are
        one commit), letting go of the bodies it kept; for each, False (and nothing changed) when
        it was fenced out."""
        ...

    def requeue(self, lease: Lease, not_before: float, error: str) -> bool:
        """Put the leased job back, to be leased again not before `not_before`."""
        ...

    def cancel(self, job_id: str, now: float) -> Job | None:
        """Cancel the job if it is queued; the job as it is after (None when unknown)."""
        ...

    def expire(self, now: float) -> list[Job]:
        """Queued jobs whose TTL has passed, now expired."""
        ...

    def pending_notifications(self, limit: int) -> list[Job]: ...

    def notified(self, job_id: str) -> None: ...

    def backlog(self, now: float) -> Sequence[Backlog]: ...

    def close(self) -> None: ...

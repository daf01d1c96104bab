"""`AsyncInference`: asynchronous inference, from the submit to the one result and its notices.

A submit keeps the body (a small inline body in the queue, with its job; a larger one in the
payload path; a caller's location is only checked) and a queued job in a durable queue
(`core.async_jobs`), and is answered at once. Workers lease
jobs and run each through the door it came by (`replay`, the same inference call as a real-time
request, in the background admission class, so jobs batch with each other and yield to real-time
requests). Each ends with exactly one object: the result at its output location, or a failure
document at its failure location, written once per key (`core.job_storage`). The ends of jobs
that finish together are written together (a group commit: their objects flushed to disk in one
pass, their ends one transaction of the queue), so a job's end costs the disk a share of one
flush rather than several of its own. Then its notifications are owed (an outbox in the queue),
sent at least once each, with the job's id as their idempotency key.

What can go wrong, and what the job does:
- the model refuses for now (overloaded, not ready, unavailable): put back, retried with backoff;
- the model refuses the request (a 4xx: bad input, it raised), or the job runs past its timeout:
  failed, with a failure document that says why;
- the server dies holding it: its lease runs out (at once, for the embedded queue, when the server
  starts again) and it runs again; a result written before the crash is found and kept;
- it keeps failing so (`max_attempts` leases): failed as a dead letter, never left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from inferd.core.async_jobs import IN_QUEUE, Backlog, Job, JobEnd, JobQuery, JobQueue, JobRequest, JobState, Lease
from inferd.core.job_storage import JobStorage, StoredObject, Written, check_job_id, new_job_id
from inferd.errors import ErrorCode, InferdError, NotFoundError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Refusals that say "not now": the job is put back and leased again after a backoff.
TRANSIENT = frozenset({ErrorCode.OVERLOADED, ErrorCode.UNAVAILABLE, ErrorCode.MODEL_NOT_READY})
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# How long a lease outlives the job's timeout: the margin a worker has to write the result.
LEASE_MARGIN_S = 60.0
# Notifications: tries per job (with backoff up to NOTIFY_BACKOFF_MAX_S), then given up and logged.
NOTIFY_TRIES = 12
NOTIFY_BACKOFF_MAX_S = 300.0
# The longest a GET may wait for a job's end (?wait_s=).
MAX_WAIT_S = 120.0
# Inline bodies up to this size are kept in the queue with their job (one row: no object written,
# flushed and deleted); larger ones in the payload path.
QUEUE_BODY_MAX_BYTES = 256 * 1024
# The most job ends written together (a group commit).
MAX_ENDS_TOGETHER = 256
# Jobs running at once while real-time requests keep coming: a trickle, so a backlog still moves
# but takes little of the cores (its bookkeeping, files and transactions, is not the model's).
HELD_BACK_CONCURRENCY = 1


@dataclass(frozen=True, slots=True)
class Answer:
    """A job's answer as its door encodes it: the result object's bytes and content type."""

    body: bytes
    content_type: str


@dataclass(frozen=True, slots=True)
class _Ending:
    """How a job ends: its state and error, and what is written first (its result, or a failure
    document)."""

    state: JobState
    error: str = ""
    code: str = ""
    dead_lettered: bool = False
    answer: Answer | None = None
    document: bool = False


# Runs a job's stored body through the door it came by; raises InferdError as that door would.
Replay = Callable[[Job, bytes], Awaitable[Answer]]


class Notifier(Protocol):
    """Where a job's end is told (webhooks, SNS topics: the operator's, never a caller's)."""

    @property
    def configured(self) -> bool: ...

    def notify(self, job: Job) -> None:
        """Tell every target of `job`'s end (blocking); raises when one could not be told."""
        ...


@dataclass(frozen=True, slots=True)
class AsyncSettings:
    max_attempts: int = 3
    """Leases a job gets; after the last it ends failed, as a dead letter."""
    concurrency: int = 8
    """Jobs running at once (they batch with each other in the model's scheduler)."""
    default_timeout_s: float = 3600.0
    """A job's timeout when its submit gave none."""
    poll_s: float = 0.5
    """How often idle workers look for jobs another writer queued (a submit here wakes them at once)."""


class AsyncInference:
    def __init__(
        self,
        queue: JobQueue,
        storage: JobStorage,
        replay: Replay,
        notifier: Notifier,
        settings: AsyncSettings = AsyncSettings(),
        clock: Callable[[], float] = time.time,
        realtime_active: Callable[[], bool] = lambda: False,
    ) -> None:
        """`realtime_active`: whether real-time requests keep coming now (jobs then hold back)."""
        self._queue = queue
        self.storage = storage
        self._replay = replay
        self._notifier = notifier
        self._settings = settings
        self._clock = clock
        self._realtime_active = realtime_active
        # The queue's and the storage's calls block (SQLite, S3): a pool of their own, so they
        # take none of the default executor's threads.
        self._threads = ThreadPoolExecutor(settings.concurrency + 2, thread_name_prefix="inferd-async")
        self._work = asyncio.Event()
        self._ended = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        # Jobs running now, each a task (the feeder keeps at most `concurrency`).
        self._running: set[asyncio.Task[None]] = set()
        self._notify_tries: dict[str, tuple[int, float]] = {}
        # Job ends waiting to be written (by `_write_ends`, together), each with its waiter.
        self._ends: list[tuple[Lease, _Ending, asyncio.Future[bool]]] = []
        self._ends_due = asyncio.Event()
        self.backlog: Sequence[Backlog] = ()

    # -- the API's calls -----------------------------------------------------------------------

    async def submit(
        self,
        request: JobRequest,
        *,
        body: bytes | None = None,
        body_file: Path | None = None,
        input_location: str | None = None,
        job_id: str = "",
        ttl_s: float | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
        output_extension: str = "",
    ) -> tuple[Job, bool]:
        """Keep a job (from `body`, a spooled `body_file` it takes, or the caller's `input_location`);
        True when it is new. The same `job_id` again is the same job: nothing is kept twice.
        `output_extension`: folders under the output and failure paths its objects go in."""
        job_id = check_job_id(job_id) if job_id else new_job_id()
        kept, created = await self._blocking(
            self._keep, request, body, body_file, input_location, job_id, ttl_s, timeout_s, priority, output_extension
        )
        if created:
            self._work.set()
        return kept, created

    def _keep(
        self, request: JobRequest, body: bytes | None, body_file: Path | None, input_location: str | None,
        job_id: str, ttl_s: float | None, timeout_s: float | None, priority: int, output_extension: str,
    ) -> tuple[Job, bool]:  # fmt: skip
        """A submit's blocking steps, on one thread hop: the body kept, then the job (a body kept in
        the queue goes in the job's own row: a job of the same id there already keeps its own)."""
        kept_body = None
        extension = self.storage.output_extension(output_extension)
        if input_location is not None:
            location = self.storage.check_input(input_location)
        elif body_file is None and len(body or b"") <= QUEUE_BODY_MAX_BYTES:
            location, kept_body = IN_QUEUE, body or b""
        elif (existing := self._queue.get(job_id)) is not None:  # no object written for a repeat
            if body_file is not None:
                body_file.unlink(missing_ok=True)
            return existing, False
        elif body_file is not None:
            location = self.storage.payload_location(job_id)
            self.storage.adopt(location, body_file)
        else:
            location = self.storage.payload_location(job_id)
            self.storage.write_once(location, body or b"", request.content_type)
        job = Job(
            id=job_id,
            request=request,
            input_location=location,
            output_location=self.storage.output_location(job_id, extension),
            failure_location=self.storage.failure_location(job_id, extension),
            submitted_at=self._clock(),
            ttl_s=ttl_s,
            timeout_s=timeout_s,
            priority=priority,
        )
        return self._queue.submit(job, kept_body)

    async def get(self, job_id: str, wait_s: float = 0.0) -> Job:
        """The job; with `wait_s`, once it has ended or `wait_s` (at most MAX_WAIT_S) has passed."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
        while True:
            job = await self._blocking(self._queue.get, job_id)
            if job is None:
                raise NotFoundError(f"no async inference job '{job_id}'")
            left = deadline - time.monotonic()
            if job.state.ended or left <= 0:
                return job
            async with self._ended:
                # Woken by a job ending here; another server's jobs are seen at the next poll.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ended.wait(), min(left, self._settings.poll_s))

    async def cancel(self, job_id: str) -> Job:
        job = await self._blocking(self._queue.cancel, job_id, self._clock())
        if job is None:
            raise NotFoundError(f"no async inference job '{job_id}'")
        if job.state is JobState.CANCELLED:
            await self._discard(job)
        return job

    async def _discard(self, job: Job) -> None:
        with contextlib.suppress(OSError):  # an inline body is not needed once its job ended
            await self._blocking(self.storage.discard_payload, job.input_location)

    async def query(self, query: JobQuery) -> list[Job]:
        return await self._blocking(self._queue.query, query)

    # -- running -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers, the notifier and the upkeep (expiry, backlog), on the running loop."""
        recovered = self._queue.recover(self._clock())
        if recovered:
            logger.info("async inference: %d job(s) that were running when the server stopped run again", recovered)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._write_ends())]
        if self._settings.concurrency:  # 0: submits only; the servers sharing the queue run them
            self._tasks.append(loop.create_task(self._feed()))
        self._tasks.append(loop.create_task(self._upkeep()))
        if self._notifier.configured:
            self._tasks.append(loop.create_task(self._notifications()))

    async def stop(self) -> None:
        """Stop taking jobs; a job cut short keeps its lease and runs again after a restart. The
        blocking calls under way (a group of ends being written) finish before the queue closes."""
        tasks = [*self._tasks, *self._running]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._threads.shutdown, True)
        await loop.run_in_executor(None, self._close)

    def _close(self) -> None:
        self._queue.close()
        self.storage.close()

    async def _feed(self) -> None:
        """Lease jobs for the free slots (as many at once as are free: one round trip to the queue)
        and run each in a task of its own, at most `concurrency` at a time, or HELD_BACK_CONCURRENCY
        while real-time requests keep coming."""
        freed = asyncio.Event()

        def done(task: asyncio.Task[None]) -> None:
            self._running.discard(task)
            freed.set()

        while True:
            limit = HELD_BACK_CONCURRENCY if self._realtime_active() else self._settings.concurrency
            free = limit - len(self._running)
            if free <= 0:
                freed.clear()
                with contextlib.suppress(TimeoutError):  # also when the real-time traffic stops
                    await asyncio.wait_for(freed.wait(), self._settings.poll_s)
                continue
            self._work.clear()  # before the lease: a submit from now on wakes the feeder
            try:
                leases = await self._blocking(self._queue.lease_many, self._clock(), self._lease_s, free)
            except Exception:
                logger.exception("async inference: the queue could not lease jobs")
                leases = []
            if not leases:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._work.wait(), self._settings.poll_s)
                continue
            for lease in leases:
                task = asyncio.get_running_loop().create_task(self._run_guarded(lease))
                self._running.add(task)
                task.add_done_callback(done)

    async def _run_guarded(self, lease: Lease) -> None:
        try:
            await self._run(lease)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # storage or queue trouble: run it again later (or dead-letter it)
            logger.exception("async inference: job '%s' could not be run", lease.job.id)
            backoff = BACKOFF_S[min(lease.job.attempts - 1, len(BACKOFF_S) - 1)]
            with contextlib.suppress(Exception):
                await self._blocking(self._queue.requeue, lease, self._clock() + backoff, str(exc))

    def _lease_s(self, timeout_s: float | None = None) -> float:
        """How long a lease holds for a job of `timeout_s`: its timeout, and a margin to write its end
        in (as long again, up to LEASE_MARGIN_S); then another worker may take the job."""
        timeout_s = timeout_s or self._settings.default_timeout_s
        return timeout_s + min(LEASE_MARGIN_S, timeout_s)

    async def _run(self, lease: Lease) -> None:
        job = lease.job
        prepared = await self._blocking(self._prepare, lease)
        if isinstance(prepared, _Ending):
            await self._settle(lease, prepared)
            return
        timeout_s = job.timeout_s or self._settings.default_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                answer = await self._replay(job, prepared)
        except TimeoutError:
            why = f"it did not finish within its timeout of {timeout_s:g} s"
            ending = _Ending(JobState.FAILED, why, ErrorCode.DEADLINE_UNREACHABLE.value, document=True)
        except InferdError as exc:
            if exc.code in TRANSIENT and job.attempts < self._settings.max_attempts:
                backoff = BACKOFF_S[min(job.attempts - 1, len(BACKOFF_S) - 1)]
                await self._blocking(self._queue.requeue, lease, self._clock() + backoff, exc.message)
                return
            ending = _Ending(JobState.FAILED, exc.message, exc.code.value, document=True)
        else:
            ending = _Ending(JobState.SUCCEEDED, answer=answer)
        await self._settle(lease, ending)

    def _prepare(self, lease: Lease) -> bytes | _Ending:
        """A leased job's blocking first steps, on one thread hop: its body, or how it ends without
        running (an earlier run's end found, a dead letter, an input that cannot be read)."""
        job = lease.job
        if job.attempts > 1:  # an earlier run may have written its end before it died
            if self.storage.exists(job.output_location):
                return _Ending(JobState.SUCCEEDED)
            if self.storage.exists(job.failure_location):
                return _Ending(JobState.FAILED, job.error or "failed before the server restarted", job.error_code)
        if job.attempts > self._settings.max_attempts:
            why = f"dead letter: gave up after {job.attempts - 1} attempts" + (
                f" (the last: {job.error})" if job.error else ""
            )
            code = job.error_code or ErrorCode.UNAVAILABLE.value
            return _Ending(JobState.FAILED, why, code, dead_lettered=True, document=True)
        if job.input_location == IN_QUEUE:
            if lease.body is None:  # the queue lost it (a key evicted from Redis, say)
                why = "its body is no longer in the queue"
                return _Ending(JobState.FAILED, why, ErrorCode.INVALID_ARGUMENT.value, document=True)
            return lease.body
        try:
            return self.storage.read(job.input_location)
        except (OSError, ValueError) as exc:
            why = f"its input location {job.input_location} could not be read: {exc}"
            return _Ending(JobState.FAILED, why, ErrorCode.INVALID_ARGUMENT.value, document=True)

    async def _settle(self, lease: Lease, ending: _Ending) -> None:
        """End the job, its end written with those of the jobs that finish with it (`_write_ends`)."""
        waiter = asyncio.get_running_loop().create_future()
        self._ends.append((lease, ending, waiter))
        self._ends_due.set()
        if not await waiter:
            logger.warning(
                "async inference: job '%s' was fenced out (a later lease holds it): its end is that lease's",
                lease.job.id,
            )

    async def _write_ends(self) -> None:
        """Write the ends waiting, together, one thread hop each time: the ends that arrive while
        one group is written are the next group, so the more jobs finish at once, the fewer flushes
        each costs, and a lone job waits for no company."""
        while True:
            await self._ends_due.wait()
            group, self._ends = self._ends[:MAX_ENDS_TOGETHER], self._ends[MAX_ENDS_TOGETHER:]
            if not self._ends:
                self._ends_due.clear()
            try:
                outcomes = await self._blocking(self._finish, [(lease, ending) for lease, ending, _ in group])
            except Exception as exc:  # the queue failed: each job runs again later (or dead-letters)
                outcomes = [exc] * len(group)
            for (_, _, waiter), outcome in zip(group, outcomes, strict=True):
                if waiter.done():  # its job was cancelled (the server stops)
                    continue
                if isinstance(outcome, Exception):
                    waiter.set_exception(outcome)
                else:
                    waiter.set_result(outcome)
            async with self._ended:
                self._ended.notify_all()

    def _finish(self, group: Sequence[tuple[Lease, _Ending]]) -> list[Written]:
        """Jobs' ends, on one thread hop: each job's one object written (its result, or its failure
        document), all flushed together; then the jobs whose object is safe ended in one
        transaction of the queue, and their stored bodies let go. For each job: True when ended,
        False when fenced out, or what stopped its object being written."""
        objects, owners = [], []
        for i, (lease, ending) in enumerate(group):
            job = lease.job
            if ending.answer is not None:
                objects.append(StoredObject(job.output_location, ending.answer.body, ending.answer.content_type))
                owners.append(i)
            if ending.document:
                document = self._failure_document(job, ending)
                objects.append(StoredObject(job.failure_location, document, "application/json"))
                owners.append(i)
        outcomes: list[Written] = [True] * len(group)
        for owner, written in zip(owners, self.storage.write_all_once(objects), strict=True):
            if isinstance(written, Exception):
                outcomes[owner] = written
        ending_now = [i for i, outcome in enumerate(outcomes) if not isinstance(outcome, Exception)]
        ends = [
            JobEnd(
                group[i][0], group[i][1].state, group[i][1].error, group[i][1].code,
                notify=self._notifier.configured, dead_lettered=group[i][1].dead_lettered,
            )
            for i in ending_now
        ]  # fmt: skip
        for i, ended in zip(ending_now, self._queue.end_many(ends, self._clock()), strict=True):
            outcomes[i] = ended
            if ended:
                with contextlib.suppress(OSError):  # an inline body is not needed once its job ended
                    self.storage.discard_payload(group[i][0].job.input_location)
        return outcomes

    def _failure_document(self, job: Job, ending: _Ending) -> bytes:
        document = {
            "inference_id": job.id,
            "model": job.request.model,
            "error": ending.error,
            "code": ending.code,
            "attempts": job.attempts,
            "dead_lettered": ending.dead_lettered,
            "submitted_at": job.submitted_at,
            "failed_at": self._clock(),
        }
        return json.dumps(document, indent=2).encode()

    # -- upkeep and notifications ------------------------------------------------------------

    async def _upkeep(self) -> None:
        while True:
            try:
                expired = await self._blocking(self._queue.expire, self._clock())
                for job in expired:
                    await self._discard(job)
                if expired:
                    async with self._ended:
                        self._ended.notify_all()
                self.backlog = await self._blocking(self._queue.backlog, self._clock())
            except Exception:
                logger.exception("async inference: upkeep failed")
            await asyncio.sleep(1.0)

    async def _notifications(self) -> None:
        while True:
            try:
                # Those waiting out a backoff, and 64 more: a receiver that refuses some never
                # holds up the notices of the others.
                owed = await self._blocking(self._queue.pending_notifications, 64 + len(self._notify_tries))
                for job in owed:
                    await self._notify(job)
            except Exception:
                logger.exception("async inference: notifications failed")
            await asyncio.sleep(self._settings.poll_s)

    async def _notify(self, job: Job) -> None:
        tries, next_at = self._notify_tries.get(job.id, (0, 0.0))
        if time.monotonic() < next_at:
            return
        try:
            await self._blocking(self._notifier.notify, job)
        except Exception as exc:
            tries += 1
            if tries < NOTIFY_TRIES:
                self._notify_tries[job.id] = (tries, time.monotonic() + min(2.0**tries, NOTIFY_BACKOFF_MAX_S))
                logger.warning("async inference: job '%s': notification failed (try %d): %s", job.id, tries, exc)
                return
            logger.error("async inference: job '%s': notification given up after %d tries: %s", job.id, tries, exc)
        self._notify_tries.pop(job.id, None)
        await self._blocking(self._queue.notified, job.id)

    async def _blocking(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: function(*args, **kwargs))

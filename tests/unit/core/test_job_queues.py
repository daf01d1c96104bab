"""Both job queues, the embedded one (SQLite) and the shared one (Redis Streams, on a real
redis-server): idempotent submits, leases by priority then age, fencing tokens, recovery after a
restart, backoff, cancel and expiry, the notification outbox, and the backlog."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from inferd.core.async_jobs import IN_QUEUE, Job, JobEnd, JobQuery, JobQueue, JobRequest, JobState, Lease
from inferd.core.redis_job_queue import RedisJobQueue
from inferd.core.sqlite_job_queue import JOURNAL_SIZE_LIMIT, SqliteJobQueue
from inferd.testing.redis_server import run_redis

pytestmark = pytest.mark.timeout(30)


def job(
    job_id: str, submitted_at: float = 100.0, priority: int = 0, ttl_s: float | None = None, model: str = "m"
) -> Job:
    return Job(
        id=job_id,
        request=JobRequest(model),
        input_location=f"file:///in/{job_id}",
        output_location=f"file:///out/{job_id}.out",
        failure_location=f"file:///out/{job_id}-error.out",
        submitted_at=submitted_at,
        ttl_s=ttl_s,
        priority=priority,
    )


def end(queue: JobQueue, lease: Lease, state: JobState, now: float, **how: object) -> bool:
    (ended,) = queue.end_many([JobEnd(lease, state, **how)], now)  # type: ignore[arg-type]
    return ended


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with run_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


Opener = Callable[[], JobQueue]


@pytest.fixture(params=["sqlite", "redis"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the queue (again, as a restarted server does: the same database, the same consumer)."""
    if request.param == "sqlite":
        return lambda: SqliteJobQueue(tmp_path / "jobs.sqlite")
    url = request.getfixturevalue("redis_url")
    prefix = f"test:{tmp_path.name}"  # each test its own keys
    return lambda: RedisJobQueue(url, consumer="server-1", prefix=prefix)


@pytest.fixture
def queue(opener: Opener) -> JobQueue:
    return opener()


def test_the_same_id_submitted_twice_is_one_job(queue: JobQueue) -> None:
    first, created = queue.submit(job("a"))
    again, created_again = queue.submit(job("a", submitted_at=200.0, priority=9))
    assert created and not created_again
    assert again == first and again.priority == 0
    assert [j.id for j in queue.query(JobQuery())] == ["a"]


def test_leases_take_the_highest_priority_then_the_oldest(queue: JobQueue) -> None:
    queue.submit(job("old", 100.0))
    queue.submit(job("new", 200.0))
    queue.submit(job("urgent", 300.0, priority=5))
    order = []
    while (lease := queue.lease(1000.0, lambda _: 60.0)) is not None:
        order.append(lease.job.id)
        assert lease.job.state is JobState.RUNNING and lease.job.attempts == 1 and lease.token == 1
    assert order == ["urgent", "old", "new"]


def test_a_lease_that_ran_out_is_taken_again_and_fences_out_the_first(queue: JobQueue) -> None:
    queue.submit(job("a"))
    first = queue.lease(1000.0, lambda _: 60.0)
    assert first is not None and queue.lease(1030.0, lambda _: 60.0) is None  # held
    second = queue.lease(1061.0, lambda _: 60.0)
    assert second is not None and second.token == first.token + 1 and second.job.attempts == 2
    assert not end(queue, first, JobState.SUCCEEDED, 1062.0)  # the late writer changes nothing
    assert not queue.extend(first, 5000.0)
    assert end(queue, second, JobState.SUCCEEDED, 1063.0, notify=True)
    ended = queue.get("a")
    assert ended is not None and ended.state is JobState.SUCCEEDED and ended.ended_at == 1063.0
    assert ended.notify_pending


def test_a_restarted_server_takes_back_what_it_was_running(opener: Opener) -> None:
    queue = opener()
    queue.submit(job("a"))
    assert queue.lease(1000.0, lambda _: 3600.0) is not None
    queue.close()  # as a kill -9 would leave it: running, leased for an hour
    again = opener()
    assert again.lease(1001.0, lambda _: 3600.0) is None
    assert again.recover(1001.0) == 1
    lease = again.lease(1001.0, lambda _: 3600.0)
    assert lease is not None and lease.job.attempts == 2 and lease.token == 2


def test_a_requeued_job_waits_out_its_backoff(queue: JobQueue) -> None:
    queue.submit(job("a"))
    lease = queue.lease(1000.0, lambda _: 60.0)
    assert lease is not None and queue.requeue(lease, 1010.0, "overloaded")
    assert queue.lease(1005.0, lambda _: 60.0) is None
    again = queue.lease(1011.0, lambda _: 60.0)
    assert again is not None and again.job.error == "overloaded" and again.job.attempts == 2


def test_only_a_queued_job_is_cancelled(queue: JobQueue) -> None:
    queue.submit(job("a"))
    queue.submit(job("b", 200.0))
    cancelled = queue.cancel("a", 1000.0)
    assert cancelled is not None and cancelled.state is JobState.CANCELLED
    assert queue.lease(1000.0, lambda _: 60.0).job.id == "b"  # type: ignore[union-attr]
    running = queue.cancel("b", 1001.0)
    assert running is not None and running.state is JobState.RUNNING
    assert queue.cancel("nobody", 1001.0) is None


def test_a_queued_job_past_its_ttl_expires_and_a_running_one_does_not(queue: JobQueue) -> None:
    queue.submit(job("short", 100.0, ttl_s=10.0))
    queue.submit(job("running", 100.0, priority=1, ttl_s=10.0))
    queue.submit(job("long", 100.0, ttl_s=1000.0))
    assert queue.lease(105.0, lambda _: 60.0).job.id == "running"  # type: ignore[union-attr]
    expired = queue.expire(111.0)
    assert [j.id for j in expired] == ["short"] and expired[0].state is JobState.EXPIRED
    assert queue.get("short").state is JobState.EXPIRED  # type: ignore[union-attr]
    assert queue.get("running").state is JobState.RUNNING  # type: ignore[union-attr]


def test_the_outbox_and_the_backlog(queue: JobQueue) -> None:
    queue.submit(job("a", 100.0, model="m"))
    queue.submit(job("b", 150.0, model="m"))
    queue.submit(job("c", 120.0, model="n"))
    lease = queue.lease(200.0, lambda _: 60.0)
    assert lease is not None and lease.job.id == "a"
    assert [(b.model, b.jobs, b.oldest_age_s) for b in queue.backlog(200.0)] == [("m", 2, 100.0), ("n", 1, 80.0)]
    end(queue, lease, JobState.FAILED, 201.0, error="boom", error_code="MODEL_RAISED", notify=True)
    assert [j.id for j in queue.pending_notifications(10)] == ["a"]
    queue.notified("a")
    assert queue.pending_notifications(10) == []
    assert [j.id for j in queue.query(JobQuery(model="m", state=JobState.FAILED))] == ["a"]


def test_servers_sharing_a_redis_queue_take_over_each_others_jobs(redis_url: str, tmp_path: Path) -> None:
    first = RedisJobQueue(redis_url, consumer="a", prefix=f"test:{tmp_path.name}")
    second = RedisJobQueue(redis_url, consumer="b", prefix=f"test:{tmp_path.name}")
    first.submit(job("one", 100.0))
    first.submit(job("two", 101.0))
    held = first.lease(1000.0, lambda _: 60.0)
    assert held is not None and held.job.id == "one"
    other = second.lease(1000.0, lambda _: 60.0)
    assert other is not None and other.job.id == "two"  # no job is leased twice
    assert second.lease(1030.0, lambda _: 60.0) is None
    taken = second.lease(1061.0, lambda _: 60.0)  # "a" died holding "one": "b" takes it over
    assert taken is not None and taken.job.id == "one" and taken.token == held.token + 1
    assert not end(first, held, JobState.SUCCEEDED, 1062.0)  # "a", late, is fenced out
    assert end(second, taken, JobState.SUCCEEDED, 1063.0)
    assert second.recover(1064.0) == 1  # "b" restarted: it takes back "two" at once
    again = second.lease(1064.0, lambda _: 60.0)
    assert again is not None and again.job.id == "two" and again.job.attempts == 2


def kept_body(queue: JobQueue, job_id: str) -> bytes | None:
    """The body the queue holds for a job, read behind its back (no call gives it but a lease)."""
    if isinstance(queue, SqliteJobQueue):
        row = queue._connection.execute("SELECT body FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else row[0]
    assert isinstance(queue, RedisJobQueue)
    body: bytes | None = queue._bodies.hget(queue._key("job", job_id), "body")
    return body


def test_a_body_kept_in_the_queue_comes_with_each_lease_and_goes_with_the_end(queue: JobQueue) -> None:
    body = bytes(range(256)) * 4  # bytes, not text
    queue.submit(replace(job("a"), input_location=IN_QUEUE), body)
    queue.submit(replace(job("b", 101.0), input_location=IN_QUEUE), b"{}")
    queue.submit(job("c", 102.0))
    first = queue.lease(1000.0, lambda _: 60.0)
    assert first is not None and first.job.id == "a" and first.body == body
    again = queue.lease(1061.0, lambda _: 60.0)  # its lease ran out: the next one has the body too
    assert again is not None and again.job.id == "a" and again.body == body
    assert end(queue, again, JobState.SUCCEEDED, 1062.0)
    assert kept_body(queue, "a") is None
    others = queue.lease_many(1063.0, lambda _: 60.0, 5)
    assert [(lease.job.id, lease.body) for lease in others] == [("b", b"{}"), ("c", None)]
    queue.submit(replace(job("d", 103.0), input_location=IN_QUEUE), b"[1]")
    assert queue.cancel("d", 1064.0) is not None and kept_body(queue, "d") is None


def test_ends_written_together_end_each_job_but_the_one_fenced_out(queue: JobQueue) -> None:
    for i, name in enumerate("abc"):
        queue.submit(job(name, 100.0 + i))
    late = queue.lease(1000.0, lambda _: 10.0)  # "a", whose lease runs out
    assert late is not None and late.job.id == "a"
    leases = queue.lease_many(1011.0, lambda _: 60.0, 3)  # "a" again, "b", "c"
    assert [lease.job.id for lease in leases] == ["a", "b", "c"]
    ends = [JobEnd(late, JobState.SUCCEEDED)] + [
        JobEnd(lease, state, error="boom" if state is JobState.FAILED else "", notify=True)
        for lease, state in zip(leases, (JobState.SUCCEEDED, JobState.FAILED, JobState.SUCCEEDED), strict=True)
    ]
    assert queue.end_many(ends, 1012.0) == [False, True, True, True]
    states = {j.id: (j.state, j.error) for j in queue.query(JobQuery())}
    assert states == {"a": (JobState.SUCCEEDED, ""), "b": (JobState.FAILED, "boom"), "c": (JobState.SUCCEEDED, "")}
    assert sorted(j.id for j in queue.pending_notifications(10)) == ["a", "b", "c"]


def test_the_embedded_queue_s_log_stays_bounded_while_bodies_come_and_go(tmp_path: Path) -> None:
    """Bodies in the rows pass through the log: 200 MB of them, submitted, leased and ended, leave a
    log of at most JOURNAL_SIZE_LIMIT (and a checkpoint's worth of pages) on disk."""
    queue = SqliteJobQueue(tmp_path / "jobs.sqlite")
    log = tmp_path / "jobs.sqlite-wal"
    largest = 0
    try:
        for i in range(1000):
            queue.submit(replace(job(f"j{i}"), input_location=IN_QUEUE), bytes(200_000))
            lease = queue.lease(1000.0, lambda _: 60.0)
            assert lease is not None and lease.body is not None
            assert end(queue, lease, JobState.SUCCEEDED, 1001.0)
            largest = max(largest, log.stat().st_size)
    finally:
        queue.close()
    assert largest < JOURNAL_SIZE_LIMIT + 8 * 1024 * 1024, f"the log grew to {largest >> 20} MB"

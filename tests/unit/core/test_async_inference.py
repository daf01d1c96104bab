"""Async inference's job lifecycle with a replay made to misbehave: one result per job, a failure
document for a refused request or a timeout, backoff on a transient refusal, a dead letter after
the last attempt, a result written before a crash kept, and notices owed until told."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferd.core.async_inference import QUEUE_BODY_MAX_BYTES, Answer, AsyncInference, AsyncSettings
from inferd.core.async_jobs import IN_QUEUE, Job, JobRequest, JobState
from inferd.core.job_storage import JobStorage, StoredObject, Written
from inferd.core.sqlite_job_queue import SqliteJobQueue
from inferd.errors import InvalidRequestError, ModelRaisedError, OverloadedError, PermissionDeniedError
from inferd.testing.fakes import FakeClock
from tests.unit.core.test_batcher import until

pytestmark = pytest.mark.timeout(30)


class Replay:
    """Answers each job's body upper-cased; raises what `raises` holds for a body, once per entry."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.raises: dict[bytes, list[Exception]] = {}
        self.sleep_s = 0.0
        self.gate: asyncio.Event | None = None  # when set: each job waits for it

    async def __call__(self, job: Job, body: bytes) -> Answer:
        self.calls.append(job.id)
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        if self.gate is not None:
            await self.gate.wait()
        pending = self.raises.get(body)
        if pending:
            raise pending.pop(0)
        return Answer(body.upper(), "text/plain")


class Notifier:
    def __init__(self, failures: int = 0) -> None:
        self.told: list[tuple[str, JobState]] = []
        self.failures = failures

    @property
    def configured(self) -> bool:
        return True

    def notify(self, job: Job) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("the receiver is down")
        self.told.append((job.id, job.state))


class Harness:
    def __init__(self, root: Path, notifier: Notifier | None = None, concurrency: int = 2) -> None:
        self.realtime_active = False
        self.root = root
        self.clock = FakeClock(1_000_000.0)
        self.replay = Replay()
        self.notifier = notifier or Notifier()
        self.storage = JobStorage(
            str(root / "payloads"), str(root / "out"), str(root / "failed"), (str(root / "inputs"),)
        )
        self.queue = SqliteJobQueue(root / "jobs.sqlite")
        settings = AsyncSettings(max_attempts=3, concurrency=concurrency, poll_s=0.01, default_timeout_s=5.0)
        self.jobs = AsyncInference(
            self.queue, self.storage, self.replay, self.notifier, settings, self.clock, lambda: self.realtime_active
        )

    async def ended(self, job_id: str) -> Job:
        for _ in range(500):
            job = await self.jobs.get(job_id)
            if job.state.ended:
                return job
            await asyncio.sleep(0.01)
        raise AssertionError(f"job {job_id} never ended")


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    yield Harness(tmp_path)


def read(location: str) -> bytes:
    return Path(location.removeprefix("file://")).read_bytes()


async def test_a_job_ends_with_its_one_result_and_its_notice(harness: Harness) -> None:
    harness.jobs.start()
    try:
        job, created = await harness.jobs.submit(JobRequest("m"), body=b"hello", job_id="j1")
        again, created_again = await harness.jobs.submit(JobRequest("m"), body=b"other", job_id="j1")
        assert created and not created_again and again.id == job.id
        ended = await harness.jobs.get("j1", wait_s=5)
        assert ended.state is JobState.SUCCEEDED and ended.attempts == 1
        assert read(ended.output_location) == b"HELLO"
        assert job.input_location == IN_QUEUE  # a small body is kept in the queue, with its job
        assert harness.replay.calls == ["j1"]
        for _ in range(200):
            if harness.notifier.told:
                break
            await asyncio.sleep(0.01)
        assert harness.notifier.told == [("j1", JobState.SUCCEEDED)]
    finally:
        await harness.jobs.stop()


async def test_a_large_body_is_kept_in_the_payload_path_until_its_job_ends(harness: Harness) -> None:
    body = b"x" * (QUEUE_BODY_MAX_BYTES + 1)
    job, _ = await harness.jobs.submit(JobRequest("m"), body=body, job_id="big")
    payload = Path(job.input_location.removeprefix("file://"))
    assert payload.parent == harness.root / "payloads" and payload.read_bytes() == body
    harness.jobs.start()
    try:
        ended = await harness.jobs.get("big", wait_s=5)
        assert ended.state is JobState.SUCCEEDED and read(ended.output_location) == body.upper()
        assert not payload.exists()  # let go once its job ended
    finally:
        await harness.jobs.stop()


async def test_jobs_that_finish_together_are_written_together(tmp_path: Path) -> None:
    harness = Harness(tmp_path, concurrency=16)
    groups: list[int] = []
    write_all_once = harness.storage.write_all_once

    def counted(objects: list[StoredObject]) -> list[Written]:
        groups.append(len(objects))
        return write_all_once(objects)

    harness.storage.write_all_once = counted  # type: ignore[method-assign]
    harness.replay.gate = asyncio.Event()
    for i in range(16):
        await harness.jobs.submit(JobRequest("m"), body=b"job %d" % i, job_id=f"j{i}")
    harness.jobs.start()
    try:
        await until(lambda: len(harness.replay.calls) == 16)
        harness.replay.gate.set()  # all 16 answer at once
        for i in range(16):
            ended = await harness.jobs.get(f"j{i}", wait_s=5)
            assert ended.state is JobState.SUCCEEDED and read(ended.output_location) == b"JOB %d" % i
        assert groups == [16]  # one group: one pass of flushes for all
    finally:
        await harness.jobs.stop()


async def test_jobs_run_one_at_a_time_while_real_time_requests_keep_coming(tmp_path: Path) -> None:
    harness = Harness(tmp_path, concurrency=4)
    harness.realtime_active = True
    harness.replay.gate = asyncio.Event()
    for i in range(4):
        await harness.jobs.submit(JobRequest("m"), body=b"job %d" % i, job_id=f"j{i}")
    harness.jobs.start()
    try:
        await until(lambda: harness.replay.calls)
        await asyncio.sleep(0.1)  # ten polls: still one
        assert len(harness.replay.calls) == 1
        harness.realtime_active = False  # the real-time traffic stopped: all four run
        await until(lambda: len(harness.replay.calls) == 4)
        assert len(harness.replay.calls) == 4
        harness.replay.gate.set()
        for i in range(4):
            assert (await harness.jobs.get(f"j{i}", wait_s=5)).state is JobState.SUCCEEDED
    finally:
        await harness.jobs.stop()


async def test_a_job_whose_result_could_not_be_written_is_not_ended_but_run_again(harness: Harness) -> None:
    write_all_once = harness.storage.write_all_once
    failures = [OSError("the disk is full")]

    def failing_for_bad(objects: list[StoredObject]) -> list[Written]:
        """The bad job's object fails once (the disk full for it alone); the rest are written."""
        failing = {i for i, o in enumerate(objects) if "bad" in o.location and failures}
        outcomes = iter(write_all_once([o for i, o in enumerate(objects) if i not in failing]))
        return [failures.pop() if i in failing else next(outcomes) for i in range(len(objects))]

    harness.storage.write_all_once = failing_for_bad  # type: ignore[method-assign]
    harness.replay.gate = asyncio.Event()
    for name in ("good", "bad"):
        await harness.jobs.submit(JobRequest("m"), body=name.encode(), job_id=name)
    harness.jobs.start()
    try:
        await until(lambda: len(harness.replay.calls) == 2)
        harness.replay.gate.set()  # both end in one group; the bad one's object fails
        assert (await harness.jobs.get("good", wait_s=5)).state is JobState.SUCCEEDED
        await until(lambda: harness.queue.get("bad").state is JobState.QUEUED)  # type: ignore[union-attr]
        bad = await harness.jobs.get("bad")
        assert bad.state is JobState.QUEUED and "disk is full" in bad.error  # not ended: put back
        harness.clock.advance(5.0)  # past its backoff
        bad = await harness.jobs.get("bad", wait_s=5)
        assert bad.state is JobState.SUCCEEDED and bad.attempts == 2 and read(bad.output_location) == b"BAD"
    finally:
        await harness.jobs.stop()


async def test_a_refused_request_fails_with_a_document_and_a_transient_one_is_retried(harness: Harness) -> None:
    harness.replay.raises[b"bad"] = [ModelRaisedError("model m raised: no")]
    harness.replay.raises[b"busy"] = [OverloadedError("the queue is full")]
    harness.jobs.start()
    try:
        await harness.jobs.submit(JobRequest("m"), body=b"bad", job_id="bad")
        await harness.jobs.submit(JobRequest("m"), body=b"busy", job_id="busy")
        failed = await harness.ended("bad")
        assert failed.state is JobState.FAILED and failed.error_code == "MODEL_RAISED"
        document = json.loads(read(failed.failure_location))
        assert document["error"] == "model m raised: no" and document["inference_id"] == "bad"
        assert not Path(failed.output_location.removeprefix("file://")).exists()
        for _ in range(100):  # put back until its backoff (1 s on the job's clock) has passed
            job = await harness.jobs.get("busy")
            if job.state is JobState.QUEUED and job.attempts == 1:
                break
            await asyncio.sleep(0.01)
        assert job.error == "the queue is full"
        harness.clock.advance(1.5)
        succeeded = await harness.ended("busy")
        assert succeeded.state is JobState.SUCCEEDED and succeeded.attempts == 2
    finally:
        await harness.jobs.stop()


async def test_a_job_that_runs_past_its_timeout_fails(harness: Harness) -> None:
    harness.replay.sleep_s = 1.0
    harness.jobs.start()
    try:
        await harness.jobs.submit(JobRequest("m"), body=b"slow", job_id="slow", timeout_s=0.05)
        failed = await harness.ended("slow")
        assert failed.state is JobState.FAILED and failed.error_code == "DEADLINE_UNREACHABLE"
        assert "timeout of 0.05 s" in json.loads(read(failed.failure_location))["error"]
    finally:
        await harness.jobs.stop()


async def test_a_result_written_before_a_crash_is_kept_and_a_job_that_keeps_dying_is_a_dead_letter(
    harness: Harness,
) -> None:
    # "poison" took its worker down with it on every attempt (three leases never ended).
    await harness.jobs.submit(JobRequest("m"), body=b"poison", job_id="poison")
    for _ in range(3):
        lease = harness.queue.lease(harness.clock(), lambda _: 60.0)
        assert lease is not None and lease.job.id == "poison"
        harness.clock.advance(100.0)
    # "kept" was run and its result written; then the server died before it could end the job.
    await harness.jobs.submit(JobRequest("m"), body=b"kept", job_id="kept", priority=1)
    lease = harness.queue.lease(harness.clock(), lambda _: 60.0)
    assert lease is not None and lease.job.id == "kept"
    harness.storage.write_once(harness.storage.output_location("kept"), b"FIRST RESULT")
    harness.clock.advance(100.0)
    harness.jobs.start()
    try:
        kept = await harness.ended("kept")
        assert kept.state is JobState.SUCCEEDED and read(kept.output_location) == b"FIRST RESULT"
        poison = await harness.ended("poison")
        assert poison.state is JobState.FAILED and poison.dead_lettered
        assert json.loads(read(poison.failure_location))["dead_lettered"] is True
        assert harness.replay.calls == []  # neither ran again
    finally:
        await harness.jobs.stop()


async def test_a_notice_is_owed_until_told(tmp_path: Path) -> None:
    harness = Harness(tmp_path, Notifier(failures=1))
    harness.jobs.start()
    try:
        await harness.jobs.submit(JobRequest("m"), body=b"x", job_id="x")
        await harness.ended("x")
        for _ in range(400):  # the first try fails; the second, 2 s later, is told
            if harness.notifier.told:
                break
            await asyncio.sleep(0.01)
        assert harness.notifier.told == [("x", JobState.SUCCEEDED)]
        assert harness.queue.pending_notifications(10) == []
    finally:
        await harness.jobs.stop()


async def test_input_locations_must_lie_under_a_root_and_ids_must_be_plain_names(harness: Harness) -> None:
    inputs = harness.root / "inputs"
    inputs.mkdir()
    (inputs / "a.json").write_bytes(b"from a file")
    (harness.root / "secret").write_bytes(b"not yours")
    (inputs / "link").symlink_to(harness.root / "secret")
    job, _ = await harness.jobs.submit(JobRequest("m"), input_location=(inputs / "a.json").as_uri())
    assert job.input_location == (inputs / "a.json").as_uri()
    for outside in ((harness.root / "secret").as_uri(), (inputs / "link").as_uri(), f"{inputs.as_uri()}/../secret",
                    "s3://bucket/key", "http://169.254.169.254/latest/meta-data"):  # fmt: skip
        with pytest.raises(PermissionDeniedError):
            await harness.jobs.submit(JobRequest("m"), input_location=outside)
    for bad_id in ("../models/m/1/model.onnx", "a/b", ".hidden", "x" * 200, ""):
        if bad_id:
            with pytest.raises(InvalidRequestError):
                await harness.jobs.submit(JobRequest("m"), body=b"x", job_id=bad_id)
    await harness.jobs.stop()

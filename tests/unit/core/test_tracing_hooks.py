"""What the batcher tells core's execution tracer (`inferd.core.tracing`): once per execution, the
requests it served with their split already written; on a fake runtime, no sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from inferd.config.model import DynamicBatchingConfig
from inferd.core.batcher import DynamicBatcher
from inferd.core.executor import InstancePool
from inferd.errors import InvalidRequestError
from inferd.testing.fakes import FakeClock, FakeRuntime, fake_work
from inferd.types import RequestContext, RequestTiming
from tests.unit.core.test_batcher import rows, until


@dataclass
class Execution:
    timings: list[RequestTiming]
    rows: int
    batch_rows: list[int]
    """Each timing's batch_rows when the tracer heard of it: the split is written before."""
    dispatched_ago_s: float
    finished_ago_s: float
    failed: bool


class RecordingTracer:
    def __init__(self) -> None:
        self.executions: list[Execution] = []

    def executed(
        self,
        contexts: Sequence[RequestContext],
        rows: int,
        dispatched_ago_s: float,
        finished_ago_s: float,
        failed: bool,
    ) -> None:
        timings = [context.timing for context in contexts]
        self.executions.append(
            Execution(list(timings), rows, [t.batch_rows for t in timings], dispatched_ago_s, finished_ago_s, failed)
        )


def make(runtime: FakeRuntime, tracer: RecordingTracer, clock: FakeClock | None = None) -> DynamicBatcher:
    return DynamicBatcher(
        "fake",
        InstancePool([runtime], name="fake"),
        max_batch_size=8,
        config=DynamicBatchingConfig(),
        clock=clock or FakeClock(),
        tracer=tracer,
    )


async def submit(batcher: DynamicBatcher, values: list[float], timing: RequestTiming) -> object:
    return await batcher.submit(fake_work(rows(values), timing=timing))


async def test_a_merged_batch_is_one_execution_naming_each_request() -> None:
    gate, tracer, clock = threading.Event(), RecordingTracer(), FakeClock()
    runtime = FakeRuntime(gate)
    batcher = make(runtime, tracer, clock)
    first = asyncio.ensure_future(submit(batcher, [1.0], RequestTiming()))
    await until(runtime.started.is_set)
    timings = [RequestTiming() for _ in range(3)]
    others = [asyncio.ensure_future(submit(batcher, [2.0, 3.0], t)) for t in timings]
    await until(lambda: batcher.queued == 3)
    clock.advance(0.25)  # the three waited a quarter of a second for the instance
    gate.set()
    await asyncio.gather(first, *others)
    assert runtime.batches == [1, 6]
    merged = tracer.executions[-1]
    assert merged.timings == timings and merged.rows == 6 and merged.batch_rows == [6, 6, 6]
    assert not merged.failed
    assert [t.queue_s for t in timings] == [pytest.approx(0.25)] * 3
    # On the batcher's own clock, which did not move while the batch ran.
    assert merged.dispatched_ago_s == merged.finished_ago_s == 0.0
    assert len(tracer.executions) == 2  # the first request's execution, alone, is one too


async def test_an_execution_that_failed_every_request_says_so() -> None:
    tracer = RecordingTracer()
    batcher = make(FakeRuntime(), tracer)
    with pytest.raises(InvalidRequestError):
        await submit(batcher, [-1.0], RequestTiming())
    await until(lambda: bool(tracer.executions))
    assert tracer.executions[-1].failed
    await submit(batcher, [1.0], RequestTiming())
    assert not tracer.executions[-1].failed


async def test_without_a_tracer_nothing_is_reported() -> None:
    batcher = DynamicBatcher("fake", InstancePool([FakeRuntime()], name="fake"), max_batch_size=8,
                             config=DynamicBatchingConfig(), clock=FakeClock())  # fmt: skip
    timing = RequestTiming()
    await submit(batcher, [1.0], timing)
    assert timing.batch_rows == 1

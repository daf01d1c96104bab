"""SequenceBatcher through its public interface, on a fake runtime; time from a FakeClock, no sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from inferd.config.model import ModelConfig, SequenceBatchingConfig, TensorConfig
from inferd.core.executor import InstancePool
from inferd.core.scheduler import Work
from inferd.core.sequence import SequenceBatcher
from inferd.errors import DeadlineUnreachableError, InvalidRequestError, ModelOutputError, OverloadedError
from inferd.testing.fakes import FakeClock, FakeRuntime, fake_work
from inferd.types import DataType, InferRequest, RequestContext, Tensor
from tests.unit.core.test_batcher import until
from tests.unit.core.test_tracing_hooks import RecordingTracer


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    gate = threading.Event()
    yield gate
    gate.set()  # never leave a worker thread held


def config(max_batch_size: int) -> ModelConfig:
    return ModelConfig(
        name="stateful",
        max_batch_size=max_batch_size,
        inputs=(TensorConfig("x", DataType.FP32, (2,)),),
        outputs=(TensorConfig("y", DataType.FP32, (2,)),),
        sequence_batching=SequenceBatchingConfig(strategy="direct"),
    )


async def step(batcher: SequenceBatcher, sequence: int, value: float) -> dict[str, np.ndarray[Any, Any]]:
    """A whole sequence of one request (START and END)."""
    x = np.full((1, 2), value, dtype=np.float32)
    request = InferRequest(
        model_name="stateful",
        model_version="",
        inputs=(Tensor("x", DataType.FP32, x.shape, x),),
        context=RequestContext(str(sequence)),
        parameters={"sequence_id": sequence, "sequence_start": True, "sequence_end": True},
    )
    return await batcher.submit(Work(request, {"x": x}, 1, ["y"]))


async def test_each_request_gets_its_own_row() -> None:
    batcher = SequenceBatcher(config(4), InstancePool([FakeRuntime()], name="stateful"))
    answers = await asyncio.wait_for(asyncio.gather(*(step(batcher, s, float(s)) for s in range(1, 9))), 10)
    assert [a["y"].tolist() for a in answers] == [[[2.0 * s] * 2] for s in range(1, 9)]
    await batcher.close()


async def test_a_model_that_answers_a_row_too_few_fails_every_request() -> None:
    batcher = SequenceBatcher(config(4), InstancePool([FakeRuntime(extra_rows=-1)], name="stateful"))
    for sequence in range(1, 51):
        with pytest.raises(ModelOutputError, match="model 'stateful' output 'y' has shape"):
            await asyncio.wait_for(step(batcher, sequence, 1.0), timeout=10)
    together = [step(batcher, sequence, 1.0) for sequence in range(100, 150)]
    outcomes = await asyncio.wait_for(asyncio.gather(*together, return_exceptions=True), timeout=10)
    assert all(isinstance(outcome, ModelOutputError) for outcome in outcomes)
    assert len({id(outcome) for outcome in outcomes}) == 50  # each its own copy, for its own request id
    await batcher.close()


# -- time from the injected clock: no sleeps ------------------------------------------------------

LONG_DELAY_US = 60_000_000  # a test that waited it out would time out instead of passing


def clocked(
    clock: FakeClock, runtime: FakeRuntime, tracer: RecordingTracer | None = None, **settings: Any
) -> SequenceBatcher:
    model = replace(config(4), sequence_batching=SequenceBatchingConfig(**settings))
    return SequenceBatcher(model, InstancePool([runtime], name="stateful"), clock=clock, tracer=tracer)


def sequence_work(
    sequence: int, value: float, *, start: bool = True, end: bool = True, deadline_s: float | None = None
) -> Work:
    parameters = {"sequence_id": sequence, "sequence_start": start, "sequence_end": end}
    return fake_work({"x": np.full((1, 2), value, dtype=np.float32)}, parameters=parameters, deadline_s=deadline_s)


async def test_a_sequence_idle_past_max_idle_on_the_clock_has_ended() -> None:
    clock = FakeClock()
    batcher = clocked(clock, FakeRuntime(), max_idle_us=1_000_000)
    await asyncio.wait_for(batcher.submit(sequence_work(7, 1.0, end=False)), 10)
    clock.advance(0.999)
    await asyncio.wait_for(batcher.submit(sequence_work(7, 2.0, start=False, end=False)), 10)  # still running
    clock.advance(1.0)
    with pytest.raises(InvalidRequestError, match="must specify the START flag"):
        await batcher.submit(sequence_work(7, 3.0, start=False))
    await batcher.close()


async def test_a_deadline_the_estimate_cannot_meet_is_refused_before_any_work() -> None:
    clock = FakeClock()
    runtime = FakeRuntime()
    batcher = clocked(clock, runtime)
    with pytest.raises(DeadlineUnreachableError, match="cannot answer within the request's deadline"):
        await batcher.submit(sequence_work(1, 1.0, deadline_s=clock() - 0.001))
    assert runtime.batches == []
    await batcher.close()


async def test_a_queued_request_whose_deadline_passes_is_refused_when_its_turn_comes(gate: threading.Event) -> None:
    clock = FakeClock()
    runtime = FakeRuntime(gate, may_run_inline=False)
    batcher = clocked(clock, runtime)
    running = asyncio.ensure_future(batcher.submit(sequence_work(1, 1.0)))
    await until(runtime.started.is_set)
    late = asyncio.ensure_future(batcher.submit(sequence_work(2, 2.0, deadline_s=clock() + 0.5)))
    await until(lambda: batcher.queued == 2)
    clock.advance(1.0)
    gate.set()
    with pytest.raises(OverloadedError, match="timed out after 1000000 us in the queue"):
        await asyncio.wait_for(late, 10)
    await asyncio.wait_for(running, 10)
    assert runtime.batches == [1]  # the late request never reached the model
    await batcher.close()


async def test_each_request_s_time_is_split_and_the_tracer_hears_of_each_execution(gate: threading.Event) -> None:
    clock = FakeClock()
    runtime = FakeRuntime(gate, may_run_inline=False)
    tracer = RecordingTracer()
    batcher = clocked(clock, runtime, tracer)
    first = sequence_work(1, 1.0)
    second = sequence_work(2, 2.0)
    running = asyncio.ensure_future(batcher.submit(first))
    await until(runtime.started.is_set)
    queued = asyncio.ensure_future(batcher.submit(second))
    await until(lambda: batcher.queued == 2)
    clock.advance(0.25)  # the first executes, the second queues
    gate.set()
    await asyncio.wait_for(asyncio.gather(running, queued), 10)
    timing = second.request.context.timing
    # direct: the second sequence holds slot 1, so its batch has two rows (slot 0's not READY)
    assert (timing.queue_s, timing.batch_wait_s, timing.batch_rows) == (0.25, 0.0, 2)
    assert first.request.context.timing.compute_s == 0.25
    assert [(len(e.timings), e.rows, e.failed) for e in tracer.executions] == [(1, 1, False), (1, 2, False)]
    assert tracer.executions[1].timings[0] is timing
    await batcher.close()


async def test_oldest_holds_a_batch_for_company_until_the_clock_says_its_delay_is_over() -> None:
    clock = FakeClock()
    runtime = FakeRuntime()
    batcher = clocked(clock, runtime, strategy="oldest", max_queue_delay_us=LONG_DELAY_US)
    held = asyncio.ensure_future(batcher.submit(sequence_work(1, 1.0)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not held.done() and runtime.batches == []
    clock.advance(LONG_DELAY_US / 1e6)
    batcher.wake()
    assert (await asyncio.wait_for(held, 10))["y"].tolist() == [[2.0, 2.0]]
    await batcher.close()

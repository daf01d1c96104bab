"""The scheduler contract (core.scheduler) over each implementation: submit, refusal before any
work, the queued count, close; and the background admission class. Fake runtimes held by a gate;
no sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from inferd.config.model import DynamicBatchingConfig, ModelConfig, QueuePolicy, SequenceBatchingConfig, TensorConfig
from inferd.core.batcher import DynamicBatcher
from inferd.core.executor import InstancePool
from inferd.core.scheduler import REALTIME_RECENT_S, Admission, DirectScheduler, Scheduler, Work
from inferd.core.sequence import SequenceBatcher
from inferd.errors import ModelOutputError, OverloadedError, UnavailableError, UnsupportedError
from inferd.testing.fakes import FakeClock, FakeRuntime, fake_work
from inferd.types import DataType
from tests.unit.core.test_batcher import LONG_DELAY_US, until

BACKGROUND = Admission.BACKGROUND
Kind = str
KINDS = ("direct", "dynamic", "sequence")


class RecordingRuntime(FakeRuntime):
    """Records the first value of every batch it runs, in order."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__(gate)
        self.firsts: list[float] = []

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, Any]:
        self.firsts.append(float(inputs["x"].flat[0]))
        return super().execute(inputs, output_names)


def make(kind: Kind, runtimes: list[FakeRuntime], background_queue_size: int = 8, **batching: Any) -> Scheduler:
    pool = InstancePool(runtimes, name="fake")
    if kind == "direct":
        return DirectScheduler("fake", pool, batched=True, background_queue_size=background_queue_size)
    if kind == "dynamic":
        config = DynamicBatchingConfig(**batching)
        return DynamicBatcher(
            "fake",
            pool,
            max_batch_size=8,
            config=config,
            clock=FakeClock(),
            background_queue_size=background_queue_size,
        )
    model = ModelConfig(
        name="fake",
        max_batch_size=8,
        inputs=(TensorConfig("x", DataType.FP32, (2,)),),
        outputs=(TensorConfig("y", DataType.FP32, (2,)),),
        sequence_batching=SequenceBatchingConfig(strategy="oldest"),
    )
    return SequenceBatcher(model, pool, clock=FakeClock())


_sequence_ids = iter(range(1, 1_000_000))


def work(kind: Kind, value: float, **fields: Any) -> Work:
    feeds = {"x": np.full((1, 2), value, dtype=np.float32)}
    if kind != "sequence":
        return fake_work(feeds, **fields)
    parameters = {"sequence_id": next(_sequence_ids), "sequence_start": True, "sequence_end": True}
    return fake_work(feeds, parameters=parameters, **fields)


def started(scheduler: Scheduler, kind: Kind, value: float = 0.0, **fields: Any) -> asyncio.Future[Any]:
    return asyncio.ensure_future(scheduler.submit(work(kind, value, **fields)))


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    gate = threading.Event()
    yield gate
    gate.set()  # never leave a worker thread held


# -- the contract, over each implementation -----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_submit_answers_the_request_its_own_rows(kind: Kind) -> None:
    scheduler = make(kind, [FakeRuntime()])
    outputs = await asyncio.wait_for(scheduler.submit(work(kind, 3.0)), timeout=10)
    assert outputs["y"].tolist() == [[6.0, 6.0]]
    assert scheduler.queued == 0
    await scheduler.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_nothing_waits_nothing_is_refused(kind: Kind) -> None:
    scheduler = make(kind, [FakeRuntime()])
    assert scheduler.refusal() is None
    assert scheduler.refusal(admission=BACKGROUND) is None or kind == "sequence"
    assert not scheduler.sheds
    await scheduler.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_queued_counts_what_waits_and_close_answers_it_unavailable(kind: Kind, gate: threading.Event) -> None:
    runtime = FakeRuntime(gate, may_run_inline=False)
    scheduler = make(kind, [runtime])
    running = started(scheduler, kind)
    await until(runtime.started.is_set)
    # The direct scheduler queues nothing real-time (a request waits for an instance in the pool):
    # its queue is background work's.
    waiting = started(scheduler, kind, 1.0, admission=BACKGROUND if kind == "direct" else Admission.REAL_TIME)
    await until(lambda: scheduler.queued == 1)
    closing = asyncio.ensure_future(scheduler.close())
    with pytest.raises(UnavailableError, match="unloading"):
        await asyncio.wait_for(waiting, timeout=10)
    gate.set()
    assert (await asyncio.wait_for(running, timeout=10))["y"].tolist() == [[0.0, 0.0]]
    await asyncio.wait_for(closing, timeout=10)
    assert scheduler.queued == 0


async def test_a_full_real_time_queue_is_refused_before_any_work(gate: threading.Event) -> None:
    runtime = FakeRuntime(gate, may_run_inline=False)
    scheduler = make("dynamic", [runtime], default_queue_policy=QueuePolicy(max_queue_size=2))
    assert scheduler.sheds
    running = started(scheduler, "dynamic")
    await until(runtime.started.is_set)
    queued = started(scheduler, "dynamic", 1.0)
    await until(lambda: scheduler.queued == 1)
    refused = scheduler.refusal()
    assert isinstance(refused, OverloadedError)
    with pytest.raises(OverloadedError, match="max_queue_size 2"):
        await scheduler.submit(work("dynamic", 2.0))
    assert scheduler.refusal(admission=BACKGROUND) is None  # background work is bounded apart
    gate.set()
    await asyncio.wait_for(asyncio.gather(running, queued), timeout=10)
    assert runtime.batches == [1, 1]  # the refused request never reached the model
    await scheduler.close()


# -- the background admission class --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["direct", "dynamic"])
async def test_background_work_waits_for_real_time_work_and_runs_once_the_model_is_idle(
    kind: Kind, gate: threading.Event
) -> None:
    runtime = RecordingRuntime(gate)
    runtime.may_run_inline = False
    scheduler = make(kind, [runtime], max_queue_delay_us=0)
    running = started(scheduler, kind, 1.0)
    await until(runtime.started.is_set)
    background = [started(scheduler, kind, 10.0 + i, admission=BACKGROUND) for i in range(3)]
    await until(lambda: scheduler.queued == 3)
    real_time = started(scheduler, kind, 2.0)  # arrives after the background work, goes before it
    gate.set()
    answers = await asyncio.wait_for(asyncio.gather(running, real_time, *background), timeout=10)
    assert [a["y"][0, 0] for a in answers] == [2.0, 4.0, 20.0, 22.0, 24.0]
    assert runtime.firsts[:2] == [1.0, 2.0]  # background work ran only after every real-time request
    assert set(runtime.firsts[2:]) <= {10.0, 11.0, 12.0}
    await scheduler.close()


@pytest.mark.parametrize("kind", ["direct", "dynamic"])
async def test_background_work_runs_at_once_on_an_idle_model(kind: Kind) -> None:
    scheduler = make(kind, [FakeRuntime()])
    outputs = await asyncio.wait_for(scheduler.submit(work(kind, 5.0, admission=BACKGROUND)), timeout=10)
    assert outputs["y"].tolist() == [[10.0, 10.0]]
    await scheduler.close()


@pytest.mark.parametrize("kind", ["direct", "dynamic"])
async def test_background_work_leaves_one_instance_to_real_time_requests(kind: Kind, gate: threading.Event) -> None:
    held = [FakeRuntime(gate, may_run_inline=False), FakeRuntime(gate, may_run_inline=False)]
    # A long queue delay: had background work made the model look busy, the real-time request
    # would wait for company instead of going at once.
    scheduler = make(kind, held, max_queue_delay_us=LONG_DELAY_US)
    background = [started(scheduler, kind, 10.0, admission=BACKGROUND)]
    await until(lambda: any(r.started.is_set() for r in held))
    background += [started(scheduler, kind, 11.0 + i, admission=BACKGROUND) for i in range(2)]
    await until(lambda: scheduler.queued == 2)  # one executes, two wait: the other instance stays free
    assert sum(r.started.is_set() for r in held) == 1
    free = next(r for r in held if not r.started.is_set())
    free.gate = None
    answer = await asyncio.wait_for(scheduler.submit(work(kind, 1.0)), timeout=10)
    assert answer["y"].tolist() == [[2.0, 2.0]]
    gate.set()
    await asyncio.wait_for(asyncio.gather(*background), timeout=10)
    await scheduler.close()


async def test_background_batches_are_no_larger_than_real_time_ones_while_real_time_requests_come(
    gate: threading.Event,
) -> None:
    runtime = FakeRuntime(gate, may_run_inline=False)
    clock = FakeClock()
    scheduler = DynamicBatcher("fake", InstancePool([runtime], name="fake"), max_batch_size=8,
                               config=DynamicBatchingConfig(), clock=clock)  # fmt: skip
    running = started(scheduler, "dynamic", 1.0)  # a real-time request of one row, executing
    await until(runtime.started.is_set)
    background = [started(scheduler, "dynamic", 10.0 + i, admission=BACKGROUND) for i in range(3)]
    await until(lambda: scheduler.queued == 3)
    gate.set()
    await asyncio.wait_for(asyncio.gather(running, *background), timeout=10)
    assert runtime.batches == [1, 1, 1, 1]  # one row at a time, as the real-time traffic came
    held = threading.Event()
    runtime.gate, runtime.started = held, threading.Event()
    clock.advance(REALTIME_RECENT_S + 0.1)  # real-time traffic has stopped: full batches again
    background = [started(scheduler, "dynamic", 20.0, admission=BACKGROUND)]
    await until(runtime.started.is_set)
    background += [started(scheduler, "dynamic", 21.0 + i, admission=BACKGROUND) for i in range(3)]
    await until(lambda: scheduler.queued == 3)
    held.set()
    await asyncio.wait_for(asyncio.gather(*background), timeout=10)
    assert runtime.batches[4:] == [1, 3]
    await scheduler.close()


@pytest.mark.parametrize("kind", ["direct", "dynamic"])
async def test_a_full_background_queue_refuses_before_any_work_and_real_time_is_unaffected(
    kind: Kind, gate: threading.Event
) -> None:
    runtime = FakeRuntime(gate, may_run_inline=False)
    scheduler = make(kind, [runtime], background_queue_size=1)
    running = started(scheduler, kind)
    await until(runtime.started.is_set)
    queued = started(scheduler, kind, 1.0, admission=BACKGROUND)
    await until(lambda: scheduler.queued == 1)
    refused = scheduler.refusal(admission=BACKGROUND)
    assert isinstance(refused, OverloadedError) and "background queue holds 1" in refused.message
    with pytest.raises(OverloadedError, match="retry later"):
        await scheduler.submit(work(kind, 2.0, admission=BACKGROUND))
    assert scheduler.refusal() is None
    gate.set()
    await asyncio.wait_for(asyncio.gather(running, queued), timeout=10)
    assert runtime.batches == [1, 1]
    await scheduler.close()


async def test_a_sequence_model_refuses_background_work() -> None:
    scheduler = make("sequence", [FakeRuntime()])
    with pytest.raises(UnsupportedError, match="sequence model"):
        await scheduler.submit(work("sequence", 1.0, admission=BACKGROUND))
    await scheduler.close()


async def test_a_background_submission_cancelled_once_handed_an_instance_gives_it_back() -> None:
    pool = InstancePool([FakeRuntime()], name="fake")
    scheduler = DirectScheduler("fake", pool, batched=True)
    held = pool.try_acquire()  # the model is busy
    assert held is not None
    gone = started(scheduler, "direct", 1.0, admission=BACKGROUND)
    await until(lambda: scheduler.queued == 1)
    pool.release(held)  # hands the instance to the background submission...
    gone.cancel()  # ...which is cancelled before it resumes to run
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert pool.idle == 1
    assert (await asyncio.wait_for(scheduler.submit(work("direct", 3.0)), timeout=10))["y"].tolist() == [[6.0, 6.0]]
    await scheduler.close()


async def test_a_request_run_alone_has_its_rows_checked_when_the_model_batches() -> None:
    runtime = FakeRuntime(extra_rows=1)
    batched = DirectScheduler("extra", InstancePool([runtime], name="extra"), batched=True)
    with pytest.raises(ModelOutputError, match="model 'extra' output 'y' has shape \\[2, 2\\], but the batch had 1"):
        await batched.submit(fake_work({"x": np.ones((1, 2), np.float32)}))
    # A model without a batch dimension answers whatever shape its outputs have.
    unbatched = DirectScheduler("extra", InstancePool([runtime], name="extra"), batched=False)
    alone = fake_work({"x": np.ones((1, 2), np.float32)})
    results = await unbatched.submit(alone)
    assert results["y"].shape == (2, 2)
    assert alone.request.context.timing.batch_rows == 1

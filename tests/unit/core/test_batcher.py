"""DynamicBatcher through its public interface, on a fake runtime; no sleeps."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from inferd.config.model import DynamicBatchingConfig, QueuePolicy
from inferd.core.batcher import DynamicBatcher
from inferd.core.executor import InstancePool
from inferd.errors import (
    DeadlineUnreachableError,
    InvalidRequestError,
    ModelOutputError,
    OverloadedError,
    UnavailableError,
)
from inferd.testing.fakes import FakeClock, FakeRuntime, fake_work
from inferd.types import RequestTiming

# Long enough that a test which waited it out would time out instead of passing.
LONG_DELAY_US = 60_000_000


def rows(values: list[float], width: int = 2) -> dict[str, np.ndarray[Any, Any]]:
    return {"x": np.repeat(np.array(values, dtype=np.float32)[:, None], width, axis=1)}


def make(
    runtimes: list[FakeRuntime], max_batch_size: int = 8, clock: FakeClock | None = None, **config: Any
) -> DynamicBatcher:
    pool = InstancePool(runtimes, name="fake")
    return DynamicBatcher(
        "fake",
        pool,
        max_batch_size=max_batch_size,
        config=DynamicBatchingConfig(**config),
        clock=clock or FakeClock(),
    )


async def submit(batcher: DynamicBatcher, values: list[float], **kwargs: Any) -> np.ndarray[Any, Any]:
    outputs = await batcher.submit(fake_work(rows(values), **kwargs))
    return outputs["y"]


async def until(predicate: Any) -> None:
    """Yield to the loop (and the worker threads) until `predicate()` holds; bounded."""
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


async def occupy(batcher: DynamicBatcher, *runtimes: FakeRuntime) -> asyncio.Future[Any]:
    """Submit a one-row request and return once one of `runtimes` is executing it (gated runtimes
    then hold an instance busy until the test opens the gate)."""
    blocker = asyncio.ensure_future(submit(batcher, [0.0]))
    await until(lambda: any(r.started.is_set() for r in runtimes))
    return blocker


async def test_lone_request_on_idle_server_runs_at_once() -> None:
    batcher = make([FakeRuntime()], max_queue_delay_us=LONG_DELAY_US)
    result = await asyncio.wait_for(submit(batcher, [3.0]), timeout=10)
    assert result.tolist() == [[6.0, 6.0]]


async def test_requests_that_keep_coming_alone_run_without_yielding_until_company_comes() -> None:
    runtime = FakeRuntime()
    pool = InstancePool([runtime], name="fake")
    pool.calibrate(rows([1.0]), ["y"])  # runs inline
    batcher = DynamicBatcher("fake", pool, max_batch_size=8, config=DynamicBatchingConfig(), clock=FakeClock())

    def answered_in_one_step() -> bool:
        call = submit(batcher, [1.0])
        try:
            call.send(None)
        except StopIteration:
            return True
        call.close()
        return False

    for _ in range(8):  # at first a request waits a loop turn for company, which does not come
        await submit(batcher, [1.0])
        await asyncio.sleep(0)
    assert answered_in_one_step()
    await asyncio.sleep(0)
    # Two arrive in one loop turn: the first ran alone; company is expected again from then on.
    together = [asyncio.ensure_future(submit(batcher, [float(v)])) for v in (1, 2, 3)]
    assert [r.tolist() for r in await asyncio.gather(*together)] == [[[2.0, 2.0]], [[4.0, 4.0]], [[6.0, 6.0]]]
    assert runtime.batches[-2:] == [1, 2]
    assert not answered_in_one_step()


async def test_requests_queued_while_busy_merge_and_each_gets_its_rows() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make([runtime], max_batch_size=8)
    first = asyncio.ensure_future(submit(batcher, [1.0]))
    await until(runtime.started.is_set)
    others = [asyncio.ensure_future(submit(batcher, [float(v), float(v) + 0.5])) for v in (10, 20, 30)]
    await until(lambda: batcher.queued == 3)
    gate.set()
    assert (await first).tolist() == [[2.0, 2.0]]
    results = await asyncio.gather(*others)
    assert runtime.batches == [1, 6]
    for value, result in zip((10, 20, 30), results, strict=True):
        assert result[:, 0].tolist() == [2 * value, 2 * value + 1]


async def test_batches_never_exceed_max_batch_size() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make([runtime], max_batch_size=4)
    blocker = await occupy(batcher, runtime)
    waiting = [asyncio.ensure_future(submit(batcher, [float(i)] * 3)) for i in range(5)]
    await until(lambda: batcher.queued == 5)
    gate.set()
    await blocker
    results = await asyncio.gather(*waiting)
    assert max(runtime.batches) <= 4
    assert [r[:, 0].tolist() for r in results] == [[2.0 * i] * 3 for i in range(5)]


async def test_different_non_batch_shapes_are_never_merged() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make([runtime])
    blocker = await occupy(batcher, runtime)
    narrow = asyncio.ensure_future(batcher.submit(fake_work(rows([1.0], width=2))))
    wide = asyncio.ensure_future(batcher.submit(fake_work(rows([2.0], width=3))))
    narrow2 = asyncio.ensure_future(batcher.submit(fake_work(rows([3.0], width=2))))
    await until(lambda: batcher.queued == 3)
    gate.set()
    await blocker
    n1, w, n2 = await asyncio.gather(narrow, wide, narrow2)
    assert runtime.batches == [1, 2, 1]
    assert w["y"].shape == (1, 3)
    assert n1["y"].tolist() == [[2.0, 2.0]] and n2["y"].tolist() == [[6.0, 6.0]]


async def test_waits_for_company_only_while_another_instance_is_busy() -> None:
    gate = threading.Event()
    busy, free = FakeRuntime(gate), FakeRuntime()
    clock = FakeClock()
    batcher = make([busy, free], max_batch_size=4, clock=clock, max_queue_delay_us=1000)
    blocker = await occupy(batcher, busy, free)
    # One instance is busy now; a new request waits for company rather than running alone.
    first = asyncio.ensure_future(submit(batcher, [1.0]))
    await until(lambda: batcher.queued == 1)
    second = asyncio.ensure_future(submit(batcher, [2.0]))
    await until(lambda: batcher.queued == 2)
    clock.advance(0.002)  # past max_queue_delay: the two go together
    await asyncio.gather(first, second)
    gate.set()
    await blocker
    ran = busy.batches + free.batches
    assert sorted(ran) == [1, 2]


async def late_company(batcher: DynamicBatcher, runtime: FakeRuntime) -> asyncio.Future[Any]:
    """A batch leaves alone, short of full; a request queues behind it within max_queue_delay (it
    came just too late). Returns that request once the first batch is done and it is queued."""
    assert runtime.gate is not None
    first = asyncio.ensure_future(submit(batcher, [1.0]))
    await until(runtime.started.is_set)
    late = asyncio.ensure_future(submit(batcher, [2.0]))
    await until(lambda: batcher.queued == 1)
    runtime.gate.set()
    await first
    return late


async def test_company_that_came_just_too_late_makes_batches_wait_on_an_idle_model() -> None:
    runtime = FakeRuntime(threading.Event())
    clock = FakeClock()
    batcher = make([runtime], clock=clock, max_queue_delay_us=1000)
    late = await late_company(batcher, runtime)
    # The instance is free, yet the late request waits for company rather than going alone ...
    await asyncio.sleep(0.02)
    assert batcher.queued == 1 and runtime.batches == [1]
    company = asyncio.ensure_future(submit(batcher, [3.0]))
    await until(lambda: batcher.queued == 2)
    clock.advance(0.002)  # ... for max_queue_delay: the two go together
    assert [r.tolist() for r in await asyncio.gather(late, company)] == [[[4.0, 4.0]], [[6.0, 6.0]]]
    assert runtime.batches == [1, 2]


async def test_without_late_company_a_queued_request_goes_as_soon_as_the_instance_is_free() -> None:
    runtime = FakeRuntime(threading.Event())
    clock = FakeClock()
    batcher = make([runtime], clock=clock, max_queue_delay_us=1000)
    first = asyncio.ensure_future(submit(batcher, [1.0]))
    await until(runtime.started.is_set)
    clock.advance(0.002)  # past max_queue_delay since the first batch left: not late company
    second = asyncio.ensure_future(submit(batcher, [2.0]))
    await until(lambda: batcher.queued == 1)
    assert runtime.gate is not None
    runtime.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), timeout=10)
    assert runtime.batches == [1, 1]


async def test_batches_stop_waiting_on_an_idle_model_once_waits_gain_nothing() -> None:
    runtime = FakeRuntime(threading.Event())
    clock = FakeClock()
    batcher = make([runtime], clock=clock, max_queue_delay_us=1000)
    late = await late_company(batcher, runtime)
    clock.advance(0.002)
    await late  # it waited and gained nothing: once
    for value in range(3):  # requests that come alone: each waits, and gains nothing
        waiting = asyncio.ensure_future(submit(batcher, [float(value)]))
        await until(lambda: batcher.queued == 1)
        clock.advance(0.002)
        await waiting
    # Now a lone request runs at once again.
    assert (await asyncio.wait_for(submit(batcher, [5.0]), timeout=10)).tolist() == [[10.0, 10.0]]
    assert runtime.batches == [1] * 6


async def test_preferred_batch_size_dispatches_without_waiting() -> None:
    gate = threading.Event()
    busy, free = FakeRuntime(gate), FakeRuntime()
    batcher = make([busy, free], max_batch_size=8, max_queue_delay_us=LONG_DELAY_US, preferred_batch_sizes=(2,))
    blocker = await occupy(batcher, busy, free)
    pair = await asyncio.wait_for(asyncio.gather(submit(batcher, [1.0]), submit(batcher, [2.0])), timeout=10)
    assert [r.tolist() for r in pair] == [[[2.0, 2.0]], [[4.0, 4.0]]]
    gate.set()
    await blocker


async def test_full_queue_refuses_at_once_naming_model_and_limit() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    triton_s_bound = {"max_queue_size_includes_executing": False}
    batcher = make([runtime], default_queue_policy=QueuePolicy(max_queue_size=2), **triton_s_bound)
    blocker = await occupy(batcher, runtime)
    queued = [asyncio.ensure_future(submit(batcher, [1.0])) for _ in range(2)]
    await until(lambda: batcher.queued == 2)
    with pytest.raises(UnavailableError, match=r"model 'fake'.*max_queue_size 2"):
        await submit(batcher, [1.0])
    gate.set()
    await asyncio.gather(blocker, *queued)


async def test_a_bound_that_includes_executing_requests_counts_the_batch_running() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make([runtime], default_queue_policy=QueuePolicy(max_queue_size=2))  # the default bound
    blocker = await occupy(batcher, runtime)  # one request executing
    queued = asyncio.ensure_future(submit(batcher, [1.0]))
    await until(lambda: batcher.queued == 1)
    assert batcher.refusal() is not None  # 1 queued + 1 executing
    with pytest.raises(OverloadedError, match=r"max_queue_size 2 requests, executing ones included"):
        await submit(batcher, [1.0])
    gate.set()
    await asyncio.gather(blocker, queued)
    assert batcher.refusal() is None  # nothing queued or executing: room again
    assert (await asyncio.wait_for(submit(batcher, [1.0]), timeout=10)).tolist() == [[2.0, 2.0]]


async def test_triton_s_bound_counts_queued_requests_only() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make(
        [runtime], default_queue_policy=QueuePolicy(max_queue_size=2), max_queue_size_includes_executing=False
    )
    blocker = await occupy(batcher, runtime)
    queued = asyncio.ensure_future(submit(batcher, [1.0]))
    await until(lambda: batcher.queued == 1)
    assert batcher.refusal() is None  # one executing, one queued: the queue has room for one more
    gate.set()
    await asyncio.gather(blocker, queued)


async def test_a_bad_request_fails_alone() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make([runtime])
    blocker = await occupy(batcher, runtime)
    good = asyncio.ensure_future(submit(batcher, [1.0]))
    bad = asyncio.ensure_future(submit(batcher, [-1.0]))
    good2 = asyncio.ensure_future(submit(batcher, [2.0]))
    await until(lambda: batcher.queued == 3)
    gate.set()
    await blocker
    assert (await good).tolist() == [[2.0, 2.0]]
    assert (await good2).tolist() == [[4.0, 4.0]]
    with pytest.raises(InvalidRequestError, match="negative"):
        await bad


class RowDroppingRuntime(FakeRuntime):
    """Breaks the batch contract: one output row fewer than input rows (the model's fault)."""

    def execute(self, inputs: Any, output_names: Any, deadline_s: float | None = None) -> dict[str, Any]:
        return {name: array[1:] for name, array in super().execute(inputs, output_names).items()}


async def test_an_error_of_the_whole_batch_reaches_each_request_as_its_own_copy() -> None:
    runtime = RowDroppingRuntime(threading.Event())
    batcher = make([runtime])
    blocker = await occupy(batcher, runtime)
    pair = [asyncio.ensure_future(submit(batcher, [float(v)])) for v in (1, 2)]
    await until(lambda: batcher.queued == 2)
    assert runtime.gate is not None
    runtime.gate.set()
    outcomes = await asyncio.gather(blocker, *pair, return_exceptions=True)
    first, second = outcomes[1:]
    assert isinstance(first, ModelOutputError) and isinstance(second, ModelOutputError)
    assert first is not second and first.message == second.message  # each can carry its own request id


async def test_cancelled_request_is_dropped_before_it_runs() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make([runtime])
    blocker = await occupy(batcher, runtime)
    gone = asyncio.ensure_future(submit(batcher, [5.0, 5.0, 5.0]))
    kept = asyncio.ensure_future(submit(batcher, [1.0]))
    await until(lambda: batcher.queued == 2)
    gone.cancel()
    gate.set()
    await blocker
    assert (await kept).tolist() == [[2.0, 2.0]]
    assert runtime.batches == [1, 1]  # the 3-row request never reached the runtime


async def test_queue_timeout_rejects_expired_requests() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    clock = FakeClock()
    batcher = make([runtime], clock=clock, default_queue_policy=QueuePolicy(default_timeout_us=500))
    blocker = await occupy(batcher, runtime)
    late = asyncio.ensure_future(submit(batcher, [1.0]))
    await until(lambda: batcher.queued == 1)
    clock.advance(0.001)
    gate.set()
    await blocker
    with pytest.raises(UnavailableError, match="timed out after 1000 us"):
        await late


async def test_higher_priority_runs_first() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make([runtime], max_batch_size=1, priority_levels=2, default_priority_level=2)
    blocker = await occupy(batcher, runtime)
    order: list[str] = []

    async def tracked(name: str, value: float, priority: int) -> None:
        await submit(batcher, [value], priority=priority)
        order.append(name)

    low = asyncio.ensure_future(tracked("low", 1.0, 2))
    await until(lambda: batcher.queued == 1)
    high = asyncio.ensure_future(tracked("high", 2.0, 1))
    await until(lambda: batcher.queued == 2)
    gate.set()
    await asyncio.gather(blocker, low, high)
    assert order == ["high", "low"]


async def test_timing_splits_queue_batch_wait_and_compute() -> None:
    gate = threading.Event()
    busy, free = FakeRuntime(gate), FakeRuntime()
    clock = FakeClock()
    batcher = make([busy, free], max_batch_size=4, clock=clock, max_queue_delay_us=1000)
    blocker = await occupy(batcher, busy, free)
    timing = RequestTiming()
    waiting = asyncio.ensure_future(batcher.submit(fake_work(rows([1.0]), timing=timing)))
    await until(lambda: batcher.queued == 1)
    clock.advance(0.0015)  # an instance is free, the request waits for company until the delay passes
    wakeup = asyncio.ensure_future(submit(batcher, [2.0]))
    await asyncio.gather(waiting, wakeup)
    gate.set()
    await blocker
    assert timing.queue_s == 0.0
    assert timing.batch_wait_s == pytest.approx(0.0015)
    assert timing.batch_rows == 2


async def test_unreachable_deadline_is_refused_at_once_with_an_estimate() -> None:
    runtime = FakeRuntime(compute_s=0.002)
    clock = FakeClock()
    pool = InstancePool([runtime], name="fake")
    pool.calibrate(rows([1.0]), ["y"])  # learns ~2 ms per execution
    runtime.batches.clear()
    batcher = DynamicBatcher("fake", pool, max_batch_size=8, config=DynamicBatchingConfig(), clock=clock)
    with pytest.raises(DeadlineUnreachableError) as raised:
        await submit(batcher, [1.0], deadline_s=clock() + 0.0005)
    assert raised.value.retry_after_s is not None and raised.value.retry_after_s >= 0.002
    assert runtime.batches == []  # refused before any compute
    assert (await submit(batcher, [1.0], deadline_s=clock() + 10.0)).tolist() == [[2.0, 2.0]]


async def test_queued_request_past_its_deadline_is_refused_when_reached() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    clock = FakeClock()
    batcher = make([runtime], clock=clock)
    blocker = await occupy(batcher, runtime)
    late = asyncio.ensure_future(submit(batcher, [1.0], deadline_s=clock() + 0.001))
    await until(lambda: batcher.queued == 1)
    clock.advance(0.002)
    gate.set()
    await blocker
    with pytest.raises(OverloadedError, match="timed out"):
        await late


async def test_each_priority_level_has_its_own_queue_policy() -> None:
    gate = threading.Event()
    runtime = FakeRuntime(gate)
    batcher = make(
        [runtime],
        max_batch_size=1,
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policies={1: QueuePolicy(max_queue_size=1)},
        max_queue_size_includes_executing=False,  # queued requests only: the blocker is not counted
    )
    blocker = await occupy(batcher, runtime)
    urgent = asyncio.ensure_future(submit(batcher, [1.0], priority=1))
    relaxed = [asyncio.ensure_future(submit(batcher, [2.0])) for _ in range(3)]  # level 2: unbounded
    await until(lambda: batcher.queued == 4)
    with pytest.raises(OverloadedError, match="for priority 1 holds max_queue_size 1"):
        await submit(batcher, [3.0], priority=1)
    gate.set()
    await asyncio.gather(blocker, urgent, *relaxed)


@pytest.mark.parametrize("extra_rows", [1, -1])
async def test_a_model_that_answers_the_wrong_number_of_rows_fails_every_request_alone_or_merged(
    extra_rows: int,
) -> None:
    runtime = FakeRuntime(extra_rows=extra_rows)
    batcher = make([runtime], max_batch_size=8)
    # One after another: past the first few lone batches the batcher runs a lone request at once
    # (its own path), which must check the rows as a merged batch's are checked.
    for _ in range(50):
        with pytest.raises(ModelOutputError, match="output 'y' has shape"):
            await asyncio.wait_for(submit(batcher, [1.0]), timeout=10)
        await asyncio.sleep(0)
    assert len(runtime.batches) == 50
    together = [asyncio.ensure_future(submit(batcher, [float(v)])) for v in range(50)]
    outcomes = await asyncio.wait_for(asyncio.gather(*together, return_exceptions=True), timeout=10)
    assert all(isinstance(outcome, ModelOutputError) for outcome in outcomes)
    assert len({id(outcome) for outcome in outcomes}) == 50  # each its own copy, for its own request id

"""InstancePool: where executions run (inline or on threads), and that each instance serves one at a time."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from inferd.core.executor import INLINE_THRESHOLD_S, InstancePool
from inferd.errors import InvalidRequestError
from inferd.testing.fakes import FakeRuntime

FEEDS = {"x": np.ones((1, 2), dtype=np.float32)}


def test_a_model_faster_than_a_thread_hop_runs_inline() -> None:
    pool = InstancePool([FakeRuntime()], name="fast")
    assert pool.calibrate(FEEDS, ["y"]) < INLINE_THRESHOLD_S
    assert pool.runs_inline


def test_a_slower_model_runs_on_threads() -> None:
    pool = InstancePool([FakeRuntime(compute_s=3 * INLINE_THRESHOLD_S)], name="slow")
    pool.calibrate(FEEDS, ["y"])
    assert not pool.runs_inline


def test_a_runtime_that_may_block_never_runs_inline_however_fast() -> None:
    pool = InstancePool([FakeRuntime(may_run_inline=False)], name="python")
    pool.calibrate(FEEDS, ["y"])
    assert not pool.runs_inline
    # The same runtime, allowed on the loop, is fast enough for it (the fastest of its calibration
    # runs, not one run, which a busy machine can slow past the threshold).
    allowed = InstancePool([FakeRuntime()], name="onnx")
    allowed.calibrate(FEEDS, ["y"])
    assert allowed.runs_inline


async def run_executions(pool: InstancePool, count: int) -> None:
    for _ in range(count):
        await pool.execute(FEEDS, ["y"], 1)


async def test_inline_model_that_grows_costly_moves_to_threads_and_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="inferd.executor")
    runtime = FakeRuntime()
    pool = InstancePool([runtime], name="grows")
    pool.calibrate(FEEDS, ["y"])
    assert pool.runs_inline
    runtime.compute_s = 3 * INLINE_THRESHOLD_S  # costlier, but under what a hop to a thread costs
    await run_executions(pool, 200)
    assert pool.runs_inline
    runtime.compute_s = 20 * INLINE_THRESHOLD_S  # e.g. much bigger batches than the probe's one row
    await run_executions(pool, 64)
    assert not pool.runs_inline
    runtime.compute_s = 0.0  # the batches shrink again
    await run_executions(pool, 200)
    assert pool.runs_inline
    moves = [r.getMessage() for r in caplog.records if r.name == "inferd.executor"]
    assert [m.split(" (")[0] for m in moves] == [
        "model grows now runs on worker threads",
        "model grows now runs inline on the event loop",
    ]


async def test_a_model_calibrated_on_threads_stays_there() -> None:
    # Its executions may wait on I/O, which their CPU time does not show: the loop must not run them.
    runtime = FakeRuntime(compute_s=3 * INLINE_THRESHOLD_S)
    pool = InstancePool([runtime], name="slow")
    pool.calibrate(FEEDS, ["y"])
    runtime.compute_s = 0.0
    await run_executions(pool, 200)
    assert not pool.runs_inline


async def test_reported_executions_carry_rows_and_time() -> None:
    seen: list[tuple[int, float]] = []
    pool = InstancePool([FakeRuntime(), FakeRuntime()], name="two", on_execute=lambda r, s: seen.append((r, s)))
    results = await asyncio.gather(*(pool.execute(FEEDS, ["y"], 1) for _ in range(2)))
    assert [r["y"].tolist() for r, _ in results] == [[[2.0, 2.0]]] * 2
    assert [rows for rows, _ in seen] == [1, 1]
    assert pool.idle == 2


async def test_executions_on_threads_use_the_threads_given_and_each_instance_runs_one_at_a_time() -> None:
    gate = threading.Event()
    runtimes = [FakeRuntime(gate), FakeRuntime(gate)]
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="shared") as shared:
        pool = InstancePool(runtimes, name="two", threads=shared)  # not calibrated: runs on threads
        released: list[int] = []
        pool.on_release(lambda: released.append(pool.idle))
        running = [asyncio.ensure_future(pool.execute(FEEDS, ["y"], 1)) for _ in range(3)]
        for _ in range(2000):  # bounded: until both instances are inside an execution
            if all(r.started.is_set() for r in runtimes):
                break
            await asyncio.sleep(0.001)
        assert pool.idle == 0 and not running[2].done()  # the third waits for an instance
        names = {t.name for t in threading.enumerate()}
        assert any(n.startswith("shared") for n in names) and not any(n.startswith("inferd-two") for n in names)
        gate.set()
        await asyncio.gather(*running)
        assert sorted(len(r.batches) for r in runtimes) == [1, 2]
        assert released and pool.idle == 2  # each release heard; the hand-over to the waiter is not one


async def test_an_error_in_an_execution_reaches_its_caller_and_frees_the_instance() -> None:
    pool = InstancePool([FakeRuntime()], name="one")
    with pytest.raises(InvalidRequestError, match="negative"):
        await pool.execute({"x": -FEEDS["x"]}, ["y"], 1)
    assert pool.idle == 1


async def test_a_waiter_cancelled_after_the_hand_over_passes_the_instance_on() -> None:
    pool = InstancePool([FakeRuntime()], name="one")
    instance = await pool.acquire()
    waiter = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)  # it waits now
    pool.release(instance)  # handed to the waiter, which has not resumed yet
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.idle == 1
    assert await pool.acquire() is instance


async def test_a_waiter_cancelled_while_waiting_takes_nothing() -> None:
    pool = InstancePool([FakeRuntime()], name="one")
    pool.calibrate(FEEDS, ["y"])
    instance = await pool.acquire()
    gone = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    # The busy instance's execution, then this one: the cancelled waiter no longer counts.
    assert pool.estimated_wait_s(0) == 2 * pool.mean_execution_s > 0
    pool.release(instance)
    assert pool.idle == 1


async def test_a_release_between_a_cancel_and_its_resumption_keeps_the_instance() -> None:
    pool = InstancePool([FakeRuntime()], name="one")
    instance = await pool.acquire()
    gone = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    gone.cancel()  # its future is cancelled now; the task resumes later
    pool.release(instance)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert pool.idle == 1


class ThreadRecorder(FakeRuntime):
    """Records the thread each execution ran on; any inputs, answered as they came."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        return dict(inputs)


async def ran_on(runtime: ThreadRecorder, pool: InstancePool, feeds: Mapping[str, np.ndarray[Any, Any]]) -> str:
    await pool.execute(feeds, ["x"], 1)
    return "loop" if runtime.threads[-1] == threading.current_thread().name else "thread"


async def test_an_inline_model_runs_inputs_larger_than_it_was_timed_at_on_threads() -> None:
    runtime = ThreadRecorder()
    pool = InstancePool([runtime], name="grows_with_input")
    pool.calibrate(FEEDS, ["x"], max_rows=4)  # one row of 2 elements, batches of 4 rows at most
    assert pool.runs_inline
    assert await ran_on(runtime, pool, FEEDS) == "loop"
    assert await ran_on(runtime, pool, {"x": np.ones((4, 2), np.float32)}) == "loop"  # a full batch
    # More elements than that (more rows, or a longer -1 dimension than the probe's): a thread.
    assert await ran_on(runtime, pool, {"x": np.ones((5, 2), np.float32)}) == "thread"
    assert await ran_on(runtime, pool, {"x": np.ones((1, 100_000), np.float32)}) == "thread"
    assert pool.runs_inline  # the model's placement is unchanged: the next small one is inline
    assert await ran_on(runtime, pool, FEEDS) == "loop"
    # A batch is judged by all its requests' inputs together.
    assert pool.fits_inline(FEEDS, FEEDS, FEEDS, FEEDS)
    assert not pool.fits_inline(FEEDS, FEEDS, FEEDS, FEEDS, FEEDS)


async def test_an_inline_text_model_runs_texts_longer_than_its_probe_on_threads() -> None:
    runtime = ThreadRecorder()
    pool = InstancePool([runtime], name="tokenizer")
    pool.calibrate({"text": np.array([b"probe"], dtype=object)}, ["x"])
    assert pool.runs_inline
    assert await ran_on(runtime, pool, {"text": np.array([b"short"], dtype=object)}) == "loop"
    assert await ran_on(runtime, pool, {"text": np.array([b"x" * 6], dtype=object)}) == "thread"
    # More elements than the probe had, however short: a thread too.
    assert await ran_on(runtime, pool, {"text": np.array([b"", b""], dtype=object)}) == "thread"

"""Runs batches on a model version's instances: one runtime session per instance_group slot, each
used by one worker thread at a time, so the event loop keeps decoding requests meanwhile
(ONNX Runtime releases the GIL while it computes)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from inferd.runtimes import Runtime

Arrays = dict[str, np.ndarray[Any, Any]]

logger = logging.getLogger("inferd.executor")


# Where a model runs is chosen once at load, from its time on a quiet machine: under INLINE_THRESHOLD_S
# it runs inline on the event loop, which it then blocks only briefly; otherwise on worker threads.
INLINE_THRESHOLD_S = 100e-6
# Under traffic the same execution costs the loop's thread 3-5x its quiet time (the loop's request
# parsing evicts the engine's code and data from the caches), while a hop to a worker thread costs
# 300-500 us of CPU per batch and waits for the GIL the loop holds. Measured with wrk on tiny MLPs
# (quiet 30-150 us): inline served 10-25% more requests than threads up to ~400 us per execution.
# So an inline model leaves the loop only above _LEAVE_LOOP_S, and comes back below _RETURN_TO_LOOP_S
# (a gap, so that it does not flap at the border).
_LEAVE_LOOP_S = 4 * INLINE_THRESHOLD_S
_RETURN_TO_LOOP_S = 2 * INLINE_THRESHOLD_S
_CALIBRATION_RUNS = 20
_PLACEMENT_WINDOW = 64


def timed_execute(
    instance: Runtime, inputs: Mapping[str, np.ndarray[Any, Any]], names: Sequence[str]
) -> tuple[Arrays, float, float]:
    """Run on `instance` (from any thread): the outputs, the seconds it took and the CPU seconds of
    the running thread, which the pool uses to choose where the next executions run."""
    started, cpu_started = time.perf_counter(), time.thread_time()
    results = instance.execute(inputs, names)
    return results, time.perf_counter() - started, time.thread_time() - cpu_started


def cores_available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def intra_op_threads_per_instance(total_instances: int) -> int:
    """Split the cores between instances so that instances x threads fit the machine."""
    return max(1, cores_available() // max(1, total_instances))


class InstancePool:
    """The loaded instances of one model version and the threads that run them."""

    def __init__(
        self,
        instances: Sequence[Runtime],
        *,
        name: str,
        on_execute: Callable[[int, float], None] | None = None,
    ) -> None:
        """`on_execute(rows, compute_s)` hears of every execution (for metrics)."""
        if not instances:
            raise ValueError("an instance pool needs at least one instance")
        self._instances = list(instances)
        self._name = name
        self._on_execute = on_execute
        self._inline = False
        # Only a model that calibrated inline moves: one on threads may block on I/O, which its
        # CPU time would not show, and must never block the loop.
        self._movable = False
        self._mean_cpu_s = 0.0
        self._mean_execution_s = 0.0
        self._threads = ThreadPoolExecutor(max_workers=len(instances), thread_name_prefix=f"inferd-{name}")
        # A stack and the futures of those waiting, not an asyncio.Queue: acquiring and releasing
        # happen once per execution, and the queue's bookkeeping cost microseconds of each. Last
        # in, first out: under light load one instance does the work, its memory warm in the
        # caches. The first instance is on top.
        self._free = self._instances[::-1]
        self._waiters: deque[asyncio.Future[Runtime]] = deque()

    @property
    def size(self) -> int:
        return len(self._instances)

    @property
    def idle(self) -> int:
        """Instances not executing now (all of them before serving starts)."""
        return len(self._free)

    async def acquire(self) -> Runtime:
        """An idle instance, waiting for one to be released when all are busy."""
        if self._free:
            return self._free.pop()
        waiter: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Cancelled after an instance was handed over, before it resumed: pass it on.
                self.release(waiter.result())
            elif waiter in self._waiters:  # a release may have dropped it already
                self._waiters.remove(waiter)
            raise

    @property
    def mean_execution_s(self) -> float:
        """Recent mean time of one execution (calibrated at load, then learned from traffic)."""
        return self._mean_execution_s

    def estimated_wait_s(self, executions_ahead: int) -> float:
        """When an execution queued behind `executions_ahead` others (and those already waiting
        for an instance) would finish, from the recent mean execution time."""
        busy = self.size - self.idle
        rounds = (busy + len(self._waiters) + executions_ahead) // self.size + 1
        return rounds * self._mean_execution_s

    def release(self, instance: Runtime) -> None:
        """Give `instance` back: to the first one still waiting, else to the idle ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # cancelled, and not yet resumed to remove itself
                waiter.set_result(instance)
                return
        self._free.append(instance)

    @property
    def runs_inline(self) -> bool:
        """Whether executions run on the event loop (the model is faster than a thread hop)."""
        return self._inline

    def calibrate(self, inputs: Mapping[str, np.ndarray[Any, Any]], names: Sequence[str]) -> float:
        """Time the model on one instance before serving and choose where it runs: inline when its
        fastest execution is under INLINE_THRESHOLD_S. Returns that time."""
        for _ in range(_CALIBRATION_RUNS // 2):  # first runs allocate and are not representative
            self._instances[0].execute(inputs, names)
        durations = []
        for _ in range(_CALIBRATION_RUNS):
            started = time.perf_counter()
            self._instances[0].execute(inputs, names)
            durations.append(time.perf_counter() - started)
        # The fastest run: other models load meanwhile, and contention only ever adds time.
        fastest_s = min(durations)
        self._inline = self._movable = fastest_s < INLINE_THRESHOLD_S
        self._mean_cpu_s = self._mean_execution_s = fastest_s
        return fastest_s

    def try_acquire(self) -> Runtime | None:
        """An idle instance, or None when all are busy."""
        return self._free.pop() if self._free else None

    @property
    def threads(self) -> ThreadPoolExecutor:
        """The worker threads, one per instance, for executions that do not run inline."""
        return self._threads

    async def execute(
        self, instance: Runtime, inputs: Mapping[str, np.ndarray[Any, Any]], names: Sequence[str], rows: int
    ) -> Arrays:
        """Run one batch of `rows` rows on an acquired instance: on its worker thread, or inline
        on the event loop when this model's executions are shorter than the hop to a thread."""
        if self._inline:
            results, execute_s, cpu_s = timed_execute(instance, inputs, names)
        else:
            loop = asyncio.get_running_loop()
            results, execute_s, cpu_s = await loop.run_in_executor(
                self._threads, timed_execute, instance, inputs, names
            )
        self.executed(rows, execute_s, cpu_s)
        return results

    def executed(self, rows: int, execute_s: float, cpu_s: float) -> None:
        """Record one execution (on the event loop's thread): for the estimates, for metrics and
        for the choice of where the next ones run."""
        if self._movable:
            self._place(cpu_s)
        self._mean_execution_s += (execute_s - self._mean_execution_s) / _PLACEMENT_WINDOW
        if self._on_execute is not None:
            self._on_execute(rows, execute_s)

    def _place(self, cpu_s: float) -> None:
        # CPU time of the thread that ran it, so that waiting for a core or for the GIL does not
        # count. Clipped, so that one outlier (a garbage collection, a page fault) cannot tip the
        # mean: only a sustained change (bigger batches, a busier machine) moves the model.
        sample_s = min(cpu_s, 2 * _LEAVE_LOOP_S)
        self._mean_cpu_s += (sample_s - self._mean_cpu_s) / _PLACEMENT_WINDOW
        if self._inline and self._mean_cpu_s > _LEAVE_LOOP_S:
            self._inline = False
        elif not self._inline and self._mean_cpu_s < _RETURN_TO_LOOP_S:
            self._inline = True
        else:
            return
        logger.info(
            "model %s now runs %s (executions average %.0f us of CPU)",
            self._name,
            "inline on the event loop" if self._inline else "on worker threads",
            self._mean_cpu_s * 1e6,
            extra={"model": self._name},
        )

    def run_blocking(self, inputs: Mapping[str, np.ndarray[Any, Any]], names: Sequence[str]) -> Arrays:
        """Run on every instance in turn, before serving starts (warm-up), from the loading thread."""
        results: Arrays = {}
        for instance in self._instances:
            results = instance.execute(inputs, names)
        return results

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        for instance in self._instances:
            instance.close()

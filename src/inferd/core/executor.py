"""Runs executions on a model version's instances, in one place for every caller (the batcher, and
requests to models without one): each instance runs one execution at a time, inline on the event
loop when the model is faster than a hop to a thread and its runtime allows it, else on the
server's worker threads (ONNX Runtime releases the GIL while it computes, so the loop keeps
decoding requests meanwhile).

Thread budget (the server's, not a model's): N loaded models must not mean N thread pools.
* Worker threads: one set for the whole server (`--execution-threads`), started as executions
  need them. An instance holds a thread only while it executes.
* ONNX Runtime's intra-op threads (`--intra-op-pools`): by default one pool sized to the cores,
  which every session shares, so threads do not grow with models. `per-instance` gives each
  session its own pool of cores / the model's instances threads (as Triton does): models with
  several instances compute faster so (two MiniLM instances on one shared pool ran 18-23% slower
  than on a pool each), but every loaded model adds its threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from inferd.limits import text_bytes
from inferd.runtimes import Runtime
from inferd.runtimes.base import cores_available

Arrays = dict[str, np.ndarray[Any, Any]]
Execution = tuple[int, float, float]
"""One run of a runtime: rows, wall seconds, CPU seconds of the thread that ran it (-1: not read)."""
Result = TypeVar("Result")
Job = Callable[[Runtime], tuple[Result, list[Execution]]]
"""Work on one instance (from any thread): its result and the executions it ran."""

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
# Placement reads the CPU time of one execution in _CPU_SAMPLE_EVERY (time.thread_time is a system
# call, 0.6 us, read twice per execution: 2% of a tiny model's request); its mean then spans as
# many executions as the wall-clock mean does, in fewer samples.
_CPU_SAMPLE_EVERY = 8
_CPU_WINDOW = _PLACEMENT_WINDOW // _CPU_SAMPLE_EVERY


def timed_execute(
    instance: Runtime,
    inputs: Mapping[str, np.ndarray[Any, Any]],
    names: Sequence[str],
    rows: int,
    deadline_s: float | None = None,
    cpu: bool = False,
) -> tuple[Arrays, Execution]:
    """Run on `instance` (from any thread): the outputs, and the execution's rows, seconds and,
    when `cpu` (`InstancePool.samples_cpu`), CPU seconds of the running thread (which the pool uses
    to choose where the next ones run; else -1). `deadline_s`: the batch's earliest deadline, which
    the runtime is handed (a remote model passes it on)."""
    started = time.perf_counter()
    cpu_started = time.thread_time() if cpu else 0.0
    results = instance.execute(inputs, names, deadline_s)
    execute_s = time.perf_counter() - started
    return results, (rows, execute_s, time.thread_time() - cpu_started if cpu else -1.0)


def intra_op_threads_per_instance(total_instances: int, *, shared: bool) -> int | None:
    """Threads of each instance's own intra-op pool, so that instances x threads fit the cores;
    None when the instances compute on the pool the server shares."""
    return None if shared else max(1, cores_available() // max(1, total_instances))


def default_execution_threads() -> int:
    """Worker threads of the server: enough for every core to compute and a few executions to wait
    (on a GIL, on I/O in a Python model) without holding the others up."""
    return max(16, 4 * cores_available())


def execution_threads(count: int = 0) -> ThreadPoolExecutor:
    """The server's worker threads, shared by every model (`count` 0: the default)."""
    return ThreadPoolExecutor(max_workers=count or default_execution_threads(), thread_name_prefix="inferd-exec")


class InstancePool:
    """The loaded instances of one model version, and where their executions run."""

    def __init__(
        self,
        instances: Sequence[Runtime],
        *,
        name: str,
        threads: Executor | None = None,
        on_execute: Callable[[int, float], None] | None = None,
    ) -> None:
        """`threads`: the server's worker threads (a pool of its own when None, for tests and
        tools); `on_execute(rows, compute_s)` hears of every execution (for metrics)."""
        if not instances:
            raise ValueError("an instance pool needs at least one instance")
        self._instances = list(instances)
        self._name = name
        self._on_execute = on_execute
        self._on_release: Callable[[], None] | None = None
        self._inline = False
        # A runtime that may block (on I/O, on a sleep) or hold the GIL never runs on the loop,
        # however fast it once was; and only a model that calibrated inline moves: one on threads
        # may wait on something its CPU time would not show.
        self._may_run_inline = all(instance.may_run_inline for instance in self._instances)
        self._movable = False
        # What an execution may hold to run inline: the size the model was timed at (see calibrate).
        self._inline_max_elements = 0
        self._inline_max_text_bytes = 0
        self._mean_cpu_s = 0.0
        self._mean_execution_s = 0.0
        self._unsampled = _CPU_SAMPLE_EVERY  # executions until the next one whose CPU time is read
        self._own_threads = threads is None
        self._threads = threads or ThreadPoolExecutor(max_workers=len(instances), thread_name_prefix=f"inferd-{name}")
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

    @property
    def waiting(self) -> int:
        """Callers waiting for an instance (every instance busy): releases go to them first."""
        return len(self._waiters)

    @property
    def busy(self) -> bool:
        """Whether any instance is executing (or handed to a caller about to run it)."""
        return len(self._free) < len(self._instances)

    def on_release(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the loop) each time an instance becomes free: a batcher dispatches then."""
        self._on_release = callback

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

    def try_acquire(self) -> Runtime | None:
        """An idle instance, or None when all are busy."""
        return self._free.pop() if self._free else None

    def release(self, instance: Runtime) -> None:
        """Give `instance` back: to the first one still waiting, else to the idle ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # cancelled, and not yet resumed to remove itself
                waiter.set_result(instance)
                return
        self._free.append(instance)
        if self._on_release is not None:
            self._on_release()

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

    @property
    def runs_inline(self) -> bool:
        """Whether executions run on the event loop (the model is faster than a thread hop)."""
        return self._inline

    def calibrate(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], names: Sequence[str], *, max_rows: int = 1
    ) -> float:
        """Time the model on one instance before serving and choose where it runs: inline when its
        runtime allows it and its fastest execution is under INLINE_THRESHOLD_S. Returns that time.
        `inputs` are one row; `max_rows`, the most rows a batch of them may hold (the model's
        max_batch_size). Only executions of at most so many rows of that size may then run inline:
        a client chooses its input's size (a 32 MiB text, a million elements for a -1 dimension),
        and work that grows with it must not block the loop because a small one was fast."""
        # A model that may never run inline is timed once, for the first estimates of its waits
        # (a Python model may sleep for seconds: thirty runs would delay its loading by minutes).
        runs = _CALIBRATION_RUNS if self._may_run_inline else 1
        for _ in range(runs // 2):  # first runs allocate and are not representative
            self._instances[0].execute(inputs, names)
        durations = []
        for _ in range(runs):
            started = time.perf_counter()
            self._instances[0].execute(inputs, names)
            durations.append(time.perf_counter() - started)
        # The fastest run: other models load meanwhile, and contention only ever adds time.
        fastest_s = min(durations)
        self._inline = self._movable = self._may_run_inline and fastest_s < INLINE_THRESHOLD_S
        self._mean_cpu_s = self._mean_execution_s = fastest_s
        elements, text = self._size(inputs)
        self._inline_max_elements, self._inline_max_text_bytes = elements * max_rows, text * max_rows
        return fastest_s

    def samples_cpu(self) -> bool:
        """Whether the next execution reads its CPU time (asked on the loop, where it is started):
        only a model that may move does, one execution in _CPU_SAMPLE_EVERY."""
        self._unsampled -= 1  # (a model that never moves counts on below zero: nothing reads it)
        if self._unsampled or not self._movable:
            return False
        self._unsampled = _CPU_SAMPLE_EVERY
        return True

    def fits_inline(self, *feeds: Mapping[str, np.ndarray[Any, Any]]) -> bool:
        """Whether an execution on `feeds` (one request's, or a batch's) may run inline: it is no
        larger than what the model was timed at (calibrate). Asked only of a model that runs inline."""
        elements = text = 0
        for inputs in feeds:
            more_elements, more_text = self._size(inputs)
            elements += more_elements
            text += more_text
        return elements <= self._inline_max_elements and text <= self._inline_max_text_bytes

    @staticmethod
    def _size(inputs: Mapping[str, np.ndarray[Any, Any]]) -> tuple[int, int]:
        """Elements, and bytes of BYTES elements (as `limits.text_bytes` counts them), of `inputs`."""
        # NOTE: on every inline request's path: a sum of sizes; BYTES inputs alone are walked.
        elements = text = 0
        for array in inputs.values():
            elements += array.size
            if array.dtype.kind == "O":
                text += text_bytes(array)
        return elements, text

    def run(
        self,
        instance: Runtime,
        job: Job[Result],
        done: Callable[[Result | BaseException], None],
        *,
        inline: bool = True,
    ) -> None:
        """Run `job` on an acquired `instance`, where this model runs: inline now, or on a worker
        thread (always when `inline` is false: the job is larger than `fits_inline` allows). Then
        (on the loop) the executions are recorded, the instance is released and `done` hears the
        job's result, or the exception it raised."""
        if self._inline and inline:
            try:
                result, executions = job(instance)
            except Exception as exc:  # a bug in the job: its caller must hear of it
                self._finish(instance, exc, [], done)
            else:
                self._finish(instance, result, executions, done)
            return
        future = asyncio.get_running_loop().run_in_executor(self._threads, job, instance)
        future.add_done_callback(lambda ran: self._finished_on_thread(instance, ran, done))

    async def execute(
        self,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        names: Sequence[str],
        rows: int,
        deadline_s: float | None = None,
        instance: Runtime | None = None,
    ) -> tuple[Arrays, float]:
        """Run one batch of `rows` rows on the next free instance (or on `instance`, acquired for
        it already): its outputs and the seconds it waited for that instance."""
        started = time.perf_counter()
        if instance is None:
            instance = await self.acquire()
        waited_s = time.perf_counter() - started
        return await self.start(instance, inputs, names, rows, deadline_s), waited_s

    def start(
        self,
        instance: Runtime,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        names: Sequence[str],
        rows: int,
        deadline_s: float | None,
    ) -> asyncio.Future[Arrays]:
        """Run one batch on `instance`, acquired for it: the future of its outputs. (A future, not a
        coroutine: the single-request path, core.scheduler's DirectScheduler, awaits it with no
        frame between.)"""
        answer: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()

        cpu = self.samples_cpu()

        def job(runtime: Runtime) -> tuple[Arrays, list[Execution]]:
            results, execution = timed_execute(runtime, inputs, names, rows, deadline_s, cpu)
            return results, [execution]

        def done(outcome: Arrays | BaseException) -> None:
            if answer.done():  # its caller is gone (cancelled)
                return
            if isinstance(outcome, BaseException):
                answer.set_exception(outcome)
            else:
                answer.set_result(outcome)

        self.run(instance, job, done, inline=self._inline and self.fits_inline(inputs))
        return answer

    def _finished_on_thread(
        self,
        instance: Runtime,
        ran: asyncio.Future[tuple[Result, list[Execution]]],
        done: Callable[[Result | BaseException], None],
    ) -> None:
        if ran.cancelled():  # the loop is closing
            self._finish(instance, asyncio.CancelledError(), [], done)
        elif (error := ran.exception()) is not None:
            self._finish(instance, error, [], done)
        else:
            result, executions = ran.result()
            self._finish(instance, result, executions, done)

    def _finish(
        self,
        instance: Runtime,
        outcome: Result | BaseException,
        executions: list[Execution],
        done: Callable[[Result | BaseException], None],
    ) -> None:
        for rows, execute_s, cpu_s in executions:
            self._executed(rows, execute_s, cpu_s)
        self.release(instance)
        done(outcome)

    def _executed(self, rows: int, execute_s: float, cpu_s: float) -> None:
        """Record one execution: for the estimates, for metrics and for where the next ones run
        (`cpu_s`: -1 when not read)."""
        if self._movable and cpu_s >= 0:
            self._place(cpu_s)
        self._mean_execution_s += (execute_s - self._mean_execution_s) / _PLACEMENT_WINDOW
        if self._on_execute is not None:
            self._on_execute(rows, execute_s)

    def _place(self, cpu_s: float) -> None:
        # CPU time of the thread that ran it, so that waiting for a core or for the GIL does not
        # count. Clipped, so that one outlier (a garbage collection, a page fault) cannot tip the
        # mean: only a sustained change (bigger batches, a busier machine) moves the model.
        sample_s = min(cpu_s, 2 * _LEAVE_LOOP_S)
        self._mean_cpu_s += (sample_s - self._mean_cpu_s) / _CPU_WINDOW
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
        """After the last execution finished: the sessions go (and the threads, when its own)."""
        if self._own_threads:
            self._threads.shutdown(wait=True)
        for instance in self._instances:
            instance.close()

"""The scheduler contract: how a model version's requests reach its instances.

Every request to a `ModelHandle` becomes one `Work` (the request itself, its validated feeds, its
rows, the outputs it asks for, its admission class) handed to the one `Scheduler` its version chose
at load (`core.loading`):

* `DirectScheduler` (here): each request runs alone, on the next free instance. The only path a
  single request runs on: models without dynamic batching, and the dynamic batcher's lone arrivals.
* `DynamicBatcher` (`core.batcher`): queued requests merged into batches.
* `SequenceBatcher` (`core.sequence`): stateful models' requests, in order, by correlation id.

The contract: `submit(work)` answers the request's own rows of its outputs, or its error;
`refusal()` is the error a request would be refused with now, asked before its body is decoded
(`sheds` says whether it ever can be); `queued` counts what waits in the scheduler; `close()`
answers what still waits with UnavailableError (the handle drains first, so normally nothing).

Admission classes. REAL_TIME work is what a client waits for. BACKGROUND work (shadow copies,
async jobs, batch transforms) runs only in the room real-time traffic leaves: it waits in a queue
of its own (`BackgroundQueue`, bounded separately: when full, a submission is refused with an
OverloadedError to retry; heavy real-time traffic makes background work wait, never fail), and
leaves it only while no real-time request is waiting and an instance is free, one instance kept
for real-time arrivals when the model has several (`background_room`). So a real-time request
never waits behind queued background work, only, on a model of one instance, for the background
execution already running when it came (an execution is never preempted); on a model of several,
for none.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from inferd.config.model import ModelConfig
from inferd.core.executor import Arrays, InstancePool
from inferd.core.tracing import ExecutionTracer
from inferd.core.validation import check_output_rows, output_names, prepare_inputs
from inferd.errors import DeadlineUnreachableError, InvalidRequestError, OverloadedError, UnavailableError
from inferd.runtimes import Runtime
from inferd.types import InferRequest

Clock = Callable[[], float]
Outcome = TypeVar("Outcome")

# Background submissions one model holds waiting at most (each holds its request's arrays).
BACKGROUND_QUEUE_SIZE = 1024
# The request parameter by which a client asks its request be background work (`inferd batch
# --engine server` asks it of every mini-batch): core.dispatcher reads it.
ADMISSION_PARAMETER = "inferd_admission"
# Real-time requests this recent (seconds) mean real-time traffic is coming: background work holds
# back (a batcher's background batches no larger than its real-time ones; async jobs one at a time).
REALTIME_RECENT_S = 1.0


class Admission(enum.Enum):
    REAL_TIME = "real_time"
    """A client waits for the answer: served first, batched with its own kind."""
    BACKGROUND = "background"
    """Runs only in the room real-time traffic leaves (see the module's docstring)."""


@dataclass(eq=False, slots=True)
class Work:
    """One request, validated, as every scheduler takes it. Its context (id, door, deadline, timing,
    trace) is the request's own, `request.context`, one object from the call down."""

    request: InferRequest
    feeds: Mapping[str, np.ndarray[Any, Any]]
    rows: int
    output_names: Sequence[str]
    # The request's deadline_s, made earlier when Triton's `timeout` parameter asks it (on
    # time.monotonic's clock): the one the scheduler keeps and the runtime is told.
    deadline_s: float | None = None
    # Triton's scheduling parameters: the priority level (0: the default one) and the queue timeout.
    priority: int = 0
    timeout_us: int = 0
    admission: Admission = Admission.REAL_TIME


def prepare_work(config: ModelConfig, request: InferRequest, admission: Admission = Admission.REAL_TIME) -> Work:
    """`request` to a model of `config`, validated (core.validation) into the `Work` its scheduler
    takes: its feeds and rows (written to its timing), the outputs it asks, and Triton's scheduling
    parameters, whose `timeout` can only shorten the request's deadline."""
    feeds, rows = prepare_inputs(config, request)
    names = output_names(config, request)
    context = request.context
    context.timing.rows = rows
    if not request.parameters:
        return Work(request, feeds, rows, names, context.deadline_s, 0, 0, admission)
    timeout_us, priority = _int_parameter(request, "timeout"), _int_parameter(request, "priority")
    return Work(request, feeds, rows, names, _deadline(context.deadline_s, timeout_us), priority, timeout_us, admission)


def request_deadline(request: InferRequest) -> float | None:
    """When `request`'s client stops waiting (time.monotonic()): its deadline, shortened by Triton's
    `timeout` parameter; None when neither says."""
    if not request.parameters:
        return request.context.deadline_s
    return _deadline(request.context.deadline_s, _int_parameter(request, "timeout"))


def _deadline(deadline_s: float | None, timeout_us: int) -> float | None:
    if not timeout_us:
        return deadline_s
    # Triton's `timeout` parameter doubles as a deadline: it can only shorten the client's.
    timeout_deadline_s = time.monotonic() + timeout_us / 1e6
    return timeout_deadline_s if deadline_s is None else min(deadline_s, timeout_deadline_s)


def _int_parameter(request: InferRequest, name: str) -> int:
    """Triton's scheduling parameters (`priority`, `timeout` in microseconds): 0 when absent."""
    value = request.parameters.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(f"request parameter '{name}' must be a non-negative integer, got {value!r}")
    return value


class Scheduler(Protocol):
    @property
    def queued(self) -> int:
        """Requests waiting in this scheduler (not yet executing), background ones included."""

    @property
    def sheds(self) -> bool:
        """Whether `refusal()` may refuse a real-time request (a bounded queue): asked once, when
        the handle is published, so that a model that never refuses costs a request nothing."""

    def refusal(self, priority: int = 0, admission: Admission = Admission.REAL_TIME) -> OverloadedError | None:
        """The error a request of `priority` and `admission` would be refused with now, before any
        work is done on it; None when it would be admitted."""

    def submit(self, work: Work) -> Awaitable[Arrays]:
        """The request's own rows of the outputs it asked for, once it ran. (An awaitable: a
        scheduler may hand back the execution's own coroutine rather than wrap it in another.)"""

    async def close(self) -> None:
        """Called once the handle drained: what still waits is answered UnavailableError, what
        executes finishes."""


@dataclass(eq=False, slots=True)
class Queued(Generic[Outcome]):
    """Work waiting in a scheduler's queue, and the future its submitter awaits."""

    work: Work
    enqueued_s: float
    # When it stops being worth running (its deadline or queue timeout), on the scheduler's clock.
    expires_s: float | None
    future: asyncio.Future[Outcome]
    # What must match for requests to merge (the dynamic batcher's: names, datatypes, shapes).
    key: Hashable = ()


class BackgroundQueue(Generic[Outcome]):
    """Background work of one model, first in first out, bounded apart from the real-time queue."""

    def __init__(self, model_name: str, capacity: int = BACKGROUND_QUEUE_SIZE) -> None:
        self._model_name = model_name
        self._capacity = capacity
        self.entries: deque[Queued[Outcome]] = deque()

    def __len__(self) -> int:
        return len(self.entries)

    def refusal(self) -> OverloadedError | None:
        if len(self.entries) < self._capacity:
            return None
        return OverloadedError(
            f"model '{self._model_name}' is busy: its background queue holds {self._capacity} requests; retry later"
        )

    def add(self, entry: Queued[Outcome]) -> None:
        refused = self.refusal()
        if refused is not None:
            raise refused
        self.entries.append(entry)

    def drop_dead(self, now_s: float) -> None:
        """Remove cancelled entries, and refuse expired ones, as the real-time queue does."""
        dead = [e for e in self.entries if e.future.done() or (e.expires_s is not None and e.expires_s <= now_s)]
        for entry in dead:
            self.entries.remove(entry)
            if not entry.future.done():
                waited_us = round((now_s - entry.enqueued_s) * 1e6)
                entry.future.set_exception(
                    OverloadedError(
                        f"model '{self._model_name}': background request timed out after {waited_us} us in the "
                        "background queue (its deadline)"
                    )
                )

    def close(self) -> None:
        while self.entries:
            entry = self.entries.popleft()
            if not entry.future.done():
                entry.future.set_exception(UnavailableError(f"model '{self._model_name}' is unloading"))


def background_room(pool: InstancePool) -> bool:
    """Whether background work may take an instance now: one is free, no real-time request waits
    for one, and, on a model of several instances, one stays free for real-time arrivals."""
    return pool.idle > (pool.size > 1) and not pool.waiting


class DirectScheduler:
    """Each request runs alone on the next free instance: the one single-request path."""

    def __init__(
        self,
        model_name: str,
        pool: InstancePool,
        *,
        batched: bool,
        tracer: ExecutionTracer | None = None,
        clock: Clock = time.monotonic,
        background_queue_size: int = BACKGROUND_QUEUE_SIZE,
    ) -> None:
        """`batched`: the model's outputs have the batch as their first dimension (checked);
        `tracer` hears of every execution when the server traces (None: it does not)."""
        self._model_name = model_name
        self._pool = pool
        self._batched = batched
        self._tracer = tracer
        self._clock = clock
        self._background: BackgroundQueue[Runtime] = BackgroundQueue(model_name, background_queue_size)
        self._listening = False

    @property
    def queued(self) -> int:
        return len(self._background)

    @property
    def sheds(self) -> bool:
        return False

    def refusal(self, priority: int = 0, admission: Admission = Admission.REAL_TIME) -> OverloadedError | None:
        return self._background.refusal() if admission is Admission.BACKGROUND else None

    def submit(self, work: Work) -> Awaitable[Arrays]:
        # NOTE: not a coroutine of its own: the caller awaits the execution's (one frame less on
        # the hot path); a refused deadline raises at the call, inside the caller's coroutine.
        if work.admission is Admission.BACKGROUND:
            return self._submit_background(work)
        if work.deadline_s is not None:
            self._check_deadline(work.deadline_s)
        return self.run(work)

    async def run(self, work: Work, instance: Runtime | None = None) -> Arrays:
        """Run `work` alone now (on `instance`, acquired for it already, or the next free one),
        without admission checks: the batcher's lone arrivals come this way. Its outputs, their
        rows checked when the model is batched (a model that answers more or fewer rows than it
        got must not be answered with them), and its queue and compute time written to its
        timing."""
        pool = self._pool
        context = work.request.context
        timing = context.timing
        started = time.perf_counter()
        # A free instance is taken without a coroutine of its own (`acquire` waits only when none is).
        if instance is None and (instance := pool.try_acquire()) is None:
            instance = await pool.acquire()
        timing.queue_s = time.perf_counter() - started
        results = await pool.start(instance, work.feeds, work.output_names, work.rows, work.deadline_s)
        if self._batched:
            check_output_rows(self._model_name, results, work.rows)
        timing.compute_infer_s = time.perf_counter() - started - timing.queue_s
        timing.batch_rows = work.rows
        if self._tracer is not None:
            self._tracer.executed((context,), work.rows, timing.compute_infer_s, 0.0, False)
        return results

    async def close(self) -> None:
        self._background.close()

    def _check_deadline(self, deadline_s: float) -> None:
        estimate_s = self._pool.estimated_wait_s(0)
        left_s = deadline_s - self._clock()
        if estimate_s > left_s:
            raise DeadlineUnreachableError(
                f"model '{self._model_name}' cannot answer within the request's deadline: "
                f"{max(0.0, left_s) * 1000:.1f} ms left, about {estimate_s * 1000:.1f} ms needed",
                retry_after_s=estimate_s,
            )

    async def _submit_background(self, work: Work) -> Arrays:
        if not self._background and background_room(self._pool):
            return await self.run(work)  # an instance is free: acquired without waiting
        entry: Queued[Runtime] = Queued(
            work, self._clock(), work.deadline_s, asyncio.get_running_loop().create_future()
        )
        self._background.add(entry)
        if not self._listening:  # only a model that ever ran background work hears of releases
            self._pool.on_release(self._start_background)
            self._listening = True
        try:
            instance = await entry.future
        except asyncio.CancelledError:
            if entry.future.done() and not entry.future.cancelled():  # handed an instance, then cancelled
                self._pool.release(entry.future.result())
            raise
        return await self.run(work, instance)

    def _start_background(self) -> None:
        """An instance was released (to no real-time waiter): hand it to the next background work."""
        background = self._background
        if not background:
            return
        background.drop_dead(self._clock())
        while background and background_room(self._pool):
            instance = self._pool.try_acquire()
            assert instance is not None
            background.entries.popleft().future.set_result(instance)

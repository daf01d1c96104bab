"""`DynamicBatcher`: merges queued requests of one model version into batches along the batch
dimension and runs them on the version's instances.

Algorithm. Requests wait in one FIFO queue per priority level (bounded by `max_queue_size`; a
full queue refuses at once). Dispatching is a plain callback, run after each arrival (once per
loop turn, so that requests arriving together go together), after each batch and when a delay
runs out: while an instance is idle, form a batch from the head of the highest-priority
non-empty queue, adding later requests whose non-batch shapes and datatypes match, up to
`max_batch_size` rows; then dispatch it when

* it is full (max_batch_size rows, or a preferred batch size), or
* no instance is executing anything (the server is idle: waiting would only add latency), or
* the oldest request in it has waited `max_queue_delay_us`;

otherwise arm one timer for that delay. So a lone request on an idle server runs at once, and
under load batches grow while the instances are busy.

The queue's bound. By default `max_queue_size` counts the requests queued and those executing, so
no admitted request has more than `max_queue_size` requests ahead of it: under overload its wait
is about one queue-drain time (MiniLM on 2 cores: p99 1.1x, benchmarks/overload.py). Triton's
bound (the model parameter `max_queue_size_includes_executing: false`) counts queued requests only,
so an admitted request waits for a full queue and for the batch executing: about two batches' time
when batches are as large as the queue (p99 2.4x there), and the admitted rate was lower (0.88x
against 0.95x of the sustainable rate). Counting the executing batch makes batches under overload
smaller (the executing batch and the queue share the bound), which costs a CPU model nearly nothing
(execution time grows with rows) and a GPU model whose batch of 16 takes as long as one of 32 up to
half its throughput under overload: such a model should say "false".

Company that comes just too late. When clients wait for their answers before they send again (a
closed loop: a pipeline's steps, a fixed set of clients), the rule above splits them into groups
that take turns: while one group's batch runs, the other queues, and when the instance frees, the
queued group goes at once, without the one that is on its way back. Each batch then holds a share
of the clients (MiniLM in the sentence-similarity pipeline at 16 clients: 16 rows where 32 were
there to merge, 15% fewer pairs per second). So the batcher watches for it: a request that must
queue (no instance free) within `max_queue_delay` of a batch that left short of full means waiting
would have paid. From then on, a batch that finds an instance free waits for company too, up to
`max_queue_delay` from the moment the instance became free, until a few such waits in a row gained
nothing (the traffic came alone again). With `max_queue_delay` 0, the default, nothing waits.

Background work (`Admission.BACKGROUND`, see core.scheduler) waits in a queue of its own and
forms batches of its own, only when no real-time request is queued and an instance is free beyond
the one kept for real-time arrivals (`background_room`); its batches do not count as the model
being busy, so a real-time request never waits for company because background work runs. While
real-time requests keep coming (one in the last REALTIME_RECENT_S), a background batch is no
larger than the last real-time batch: a real-time arrival that finds the instance taken by
background work waits no longer than it would behind real-time work (a drain of a backlog at the
model's full batch size would make every such arrival wait a whole large batch). A lone
real-time arrival on an idle model runs on the direct scheduler's path (`DirectScheduler.run`), the
one path a single request runs on.

The pool runs each batch where the model runs (inline, inside the callback, or on a worker
thread, with its merging and splitting), calls back when it is done and again whenever an
instance is free. Each request gets exactly its own rows of every output, or its own error: when
a merged batch fails for a reason a request can cause, its requests are re-run one by one so that
one bad request cannot fail its neighbours. Nothing polls; time comes from an injected monotonic clock.
Cost per request: O(1) to queue, O(requests in the queue) to form a batch in the worst case
(incompatible shapes interleaved), one concatenate per input per batch and one view per output.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque

from inferd.config.model import DynamicBatchingConfig, QueuePolicy
from inferd.core.executor import Arrays, Execution, InstancePool, timed_execute
from inferd.core.rows import merge_arrays, split_arrays
from inferd.core.scheduler import (
    BACKGROUND_QUEUE_SIZE,
    REALTIME_RECENT_S,
    Admission,
    BackgroundQueue,
    Clock,
    DirectScheduler,
    Queued,
    Work,
    background_room,
)
from inferd.core.tracing import ExecutionTracer
from inferd.core.validation import check_output_rows
from inferd.errors import (
    DeadlineUnreachableError,
    InferdError,
    InvalidRequestError,
    ModelOutputError,
    OverloadedError,
    UnavailableError,
    copied,
)
from inferd.runtimes import Runtime

# A request in a queue: requests merge only when every input matches in name, datatype and
# non-batch shape (its key). Its deadline is passed on to the runtime (which may forward it: a
# remote model).
_Pending = Queued[Arrays]


class DynamicBatcher:
    def __init__(
        self,
        model_name: str,
        pool: InstancePool,
        *,
        max_batch_size: int,
        config: DynamicBatchingConfig,
        clock: Clock = time.monotonic,
        tracer: ExecutionTracer | None = None,
        background_queue_size: int = BACKGROUND_QUEUE_SIZE,
    ) -> None:
        """`tracer`: hears of every execution when the server traces (None: it does not)."""
        self._model_name = model_name
        # The one single-request path, for a lone arrival on an idle model.
        self._direct = DirectScheduler(model_name, pool, batched=True, tracer=tracer, clock=clock)
        self._tracer = tracer
        self._pool = pool
        self._max_batch_size = max_batch_size
        self._config = config
        self._clock = clock
        self._preferred = frozenset(s for s in config.preferred_batch_sizes if 0 < s <= max_batch_size)
        self._delay_s = config.max_queue_delay_us / 1e6
        levels = max(1, config.priority_levels)
        self._queues: list[deque[_Pending]] = [deque() for _ in range(levels)]
        self._default_priority = min(max(config.default_priority_level or 1, 1), levels)
        self._dispatch_due = False
        self._timer: asyncio.TimerHandle | None = None
        # id(instance) -> when it last became idle (on the batcher's clock), to split queue time
        # (no instance free) from batch-wait time (an instance free, waiting for company).
        self._idle_since: dict[int, float] = {}
        # preserve_ordering: each batch resolves its futures only after the batch before it did.
        self._previous_done: asyncio.Future[None] | None = None
        pool.on_release(self.wake)
        # Whether a request should wait a loop turn for others arriving with it (see _dispatch_alone).
        self._expect_company = True
        self._lone_batches = 0
        self._dispatched_alone_this_turn = False
        # Whether a batch waits for company while every instance is free (see the module's docstring).
        self._wait_when_idle = False
        # A request queued before this time (on the clock) came just too late for a batch.
        self._late_until_s = -math.inf
        # When an instance last became free.
        self._freed_s = -math.inf
        # Requests in the batch when it began to wait on an idle model (0: it is not waiting so).
        self._idle_wait_requests = 0
        self._fruitless_waits = 0
        # Requests in batches executing now (the queue bound may count them: see _overloaded).
        self._executing = 0
        self._background: BackgroundQueue[Arrays] = BackgroundQueue(model_name, background_queue_size)
        # Background batches executing now: their instances do not make the model busy.
        self._background_batches = 0
        # When a real-time request last came, and the rows of the last real-time batch: the bound
        # on a background batch's rows while real-time requests keep coming.
        self._realtime_at_s = -math.inf
        self._realtime_rows = 1
        # Whether a full queue can refuse a request before its body is decoded: a bounded queue, and
        # one priority level (with several, which queue a request joins is in its body).
        self.sheds = config.priority_levels <= 1 and any(
            policy.max_queue_size for policy in (config.default_queue_policy, *config.priority_queue_policies.values())
        )

    @property
    def queued(self) -> int:
        return sum(map(len, self._queues)) + len(self._background.entries)

    async def submit(self, work: Work) -> Arrays:
        """Queue a request of `work.rows` rows; its own rows of each output once its batch ran.

        Refuses at once when the queue is full or when its deadline (on the batcher's clock)
        cannot be met by the estimate; a queued request that outlives its timeout or deadline is
        refused when reached. Fills in the queue, batch-wait and compute parts of its timing.
        """
        if work.admission is Admission.BACKGROUND:
            return await self._submit_background(work)
        level = self._priority_index(work.priority)
        queue = self._queues[level]
        if self._dispatched_alone_this_turn:  # company after all: wait for it from now on
            self._expect_company, self._lone_batches = True, 0
        policy = self._config.queue_policy(level + 1)
        if policy.max_queue_size:  # asked here, not in _overloaded: most queues are unbounded
            overloaded = self._overloaded(level, policy)
            if overloaded is not None:
                raise overloaded
        self._realtime_at_s = now = self._clock()
        deadline_s = work.deadline_s
        if deadline_s is not None:
            estimate_s = self.estimated_wait_s()
            if now + estimate_s > deadline_s:
                raise DeadlineUnreachableError(
                    f"model '{self._model_name}' cannot answer within the request's deadline: "
                    f"{max(0.0, deadline_s - now) * 1000:.1f} ms left, about {estimate_s * 1000:.1f} ms needed "
                    f"({self.queued} request(s) queued, {self._pool.mean_execution_s * 1000:.2f} ms per execution)",
                    retry_after_s=estimate_s,
                )
        if not self._pool.idle and now < self._late_until_s:
            self._wait_when_idle, self._fruitless_waits = True, 0  # it would have joined, had the batch waited
        pool = self._pool
        if not (
            self._expect_company
            or self._wait_when_idle
            or (pool.busy and (not self._background_batches or pool.size - pool.idle > self._background_batches))
            or self._dispatch_due
            or self._config.preserve_ordering
        ):
            self._realtime_rows = work.rows
            return await self._run_alone(work)
        timeout_us = work.timeout_us
        timeout = timeout_us if (timeout_us > 0 and policy.allow_timeout_override) else policy.default_timeout_us
        expires_s = now + timeout / 1e6 if timeout > 0 and policy.timeout_action_reject else None
        if deadline_s is not None:
            expires_s = deadline_s if expires_s is None else min(expires_s, deadline_s)
        pending = _pending(work, now, expires_s)
        queue.append(pending)
        self.wake()
        # NOTE: if the caller is cancelled (client gone), the future is cancelled with it and the
        # dispatcher drops the request when it reaches it, before spending compute on it.
        return await pending.future

    async def _submit_background(self, work: Work) -> Arrays:
        """Wait in the background queue until real-time traffic leaves room (see _dispatch)."""
        pending = _pending(work, self._clock(), work.deadline_s)
        self._background.add(pending)  # refused when full: the caller retries
        self.wake()
        return await pending.future

    def refusal(self, priority: int = 0, admission: Admission = Admission.REAL_TIME) -> OverloadedError | None:
        """The error a request of `priority` would be refused with now, its queue being full;
        None when it would be admitted. Doors ask before decoding a body, so that shedding load
        costs as little as it can."""
        if admission is Admission.BACKGROUND:
            return self._background.refusal()
        level = self._priority_index(priority)
        return self._overloaded(level, self._config.queue_policy(level + 1))

    def _overloaded(self, level: int, policy: QueuePolicy) -> OverloadedError | None:
        if not policy.max_queue_size:
            return None
        counts_executing = self._config.max_queue_size_includes_executing
        ahead = len(self._queues[level]) + (self._executing if counts_executing else 0)
        if ahead < policy.max_queue_size:
            return None
        return OverloadedError(
            f"model '{self._model_name}' is overloaded: its queue"
            f"{f' for priority {level + 1}' if self._config.priority_queue_policies else ''} holds max_queue_size "
            f"{policy.max_queue_size} requests{', executing ones included' if counts_executing else ''}; retry later",
            retry_after_s=self.estimated_wait_s(),
        )

    def _busy(self) -> bool:
        """Whether real-time work is executing (background batches' instances do not count)."""
        pool = self._pool
        return pool.busy and (not self._background_batches or pool.size - pool.idle > self._background_batches)

    async def _run_alone(self, work: Work) -> Arrays:
        """Run a request that comes alone to an idle batcher at once, on the direct scheduler's
        path, the one a model without a batcher runs one on (which checks its rows, as _split
        checks a batch's), rather than a loop turn later in case company comes (24 us more of a
        lone request's latency on the tiny model). Company that has not been coming (see
        _learn_company); should a second request arrive in this loop turn after all, later ones
        wait for company again."""
        self._dispatched_alone_this_turn = True
        asyncio.get_running_loop().call_soon(self._turn_over)
        self._learn_company(1)
        self._executing += 1
        try:
            return await self._direct.run(work)
        finally:
            self._executing -= 1

    def _turn_over(self) -> None:
        self._dispatched_alone_this_turn = False

    def _learn_company(self, requests: int) -> None:
        """After each batch formed: whether arrivals keep company, from the last few batches."""
        if requests > 1:
            self._lone_batches = 0
            self._expect_company = True
        elif self._expect_company:
            self._lone_batches += 1
            self._expect_company = self._lone_batches < _LONE_BATCHES_BEFORE_DISPATCHING_AT_ONCE

    def wake(self) -> None:
        """Dispatch soon: after the requests already runnable in this loop turn have queued too.
        (The pool calls it whenever an instance is free.)"""
        if not self._dispatch_due and self.queued:
            self._dispatch_due = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def estimated_wait_s(self) -> float:
        """When a request queued now would be answered: the batches ahead of it, spread over the
        instances, at the recent mean execution time."""
        rows_ahead = sum(p.work.rows for queue in self._queues for p in queue)
        return self._pool.estimated_wait_s(-(-rows_ahead // self._max_batch_size))

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._background.close()
        for queue in self._queues:
            while queue:
                pending = queue.popleft()
                if not pending.future.done():
                    pending.future.set_exception(UnavailableError(f"model '{self._model_name}' is unloading"))

    # -- scheduling ------------------------------------------------------------------------------

    def _priority_index(self, priority: int) -> int:
        level = priority if 1 <= priority <= len(self._queues) else self._default_priority
        return level - 1

    def _dispatch(self) -> None:
        """Start every batch that should go now; arm the timer for the one that should wait."""
        # Still "due" while it runs: releases of batches run inline here need no second dispatch.
        self._dispatch_due = True
        try:
            while self._pool.idle:
                queue = self._drop_dead()
                if queue is None:
                    if self._background.entries and background_room(self._pool):
                        self._start_background()
                        continue
                    return
                batch, rows = self._candidates(queue)
                now = self._clock()
                full = rows >= self._max_batch_size or rows in self._preferred
                if not full and self._delay_s:
                    wait_s = self._wait_s(batch[0], now)
                    if wait_s > 0:
                        if not self._busy() and not self._idle_wait_requests:
                            self._idle_wait_requests = len(batch)
                        self._wake_in(wait_s)
                        return
                    # Requests that must queue before this come just too late for this batch.
                    self._late_until_s = now + self._delay_s
                _take(queue, batch)
                self._realtime_rows = rows
                self._learn_company(len(batch))
                self._learn_waiting(len(batch))
                instance = self._pool.try_acquire()
                assert instance is not None
                self._start(instance, batch, now)
        finally:
            self._dispatch_due = False

    def _wait_s(self, head: _Pending, now: float) -> float:
        """How much longer the batch that `head` leads should wait for company (<= 0: go now)."""
        if self._busy():  # as Triton: up to max_queue_delay after its oldest request came
            return head.enqueued_s + self._delay_s - now
        if self._wait_when_idle:  # company has been coming just too late: wait for it
            return max(head.enqueued_s, self._freed_s) + self._delay_s - now
        return 0.0

    def _learn_waiting(self, requests: int) -> None:
        """After a batch that waited on an idle model: whether waiting so still pays."""
        if not self._idle_wait_requests:
            return
        if requests > self._idle_wait_requests:
            self._fruitless_waits = 0
        else:
            self._fruitless_waits += 1
            self._wait_when_idle = self._fruitless_waits < _FRUITLESS_WAITS_BEFORE_GOING_AT_ONCE
        self._idle_wait_requests = 0

    def _wake_in(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._dispatch)

    def _drop_dead(self) -> deque[_Pending] | None:
        """Remove cancelled and expired requests; the first queue that still holds work."""
        now = self._clock()
        for level, queue in enumerate(self._queues):
            for pending in [p for p in queue if p.future.done() or (p.expires_s is not None and p.expires_s <= now)]:
                queue.remove(pending)
                if not pending.future.done():
                    waited_us = round((now - pending.enqueued_s) * 1e6)
                    pending.future.set_exception(
                        OverloadedError(
                            f"model '{self._model_name}': request timed out after {waited_us} us in the queue "
                            "(its deadline, or the queue policy's default_timeout_microseconds "
                            f"{self._config.queue_policy(level + 1).default_timeout_us})",
                            retry_after_s=self.estimated_wait_s(),
                        )
                    )
            if queue:
                return queue
        return None

    def _candidates(self, queue: deque[_Pending], max_rows: int = 0) -> tuple[list[_Pending], int]:
        """The batch the queue's head leads: the requests after it that merge with it, up to
        `max_rows` (default the model's max_batch_size; the head goes whatever its rows)."""
        max_rows = max_rows or self._max_batch_size
        head = queue[0]
        batch, rows = [head], head.work.rows
        for index in range(1, len(queue)):
            if rows >= max_rows:
                break
            pending = queue[index]
            if pending.key == head.key and rows + pending.work.rows <= max_rows:
                batch.append(pending)
                rows += pending.work.rows
        return batch, rows

    def _start_background(self) -> None:
        """A batch of background work on a free instance (the caller saw background_room)."""
        background = self._background
        now = self._clock()
        background.drop_dead(now)
        if not background:
            return
        realtime_recent = now - self._realtime_at_s < REALTIME_RECENT_S
        batch, _ = self._candidates(background.entries, self._realtime_rows if realtime_recent else 0)
        _take(background.entries, batch)
        instance = self._pool.try_acquire()
        assert instance is not None
        self._start(instance, batch, now, background=True)

    # -- execution -------------------------------------------------------------------------------

    def _start(
        self, instance: Runtime, batch: list[_Pending], dispatched_s: float, *, background: bool = False
    ) -> None:
        idle_since_s = self._idle_since.get(id(instance), 0.0)
        turn = self._take_turn() if self._config.preserve_ordering and not background else None
        # Background batches count apart: they neither fill the real-time bound nor make the model busy.
        executing = 0 if background else len(batch)
        self._executing += executing
        self._background_batches += background

        def done(outcome: tuple[list[Arrays | BaseException], tuple[float, float, float]] | BaseException) -> None:
            self._idle_since[id(instance)] = finished_s = self._clock()
            if not background:  # when a real-time instance freed, for waits on an idle model
                self._freed_s = finished_s
            self._executing -= executing
            self._background_batches -= background
            outcomes: list[Arrays | BaseException]
            if isinstance(outcome, BaseException):  # cancelled at shutdown, or a bug: every waiter hears
                outcomes, phases = [outcome] * len(batch), _NO_PHASES
            else:
                outcomes, phases = outcome
            if turn is None:
                self._resolve(batch, outcomes, phases, idle_since_s, dispatched_s, finished_s)
                return
            previous, finished = turn

            def resolve(_: object = None) -> None:
                self._resolve(batch, outcomes, phases, idle_since_s, dispatched_s, finished_s)
                finished.set_result(None)

            if previous is None or previous.done():
                resolve()
            else:
                previous.add_done_callback(resolve)

        pool = self._pool
        inline = pool.runs_inline and pool.fits_inline(*[pending.work.feeds for pending in batch])
        cpu = pool.samples_cpu()
        pool.run(instance, lambda runtime: self._run(runtime, batch, cpu), done, inline=inline)

    def _run(
        self, instance: Runtime, batch: list[_Pending], cpu: bool = False
    ) -> tuple[tuple[list[Arrays | BaseException], tuple[float, float, float]], list[Execution]]:
        """Merge, execute, split (on any thread): each request's outputs or error with the seconds
        spent merging, running and splitting; and the executions it took (`cpu`: their CPU time
        read, see InstancePool.samples_cpu)."""
        started_s = self._clock()
        rows = sum(p.work.rows for p in batch)
        names = list(dict.fromkeys(name for pending in batch for name in pending.work.output_names))
        feeds = merge_arrays([p.work.feeds for p in batch])
        merged_s = self._clock()
        deadlines = [p.work.deadline_s for p in batch if p.work.deadline_s is not None]
        try:
            results, execution = timed_execute(instance, feeds, names, rows, min(deadlines, default=None), cpu)
        except InferdError as exc:
            if len(batch) == 1 or not isinstance(exc, InvalidRequestError):
                # Only a request's own rows can be to blame for an InvalidRequestError; any other
                # error (a remote model down, outputs that break the contract) is the batch's.
                return ([exc] * len(batch), (merged_s - started_s, self._clock() - merged_s, 0.0)), []
            # Find whose request it was: each runs alone, so only the faulty one fails.
            outcomes: list[Arrays | BaseException] = []
            executions: list[Execution] = []
            for pending in batch:
                (alone, _), ran = self._run(instance, [pending])
                outcomes += alone
                executions += ran
            return (outcomes, (merged_s - started_s, self._clock() - merged_s, 0.0)), executions
        ran_s = self._clock()
        outcomes = self._split(batch, results, rows)
        return (outcomes, (merged_s - started_s, ran_s - merged_s, self._clock() - ran_s)), [execution]

    def _split(self, batch: list[_Pending], results: Arrays, rows: int) -> list[Arrays | BaseException]:
        try:
            check_output_rows(self._model_name, results, rows)
        except ModelOutputError as error:
            return [error] * len(batch)
        if len(batch) == 1:
            return [results]
        works = [p.work for p in batch]
        outcomes: list[Arrays | BaseException] = []
        outcomes += split_arrays(results, [w.rows for w in works], [w.output_names for w in works])
        return outcomes

    def _resolve(
        self,
        batch: list[_Pending],
        outcomes: list[Arrays | BaseException],
        phases: tuple[float, float, float],
        idle_since_s: float,
        dispatched_s: float,
        finished_s: float,
    ) -> None:
        rows = sum(p.work.rows for p in batch)
        for pending, outcome in zip(batch, outcomes, strict=True):
            timing = pending.work.request.context.timing
            # Before an instance was free it queued; after, it waited for company.
            timing.queue_s = max(0.0, idle_since_s - pending.enqueued_s)
            timing.batch_wait_s = max(0.0, dispatched_s - max(idle_since_s, pending.enqueued_s))
            timing.compute_input_s, timing.compute_infer_s, timing.compute_output_s = phases
            timing.batch_rows = rows
            if pending.future.done():
                continue
            if isinstance(outcome, InferdError) and len(batch) > 1:
                # One error for the whole batch: each request gets its own copy to put its id on.
                pending.future.set_exception(copied(outcome))
            elif isinstance(outcome, BaseException):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)
        if self._tracer is not None:
            now = self._clock()
            failed = all(isinstance(outcome, BaseException) for outcome in outcomes)
            contexts = [p.work.request.context for p in batch]
            self._tracer.executed(contexts, rows, now - dispatched_s, now - finished_s, failed)

    def _take_turn(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """preserve_ordering: a batch answers only after the batch dispatched before it answered."""
        previous, done = self._previous_done, asyncio.get_running_loop().create_future()
        self._previous_done = done
        return previous, done


_NO_PHASES = (0.0, 0.0, 0.0)
# Batches of one request in a row after which arrivals are taken to come alone, and dispatched at
# once rather than a loop turn later (24 us of a lone request's latency, on the tiny model).
_LONE_BATCHES_BEFORE_DISPATCHING_AT_ONCE = 8
# Waits on an idle model in a row that gained no request, after which batches go at once again.
_FRUITLESS_WAITS_BEFORE_GOING_AT_ONCE = 4


def _take(queue: deque[_Pending], batch: list[_Pending]) -> None:
    """Remove `batch` from `queue`: usually its head, in order."""
    if all(queue[index] is pending for index, pending in enumerate(batch)):
        for _ in batch:
            queue.popleft()
    else:
        for pending in batch:
            queue.remove(pending)


def _pending(work: Work, now_s: float, expires_s: float | None) -> _Pending:
    key = tuple((name, array.dtype.str, array.shape[1:]) for name, array in work.feeds.items())
    # NOTE: the class itself, not the _Pending alias: calling a generic alias costs ~0.7 us more.
    return Queued(work, now_s, expires_s, asyncio.get_running_loop().create_future(), key)

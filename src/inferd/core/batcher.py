"""`DynamicBatcher`: merges queued requests of one model version into batches along the batch
dimension and runs them on the version's instances.

Algorithm. Requests wait in one FIFO queue per priority level (bounded by `max_queue_size`; a
full queue refuses at once). One scheduler task loops: take an idle instance; form a batch from
the head of the highest-priority non-empty queue, adding later requests whose non-batch shapes
and datatypes match, up to `max_batch_size` rows; then dispatch it when

* it is full (max_batch_size rows, or a preferred batch size), or
* no instance is executing anything (the server is idle: waiting would only add latency), or
* the oldest request in it has waited `max_queue_delay_us`;

otherwise wait for the next arrival or that deadline, whichever comes first. So a lone request on
an idle server runs at once, and under load batches grow while the instances are busy. Each
request gets exactly its own rows of every output, or its own error: when a merged batch fails,
its requests are re-run one by one so that one bad request cannot fail its neighbours.
The scheduler wakes on events only, never polls; time comes from an injected monotonic clock.
Cost per request: O(1) to queue, O(requests in the queue) to form a batch in the worst case
(incompatible shapes interleaved), one concatenate per input per batch and one view per output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.config.model import DynamicBatchingConfig
from inferd.core.executor import Arrays, InstancePool
from inferd.errors import DeadlineUnreachableError, InferdError, InternalError, OverloadedError, UnavailableError
from inferd.runtimes import Runtime
from inferd.types import RequestTiming

logger = logging.getLogger("inferd.batcher")

Clock = Callable[[], float]


@dataclass(eq=False, slots=True)
class _Pending:
    feeds: Mapping[str, np.ndarray[Any, Any]]
    rows: int
    output_names: Sequence[str]
    # Requests merge only when every input matches in name, datatype and non-batch shape.
    key: tuple[Any, ...]
    enqueued_s: float
    expires_s: float | None
    timing: RequestTiming
    future: asyncio.Future[Arrays] = field(repr=False)


class DynamicBatcher:
    def __init__(
        self,
        model_name: str,
        pool: InstancePool,
        *,
        max_batch_size: int,
        config: DynamicBatchingConfig,
        clock: Clock = time.monotonic,
    ) -> None:
        self._model_name = model_name
        self._pool = pool
        self._max_batch_size = max_batch_size
        self._config = config
        self._clock = clock
        self._preferred = frozenset(s for s in config.preferred_batch_sizes if 0 < s <= max_batch_size)
        self._delay_s = config.max_queue_delay_us / 1e6
        levels = max(1, config.priority_levels)
        self._queues: list[deque[_Pending]] = [deque() for _ in range(levels)]
        self._default_priority = min(max(config.default_priority_level or 1, 1), levels)
        self._executing = 0
        self._running: set[asyncio.Task[None]] = set()
        # NOTE: created on first submit, on the serving loop (the batcher is built on a loader thread).
        self._wakeup: asyncio.Event | None = None
        self._scheduler: asyncio.Task[None] | None = None
        # preserve_ordering: each batch resolves its futures only after the batch before it did.
        self._previous_done: asyncio.Future[None] | None = None

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues)

    async def submit(
        self,
        feeds: Mapping[str, np.ndarray[Any, Any]],
        rows: int,
        output_names: Sequence[str],
        *,
        timing: RequestTiming,
        priority: int = 0,
        timeout_us: int = 0,
        deadline_s: float | None = None,
    ) -> Arrays:
        """Queue a request of `rows` rows; its own rows of each output once its batch ran.

        Refuses at once when the queue is full or when `deadline_s` (on the batcher's clock)
        cannot be met by the estimate; a queued request that outlives its timeout or deadline is
        refused when reached. Fills in the queue, batch-wait and compute parts of `timing`.
        """
        self._ensure_started()
        level = self._priority_index(priority)
        queue = self._queues[level]
        policy = self._config.queue_policy(level + 1)
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            raise OverloadedError(
                f"model '{self._model_name}' is overloaded: its queue"
                f"{f' for priority {level + 1}' if self._config.priority_queue_policies else ''} holds max_queue_size "
                f"{policy.max_queue_size} requests; retry later",
                retry_after_s=self.estimated_wait_s(),
            )
        now = self._clock()
        if deadline_s is not None:
            estimate_s = self.estimated_wait_s()
            if now + estimate_s > deadline_s:
                raise DeadlineUnreachableError(
                    f"model '{self._model_name}' cannot answer within the request's deadline: "
                    f"{max(0.0, deadline_s - now) * 1000:.1f} ms left, about {estimate_s * 1000:.1f} ms needed "
                    f"({self.queued} request(s) queued, {self._pool.mean_execution_s * 1000:.2f} ms per execution)",
                    retry_after_s=estimate_s,
                )
        timeout = timeout_us if (timeout_us > 0 and policy.allow_timeout_override) else policy.default_timeout_us
        expires_s = now + timeout / 1e6 if timeout > 0 and policy.timeout_action_reject else None
        if deadline_s is not None:
            expires_s = deadline_s if expires_s is None else min(expires_s, deadline_s)
        loop = asyncio.get_running_loop()
        pending = _Pending(
            feeds=feeds,
            rows=rows,
            output_names=output_names,
            key=tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(feeds.items())),
            enqueued_s=now,
            expires_s=expires_s,
            timing=timing,
            future=loop.create_future(),
        )
        queue.append(pending)
        assert self._wakeup is not None
        self._wakeup.set()
        # NOTE: if the caller is cancelled (client gone), the future is cancelled with it and the
        # scheduler drops the request when it reaches it, before spending compute on it.
        return await pending.future

    @property
    def may_queue(self) -> bool:
        """Whether a request arriving now would probably wait in the queue, rather than be
        dispatched at the scheduler's next turn (nothing queued, an instance idle, no delay due)."""
        return self.queued > 0 or self._pool.idle == 0 or (self._executing > 0 and self._delay_s > 0)

    def estimated_wait_s(self) -> float:
        """When a request queued now would be answered: the batches ahead of it, spread over the
        instances, at the recent mean execution time."""
        rows_ahead = sum(p.rows for queue in self._queues for p in queue)
        return self._pool.estimated_wait_s(-(-rows_ahead // self._max_batch_size))

    async def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler
        for queue in self._queues:
            while queue:
                pending = queue.popleft()
                if not pending.future.done():
                    pending.future.set_exception(UnavailableError(f"model '{self._model_name}' is unloading"))

    # -- scheduling ------------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._scheduler is None:
            self._wakeup = asyncio.Event()
            self._scheduler = asyncio.get_running_loop().create_task(
                self._schedule(), name=f"inferd-batcher-{self._model_name}"
            )

    def _priority_index(self, priority: int) -> int:
        level = priority if 1 <= priority <= len(self._queues) else self._default_priority
        return level - 1

    async def _schedule(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self.queued:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            instance = await self._pool.acquire()
            acquired_s = self._clock()
            try:
                batch = await self._form_batch()
            except BaseException:
                self._pool.release(instance)
                raise
            if not batch:
                self._pool.release(instance)
                continue
            self._executing += 1
            loop = asyncio.get_running_loop()
            turn = self._take_turn(loop) if self._config.preserve_ordering else None
            if self._pool.runs_inline and turn is None:
                # An inline model runs without yielding: a task of its own would only add a hop.
                await self._execute(instance, batch, acquired_s, turn)
                continue
            # NOTE: the set keeps running batches referenced; the loop holds tasks only weakly.
            task = loop.create_task(self._execute(instance, batch, acquired_s, turn))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _form_batch(self) -> list[_Pending]:
        """Wait until a batch should go, then take it off the queue ([] if nothing is left)."""
        assert self._wakeup is not None
        while True:
            self._wakeup.clear()
            queue = self._drop_dead()
            if queue is None:
                return []
            candidates, rows = self._candidates(queue)
            oldest = candidates[0].enqueued_s
            wait_s = oldest + self._delay_s - self._clock()
            if rows >= self._max_batch_size or rows in self._preferred or self._executing == 0 or wait_s <= 0:
                for pending in candidates:
                    queue.remove(pending)
                return candidates
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=wait_s)

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

    def _candidates(self, queue: deque[_Pending]) -> tuple[list[_Pending], int]:
        head = queue[0]
        batch, rows = [head], head.rows
        for pending in list(queue)[1:]:
            if rows >= self._max_batch_size:
                break
            if pending.key == head.key and rows + pending.rows <= self._max_batch_size:
                batch.append(pending)
                rows += pending.rows
        return batch, rows

    # -- execution -------------------------------------------------------------------------------

    async def _execute(
        self,
        instance: Runtime,
        batch: list[_Pending],
        acquired_s: float,
        turn: tuple[asyncio.Future[None] | None, asyncio.Future[None]] | None,
    ) -> None:
        dispatched_s = self._clock()
        outcomes: list[Arrays | BaseException] = []
        phases = (0.0, 0.0, 0.0)
        try:
            outcomes, phases = await self._run_batch(instance, batch)
        except BaseException as exc:  # cancelled at shutdown, or a bug: every waiter must hear of it
            outcomes = [exc] * len(batch)
        finally:
            self._pool.release(instance)
            self._executing -= 1
            assert self._wakeup is not None
            self._wakeup.set()
        rows = sum(p.rows for p in batch)
        if turn is not None:
            previous = turn[0]
            if previous is not None:
                await previous
        for pending, outcome in zip(batch, outcomes, strict=True):
            timing = pending.timing
            # Before an instance was free it queued; after, it waited for company.
            timing.queue_s = max(0.0, acquired_s - pending.enqueued_s)
            timing.batch_wait_s = dispatched_s - max(acquired_s, pending.enqueued_s)
            timing.compute_input_s, timing.compute_infer_s, timing.compute_output_s = phases
            timing.batch_rows = rows
            if pending.future.done():
                continue
            if isinstance(outcome, BaseException):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)
        if turn is not None:
            turn[1].set_result(None)

    async def _run_batch(
        self, instance: Runtime, batch: list[_Pending]
    ) -> tuple[list[Arrays | BaseException], tuple[float, float, float]]:
        """Each request's outputs or error, and the seconds spent merging, running and splitting."""
        started_s = self._clock()
        names = list(dict.fromkeys(name for pending in batch for name in pending.output_names))
        if len(batch) == 1:
            feeds = batch[0].feeds
        else:
            feeds = {name: np.concatenate([p.feeds[name] for p in batch]) for name in batch[0].feeds}
        merged_s = self._clock()
        try:
            results = await self._pool.execute(instance, feeds, names, sum(p.rows for p in batch))
        except InferdError as exc:
            if len(batch) == 1:
                return [exc], (merged_s - started_s, self._clock() - merged_s, 0.0)
            # Find whose request it was: each runs alone, so only the faulty one fails.
            alone = [(await self._run_batch(instance, [pending]))[0][0] for pending in batch]
            return alone, (merged_s - started_s, self._clock() - merged_s, 0.0)
        ran_s = self._clock()
        outcomes = self._split(batch, results)
        return outcomes, (merged_s - started_s, ran_s - merged_s, self._clock() - ran_s)

    def _split(self, batch: list[_Pending], results: Arrays) -> list[Arrays | BaseException]:
        rows = sum(p.rows for p in batch)
        for name, array in results.items():
            if array.ndim == 0 or array.shape[0] != rows:
                error = InternalError(
                    f"model '{self._model_name}' output '{name}' has shape {list(array.shape)}, "
                    f"but the batch had {rows} rows in its first dimension"
                )
                return [error] * len(batch)
        outcomes: list[Arrays | BaseException] = []
        start = 0
        for pending in batch:
            end = start + pending.rows
            outcomes.append({name: results[name][start:end] for name in pending.output_names})
            start = end
        return outcomes

    def _take_turn(self, loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """preserve_ordering: a batch answers only after the batch dispatched before it answered."""
        previous, done = self._previous_done, loop.create_future()
        self._previous_done = done
        return previous, done

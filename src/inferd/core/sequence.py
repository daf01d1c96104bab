"""Triton's sequence batcher, for stateful models: requests carry a correlation id (`sequence_id`,
an integer or a string) and the START / END flags; the batcher keeps each sequence's requests in
order (one in the model at a time) and fills the model's control inputs (START, END, READY, CORRID)
for every row it sends.

- direct: a sequence holds one batch slot (row) from START to END (or until it is idle for
  `max_sequence_idle_microseconds`); a batch has a row per slot up to the highest slot in use, the
  slots without a request marked READY = 0 (their data inputs zeros). A model may keep a slot's
  state by row. Sequences started while every slot is taken wait for one.
- oldest: a batch takes the next request of up to max_batch_size sequences, oldest first, waiting
  up to `max_queue_delay_microseconds` for company; every row is READY.

Batches run one at a time (a sequence model's state lives in its instance: inferd runs it on one
instance at a time). A request for a sequence that is not running, without START, is refused.

It keeps the scheduler contract (core.scheduler) as the dynamic batcher does: time from an injected
monotonic clock (nothing polls: the scheduler sleeps until a request comes or until the next idle
sequence ends or held batch is due), a request's deadline checked against the estimate when it
comes and again when its turn comes, its timing split (queue, batch wait, compute) written, each
execution told to the tracer, and a batching model's output rows checked before they are split.
Background admission is refused: a stateful model's requests belong to their sequence's order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.config.model import ControlKind, ModelConfig, SequenceControl
from inferd.core.executor import Arrays, InstancePool
from inferd.core.scheduler import Admission, Clock, Work
from inferd.core.tracing import ExecutionTracer
from inferd.core.validation import check_output_rows
from inferd.errors import (
    DeadlineUnreachableError,
    InferdError,
    InvalidRequestError,
    ModelNotReadyError,
    OverloadedError,
    UnsupportedError,
    copied,
)
from inferd.types import DataType, InferRequest

logger = logging.getLogger("inferd.sequence")
CorrelationId = int | str


@dataclass(eq=False, slots=True)
class _Item:
    work: Work
    start: bool
    end: bool
    arrived: float
    done: asyncio.Future[Arrays]


@dataclass(eq=False, slots=True)
class _Sequence:
    id: CorrelationId
    last_active: float
    slot: int | None = None
    queue: deque[_Item] = field(default_factory=deque)
    busy: bool = False
    ending: bool = False


def sequence_flags(request: InferRequest, model: str) -> tuple[CorrelationId, bool, bool]:
    """The request's correlation id and its START and END flags, or the 400 that says what is wrong."""
    parameters = request.parameters
    corrid = parameters.get("sequence_id", 0)
    if isinstance(corrid, bool) or not isinstance(corrid, int | str) or (isinstance(corrid, int) and corrid < 0):
        raise InvalidRequestError(f"sequence_id must be a whole number or a string, not {corrid!r}")
    if corrid in (0, ""):
        raise InvalidRequestError(
            f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID: it is a "
            "sequence model (give sequence_id, with sequence_start on the first request)"
        )
    flags = []
    for key in ("sequence_start", "sequence_end"):
        value = parameters.get(key, False)
        if not isinstance(value, bool):
            raise InvalidRequestError(f"{key} must be true or false, not {value!r}")
        flags.append(value)
    return corrid, flags[0], flags[1]


class SequenceBatcher:
    def __init__(
        self,
        config: ModelConfig,
        pool: InstancePool,
        *,
        clock: Clock = time.monotonic,
        tracer: ExecutionTracer | None = None,
    ) -> None:
        """`tracer`: hears of every execution when the server traces (None: it does not)."""
        assert config.sequence_batching is not None
        self._config = config
        self._clock = clock
        self._tracer = tracer
        # When the last batch finished (on the clock): before it a request queued, after it it
        # waited for company.
        self._idle_since = -float("inf")
        self._timer: asyncio.TimerHandle | None = None
        self._settings = config.sequence_batching
        self._pool = pool
        self._batched = config.max_batch_size > 0
        self._slots = max(1, config.max_batch_size)
        self._free_slots = list(range(self._slots))
        self._sequences: dict[CorrelationId, _Sequence] = {}
        self._waiting: deque[_Sequence] = deque()  # direct: started, waiting for a slot
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def queued(self) -> int:
        return sum(len(s.queue) for s in self._sequences.values())

    @property
    def sheds(self) -> bool:
        return False

    def refusal(self, priority: int = 0, admission: Admission = Admission.REAL_TIME) -> OverloadedError | None:
        return None

    async def submit(self, work: Work) -> Arrays:
        if work.admission is Admission.BACKGROUND:
            raise UnsupportedError(
                f"model '{self._config.name}' is a sequence model: its requests cannot run in the background"
            )
        rows = work.rows
        corrid, start, end = sequence_flags(work.request, self._config.name)
        if self._batched and rows != 1:
            raise InvalidRequestError(
                f"a request of sequence {corrid!r} to model '{self._config.name}' carries {rows} rows: sequence "
                "requests carry one (batch size 1)"
            )
        if self._closed:
            raise ModelNotReadyError(f"model '{self._config.name}' is unloading")
        self._expire_idle()  # here too: the answer must not depend on when the scheduler last ran
        sequence = self._sequences.get(corrid)
        if (sequence is None or sequence.ending) and not start:
            raise InvalidRequestError(
                f"inference request for sequence {corrid!r} to model '{self._config.name}' must specify the "
                "START flag on the first request of the sequence (it is not running: never started, ended, "
                "or idle past max_sequence_idle_microseconds)"
            )
        now = self._clock()
        if work.deadline_s is not None:
            ahead = len(sequence.queue) if sequence is not None else 0  # its executing request included
            estimate_s = (ahead + 1) * self._pool.mean_execution_s
            if now + estimate_s > work.deadline_s:
                raise DeadlineUnreachableError(
                    f"model '{self._config.name}' cannot answer within the request's deadline: "
                    f"{max(0.0, work.deadline_s - now) * 1000:.1f} ms left, about {estimate_s * 1000:.1f} ms needed "
                    f"({ahead} request(s) of sequence {corrid!r} ahead)",
                    retry_after_s=estimate_s,
                )
        if sequence is None:
            sequence = _Sequence(corrid, now)
            self._sequences[corrid] = sequence
            self._assign_slot(sequence)
        item = _Item(work, start, end, now, asyncio.get_running_loop().create_future())
        sequence.queue.append(item)
        sequence.last_active = item.arrived
        sequence.ending = end  # after END, only a new START may follow
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()
        return await item.done

    def wake(self) -> None:
        """Look at the sequences again now (the scheduler's timer does, when the clock says)."""
        self._wake.set()

    async def close(self) -> None:
        """Requests still queued are answered UnavailableError (the handle drains before it closes,
        so none normally are); a batch executing finishes."""
        self._closed = True
        for sequence in self._sequences.values():
            for item in list(sequence.queue)[1 if sequence.busy else 0 :]:
                sequence.queue.remove(item)
                if not item.done.done():
                    item.done.set_exception(ModelNotReadyError(f"model '{self._config.name}' is unloading"))
        if self._task is not None:
            self._wake.set()
            await self._task
        if self._timer is not None:
            self._timer.cancel()

    # -- the scheduler --------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._expire_idle()
            batch = self._next_batch()
            if batch:
                await self._execute(batch)
                continue
            if self._closed and not self.queued:
                return
            self._wake.clear()
            self._arm_timer()
            await self._wake.wait()

    def _arm_timer(self) -> None:
        """Wake at the next time something is due: an idle sequence expires, a held batch goes, a
        queued request's deadline passes. No timer when nothing is due (nothing polls)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._clock()
        idle_s = self._settings.max_idle_us / 1e6
        due = [s.last_active + idle_s for s in self._sequences.values() if not s.queue and not s.busy]
        heads = [s.queue[0] for s in self._sequences.values() if s.queue and not s.busy]
        if heads:
            due.append(min(item.arrived for item in heads) + self._settings.max_queue_delay_us / 1e6)
            due += [item.work.deadline_s for item in heads if item.work.deadline_s is not None]
        if due:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, min(due) - now), self._wake.set)

    def _expire_idle(self) -> None:
        now, idle_s = self._clock(), self._settings.max_idle_us / 1e6
        for sequence in list(self._sequences.values()):
            if not sequence.queue and not sequence.busy and now - sequence.last_active >= idle_s:
                logger.info("model %s: sequence %r ended: idle for %.3f s", self._config.name, sequence.id, idle_s)
                self._release(sequence)

    def _drop_expired(self) -> None:
        """Refuse the requests at the head of their sequence whose deadline passed, as the dynamic
        batcher refuses its expired ones: before any compute is spent on them."""
        now = self._clock()
        for sequence in self._sequences.values():
            while sequence.queue and not sequence.busy:
                item = sequence.queue[0]
                if not item.done.done() and (item.work.deadline_s is None or item.work.deadline_s > now):
                    break
                sequence.queue.popleft()
                if not item.done.done():
                    waited_us = round((now - item.arrived) * 1e6)
                    item.done.set_exception(
                        OverloadedError(
                            f"model '{self._config.name}': request timed out after {waited_us} us in the queue "
                            "(its deadline)"
                        )
                    )

    def _next_batch(self) -> list[tuple[_Sequence, _Item]]:
        self._drop_expired()
        ready = [s for s in self._sequences.values() if s.queue and not s.busy]
        delay_s = self._settings.max_queue_delay_us / 1e6
        if self._settings.strategy == "direct":
            ready = sorted((s for s in ready if s.slot is not None), key=lambda s: s.slot or 0)
            slotted = sum(1 for s in self._sequences.values() if s.slot is not None and not s.busy)
            now = self._clock()
            waited_s = now - min((s.queue[0].arrived for s in ready), default=now)
            if ready and len(ready) < slotted and waited_s < delay_s:
                return []  # hold for the other slots' next requests, up to the queue delay
        else:
            ready.sort(key=lambda s: s.queue[0].arrived)
            wanted = min(self._slots, max(self._settings.preferred_batch_sizes, default=self._slots))
            oldest_waited_s = self._clock() - ready[0].queue[0].arrived if ready else 0.0
            if len(ready) < wanted and oldest_waited_s < delay_s:
                return []  # hold for company, up to the queue delay
            ready = ready[: self._slots]
        if not ready:
            return []
        if self._batched:  # rows stack: only requests whose shapes agree with the first go together
            first = {k: v.shape for k, v in ready[0].queue[0].work.feeds.items()}
            ready = [s for s in ready if {k: v.shape for k, v in s.queue[0].work.feeds.items()} == first]
        else:
            ready = ready[:1]
        return [(s, s.queue[0]) for s in ready]

    async def _execute(self, batch: list[tuple[_Sequence, _Item]]) -> None:
        for sequence, _ in batch:
            sequence.busy = True
        dispatched_s = self._clock()
        merged_s = ran_s = dispatched_s
        rows = len(batch)
        failed = True
        try:
            feeds, rows, places = self._feeds(batch)
            names = sorted({name for _, item in batch for name in item.work.output_names})
            merged_s = self._clock()
            deadlines = [item.work.deadline_s for _, item in batch if item.work.deadline_s is not None]
            results, _ = await self._pool.execute(feeds, names, rows, min(deadlines, default=None))
            ran_s = self._clock()
            if self._batched:  # a row too few would answer its request an empty tensor
                check_output_rows(self._config.name, results, rows)
        except Exception as exc:
            ran_s = self._clock()
            for sequence, item in batch:
                sequence.queue.popleft()
                if not item.done.done():
                    # One error for the whole batch: each request gets its own copy to put its id on.
                    item.done.set_exception(copied(exc) if isinstance(exc, InferdError) and len(batch) > 1 else exc)
        else:
            failed = False
            for (sequence, item), row in zip(batch, places, strict=True):
                sequence.queue.popleft()
                wanted = item.work.output_names
                answer = {n: results[n][row : row + 1] if self._batched else results[n] for n in wanted}
                if not item.done.done():
                    item.done.set_result(answer)
        finally:
            finished_s = self._clock()
            for sequence, item in batch:
                sequence.busy = False
                sequence.last_active = finished_s
                if item.end and not sequence.queue:
                    self._release(sequence)
            self._timed(batch, rows, (dispatched_s, merged_s, ran_s, finished_s), failed)
            self._idle_since = finished_s

    def _timed(
        self, batch: list[tuple[_Sequence, _Item]], rows: int, times: tuple[float, float, float, float], failed: bool
    ) -> None:
        """Each request's split of its time (as the dynamic batcher writes it), and the tracer told."""
        dispatched_s, merged_s, ran_s, finished_s = times
        for _, item in batch:
            timing = item.work.request.context.timing
            # Before the previous batch finished it queued; after, it waited for company.
            timing.queue_s = max(0.0, self._idle_since - item.arrived)
            timing.batch_wait_s = max(0.0, dispatched_s - max(self._idle_since, item.arrived))
            timing.compute_input_s = merged_s - dispatched_s
            timing.compute_infer_s = ran_s - merged_s
            timing.compute_output_s = finished_s - ran_s
            timing.batch_rows = rows
        if self._tracer is not None:
            now = self._clock()
            contexts = [item.work.request.context for _, item in batch]
            self._tracer.executed(contexts, rows, now - dispatched_s, now - finished_s, failed)

    def _feeds(self, batch: list[tuple[_Sequence, _Item]]) -> tuple[dict[str, np.ndarray[Any, Any]], int, list[int]]:
        """The batch's inputs, rows stacked (direct: one per slot up to the highest, idle slots zeros
        and not READY), and the control inputs; with the row of each request."""
        if not self._batched:
            sequence, item = batch[0]
            controls = {c.input: self._control(c, [(sequence, item)], 1) for c in self._settings.controls}
            return {**item.work.feeds, **controls}, 1, [0]
        if self._settings.strategy == "direct":
            rows = max(s.slot or 0 for s, _ in batch) + 1
            places = [s.slot or 0 for s, _ in batch]
        else:
            rows, places = len(batch), list(range(len(batch)))
        by_row: list[tuple[_Sequence, _Item] | None] = [None] * rows
        for entry, row in zip(batch, places, strict=True):
            by_row[row] = entry
        template = batch[0][1].work.feeds
        feeds: dict[str, np.ndarray[Any, Any]] = {}
        for name, first in template.items():
            pad = np.zeros_like(first) if first.dtype != object else np.full(first.shape, b"", dtype=object)
            feeds[name] = np.concatenate([entry[1].work.feeds[name] if entry else pad for entry in by_row], axis=0)
        for control in self._settings.controls:
            feeds[control.input] = self._control(control, by_row, rows)
        return feeds, rows, places

    def _control(self, control: SequenceControl, by_row: list[tuple[_Sequence, _Item] | None],
                 rows: int) -> np.ndarray[Any, Any]:  # fmt: skip
        shape = (rows, 1) if self._batched else (1,)
        if control.kind is ControlKind.CORRID:
            ids = [entry[0].id if entry else 0 for entry in by_row]
            if control.datatype is DataType.BYTES:
                return np.array([str(i).encode() if i else b"" for i in ids], dtype=object).reshape(shape)
            if any(isinstance(i, str) for i in ids):
                raise InvalidRequestError(
                    f"model '{self._config.name}' takes integer correlation ids (its CORRID control input "
                    f"'{control.input}' is {control.datatype.value}), not strings"
                )
            return np.array(ids, dtype=control.datatype.numpy_dtype).reshape(shape)

        def flag(entry: tuple[_Sequence, _Item] | None) -> bool:
            if entry is None:
                return False
            if control.kind is ControlKind.START:
                return entry[1].start
            if control.kind is ControlKind.END:
                return entry[1].end
            return True  # READY: a row with a request

        values = [control.true_value if flag(entry) else control.false_value for entry in by_row]
        return np.array(values, dtype=control.datatype.numpy_dtype).reshape(shape)

    def _assign_slot(self, sequence: _Sequence) -> None:
        if self._settings.strategy != "direct":
            return
        if self._free_slots:
            sequence.slot = self._free_slots.pop(0)
        else:
            self._waiting.append(sequence)

    def _release(self, sequence: _Sequence) -> None:
        if self._sequences.get(sequence.id) is sequence:
            del self._sequences[sequence.id]
        if sequence.slot is not None:
            self._free_slots.append(sequence.slot)
            self._free_slots.sort()
            sequence.slot = None
            while self._free_slots and self._waiting:
                waiting = self._waiting.popleft()
                if self._sequences.get(waiting.id) is waiting:
                    waiting.slot = self._free_slots.pop(0)

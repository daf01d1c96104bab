"""One loaded model version: its completed config and what executes it.

`Handle` is what the registry routes requests to, whatever serves them: a `ModelHandle` runs a
runtime's instances (through a batcher when the config asks), an `EnsembleHandle`
(core.ensemble) sends requests on to other models' handles.

Lifecycle: a handle is READY once it was made; the registry then routes requests to it. When it
is replaced (a hot swap) or unloaded, the registry stops routing to it first and then calls
`drain()`: DRAINING lets every request already inside finish, queued ones included, and CLOSED
releases what the handle holds (the batcher, the threads and the sessions).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig
from inferd.core.batcher import DynamicBatcher
from inferd.core.executor import Arrays, InstancePool
from inferd.core.sequence import SequenceBatcher
from inferd.core.tracing import ExecutionTracer
from inferd.core.validation import output_names, prepare_inputs
from inferd.errors import (
    DeadlineUnreachableError,
    InvalidRequestError,
    ModelNotReadyError,
    ModelOutputError,
    OverloadedError,
)
from inferd.runtimes.base import release_freed_memory
from inferd.types import DataType, InferRequest, InferResponse, Tensor


class HandleState(enum.Enum):
    READY = "READY"
    DRAINING = "DRAINING"
    CLOSED = "CLOSED"


@dataclass(slots=True)
class Handle:
    """The lifecycle every handle shares; subclasses give `_infer` and `_close`."""

    config: ModelConfig
    version: int
    # Requests inside `infer` now: queued, waiting for an instance or executing.
    in_flight: int = field(default=0, init=False)
    state: HandleState = field(default=HandleState.READY, init=False)
    # Set by `drain` while it waits for the requests inside to finish.
    _idle: asyncio.Event | None = field(default=None, init=False)

    @property
    def queued(self) -> int:
        """Requests waiting in a batcher's queue (0 for a handle without one)."""
        return 0

    @property
    def sheds(self) -> bool:
        """Whether `refusal` may refuse (a bounded queue); asked once, when the handle is published."""
        return False

    def refusal(self) -> OverloadedError | None:
        """The error any request would be refused with now, before its body is decoded (a full
        queue); None when one may be admitted."""
        return None

    async def infer(self, request: InferRequest) -> InferResponse:
        if self.state is HandleState.CLOSED:
            raise ModelNotReadyError(f"model '{self.config.name}' version {self.version} was unloaded")
        # NOTE: counted before the first await, in the same loop turn as the registry lookup that
        # found this handle, so a drain that starts later always waits for this request.
        self.in_flight += 1
        try:
            return await self._infer(request)
        finally:
            self.in_flight -= 1
            if self._idle is not None and not self.in_flight:
                self._idle.set()

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The request's responses as they come: a decoupled model's, or the one of any other."""
        yield await self.infer(request)

    async def drain(self) -> None:
        """Let the requests inside finish, then close. Call once no new request can find the handle."""
        if self.state is not HandleState.READY:
            return
        self.state = HandleState.DRAINING
        if self.in_flight:
            self._idle = asyncio.Event()
            await self._idle.wait()
        await self._close()

    async def _infer(self, request: InferRequest) -> InferResponse:
        raise NotImplementedError

    async def _close(self) -> None:
        self.state = HandleState.CLOSED


@dataclass(slots=True)
class ModelHandle(Handle):
    """A version served by a runtime's instances."""

    pool: InstancePool
    # Present when the config asks for dynamic batching (and the model batches).
    batcher: DynamicBatcher | None = None
    # Present for a stateful model (sequence_batching): its requests go by correlation id.
    sequencer: SequenceBatcher | None = None
    # Present when the server traces: hears of executions that ran without the batcher.
    tracer: ExecutionTracer | None = None
    # The batcher when a full queue can refuse a request before its body is decoded.
    _shedder: DynamicBatcher | None = field(default=None, init=False)

    @property
    def queued(self) -> int:
        return self.batcher.queued if self.batcher is not None else 0

    @property
    def sheds(self) -> bool:
        return self._shedder is not None

    def refusal(self) -> OverloadedError | None:
        return self._shedder.refusal() if self._shedder is not None else None

    def __post_init__(self) -> None:
        # Asked before every request's body is decoded, when its batcher has a queue bound (the
        # registry's snapshot lists such handles, see `sheds`). With priority levels, which queue
        # a request joins is in its body: such requests are decoded first.
        batching = self.config.dynamic_batching
        bounded = batching is not None and any(
            policy.max_queue_size
            for policy in (batching.default_queue_policy, *batching.priority_queue_policies.values())
        )
        single_level = batching is not None and batching.priority_levels <= 1
        self._shedder = self.batcher if bounded and single_level else None

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        if not self.config.decoupled:
            yield await self.infer(request)
            return
        if self.state is HandleState.CLOSED:
            raise ModelNotReadyError(f"model '{self.config.name}' version {self.version} was unloaded")
        # A decoupled request runs alone (no batching) on one instance, its responses handed over
        # from the worker thread as the model yields them.
        feeds, batch_size = prepare_inputs(self.config, request)
        names = output_names(self.config, request)
        request.timing.rows = batch_size
        self.in_flight += 1
        try:
            instance = await self.pool.acquire()
        except BaseException:
            self._left()
            raise
        loop = asyncio.get_running_loop()
        responses: asyncio.Queue[dict[str, np.ndarray[Any, Any]] | None] = asyncio.Queue()
        stream = getattr(instance, "execute_stream", None)
        if stream is None:  # a runtime without streams answers a decoupled request once

            def stream(feeds: Arrays, names: list[str], emit: Callable[[Arrays], None]) -> None:
                emit(instance.execute(feeds, names))

        def emit(outputs: Arrays) -> None:
            loop.call_soon_threadsafe(responses.put_nowait, outputs)

        def run() -> None:
            try:
                stream(feeds, names, emit)
            finally:
                loop.call_soon_threadsafe(responses.put_nowait, None)

        worker = asyncio.ensure_future(asyncio.to_thread(run))
        try:
            while (outputs := await responses.get()) is not None:
                yield InferResponse(
                    model_name=self.config.name,
                    model_version=str(self.version),
                    request_id=request.request_id,
                    outputs=tuple(self._output_tensor(n, outputs.get(n), batch_size) for n in names),
                    id=request.id,
                )
            await worker  # the model's error, if it raised
        finally:
            if not worker.done():
                await asyncio.wait([worker])
            self.pool.release(instance)
            self._left()

    def _left(self) -> None:
        """A request inside `infer_stream` is done: a drain waiting for the last one may go on."""
        self.in_flight -= 1
        if self._idle is not None and not self.in_flight:
            self._idle.set()

    async def _close(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()
        if self.sequencer is not None:
            await self.sequencer.close()
        self.state = HandleState.CLOSED
        await asyncio.to_thread(self.pool.close)
        # The sessions' memory is free now, but the C heap keeps its pages: an unload or a hot
        # swap would leave the process larger each time.
        await asyncio.to_thread(release_freed_memory)

    async def _infer(self, request: InferRequest) -> InferResponse:
        feeds, batch_size = prepare_inputs(self.config, request)
        names = output_names(self.config, request)
        request.timing.rows = batch_size
        timeout_us, priority = (
            (_int_parameter(request, "timeout"), _int_parameter(request, "priority")) if request.parameters else (0, 0)
        )
        deadline_s = request.deadline_s
        if timeout_us:
            # Triton's `timeout` parameter doubles as a deadline: it can only shorten the client's.
            timeout_deadline_s = time.monotonic() + timeout_us / 1e6
            deadline_s = timeout_deadline_s if deadline_s is None else min(deadline_s, timeout_deadline_s)
        batcher = self.batcher
        if self.sequencer is not None:
            results = await self.sequencer.submit(request, feeds, batch_size, names)
        elif batcher is None:
            if deadline_s is not None:
                self._check_deadline(deadline_s)
            results = await self.pool.execute_request(
                feeds,
                names,
                batch_size,
                request.timing,
                deadline_s,
                batched=self.config.max_batch_size > 0,
                tracer=self.tracer,
            )
        else:
            results = await batcher.submit(
                feeds,
                batch_size,
                names,
                timing=request.timing,
                priority=priority,
                timeout_us=timeout_us,
                deadline_s=deadline_s,
            )
        return InferResponse(
            model_name=self.config.name,
            model_version=str(self.version),
            request_id=request.request_id,
            outputs=tuple(self._output_tensor(name, results.get(name), batch_size) for name in names),
            id=request.id,
        )

    def _check_deadline(self, deadline_s: float) -> None:
        estimate_s = self.pool.estimated_wait_s(0)
        left_s = deadline_s - time.monotonic()
        if estimate_s > left_s:
            raise DeadlineUnreachableError(
                f"model '{self.config.name}' cannot answer within the request's deadline: "
                f"{max(0.0, left_s) * 1000:.1f} ms left, about {estimate_s * 1000:.1f} ms needed",
                retry_after_s=estimate_s,
            )

    def _output_tensor(self, name: str, array: np.ndarray[Any, Any] | None, batch_size: int) -> Tensor:
        spec = self.config.output(name)
        if spec is None or array is None:
            raise ModelOutputError(f"model '{self.config.name}' version {self.version} produced no output '{name}'")
        if spec.reshape is not None:
            # The runtime's shape is `reshape`; clients see `dims` (Triton's reshape semantics).
            target = (batch_size, *spec.dims) if self.config.max_batch_size > 0 else spec.dims
            if -1 not in target:
                array = array.reshape(target)
        expected = spec.datatype.numpy_dtype
        if array.dtype is not expected and array.dtype != expected and spec.datatype is not DataType.BYTES:
            raise ModelOutputError(
                f"model '{self.config.name}' version {self.version} output '{name}' is {array.dtype}, "
                f"but its config says {spec.datatype.value}"
            )
        return Tensor(name=name, datatype=spec.datatype, shape=array.shape, data=array)


def _int_parameter(request: InferRequest, name: str) -> int:
    """Triton's scheduling parameters (`priority`, `timeout` in microseconds): 0 when absent."""
    value = request.parameters.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(f"request parameter '{name}' must be a non-negative integer, got {value!r}")
    return value

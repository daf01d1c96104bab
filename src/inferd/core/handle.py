"""One loaded model version: its completed config and what executes it.

`Handle` is what the registry routes requests to, whatever serves them: a `ModelHandle` runs a
runtime's instances through the one scheduler chosen at load (core.scheduler: direct, dynamic
batcher or sequence batcher), an `EnsembleHandle` (core.ensemble) sends requests on to other
models' handles.

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
from inferd.core.executor import Arrays, InstancePool
from inferd.core.scheduler import Admission, Scheduler, Work
from inferd.core.validation import output_names, prepare_inputs
from inferd.errors import (
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

    async def infer(self, request: InferRequest, admission: Admission = Admission.REAL_TIME) -> InferResponse:
        """`admission`: BACKGROUND work runs only in the room real-time requests leave (core.scheduler).
        Each kind writes it as one coroutine (a frame more would be paid by every request),
        between `_entered()` and `_left()`."""
        raise NotImplementedError

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The request's responses as they come: a decoupled model's, or the one of any other."""
        yield await self.infer(request)

    def _entered(self) -> None:
        """A request comes inside (or the error that the handle was unloaded). Called before the
        first await, in the same loop turn as the lookup that found this handle, so a drain that
        starts later always waits for this request."""
        if self.state is HandleState.CLOSED:
            raise ModelNotReadyError(f"model '{self.config.name}' version {self.version} was unloaded")
        self.in_flight += 1

    def _left(self) -> None:
        """A request inside is done: a drain waiting for the last one may go on."""
        self.in_flight -= 1
        if self._idle is not None and not self.in_flight:
            self._idle.set()

    async def drain(self) -> None:
        """Let the requests inside finish, then close. Call once no new request can find the handle."""
        if self.state is not HandleState.READY:
            return
        self.state = HandleState.DRAINING
        if self.in_flight:
            self._idle = asyncio.Event()
            await self._idle.wait()
        await self._close()

    async def _close(self) -> None:
        self.state = HandleState.CLOSED


@dataclass(slots=True)
class ModelHandle(Handle):
    """A version served by a runtime's instances."""

    pool: InstancePool
    # Chosen once, at load (core.loading): direct, the dynamic batcher or the sequence batcher.
    scheduler: Scheduler

    @property
    def queued(self) -> int:
        return self.scheduler.queued

    @property
    def sheds(self) -> bool:
        # Asked once, when the handle is published: the registry's snapshot lists the handles
        # whose `refusal` is asked before every request's body is decoded.
        return self.scheduler.sheds

    def refusal(self) -> OverloadedError | None:
        return self.scheduler.refusal()

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        if not self.config.decoupled:
            yield await self.infer(request)
            return
        # A decoupled request runs alone (no batching) on one instance, its responses handed over
        # from the worker thread as the model yields them.
        self._entered()
        try:
            feeds, batch_size = prepare_inputs(self.config, request)
            names = output_names(self.config, request)
            request.context.timing.rows = batch_size
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
                yield self._response(request, outputs, names, batch_size)
            await worker  # the model's error, if it raised
        finally:
            if not worker.done():
                await asyncio.wait([worker])
            self.pool.release(instance)
            self._left()

    async def _close(self) -> None:
        await self.scheduler.close()
        self.state = HandleState.CLOSED
        await asyncio.to_thread(self.pool.close)
        # The sessions' memory is free now, but the C heap keeps its pages: an unload or a hot
        # swap would leave the process larger each time.
        await asyncio.to_thread(release_freed_memory)

    async def infer(self, request: InferRequest, admission: Admission = Admission.REAL_TIME) -> InferResponse:
        self._entered()
        try:
            feeds, batch_size = prepare_inputs(self.config, request)
            names = output_names(self.config, request)
            request.context.timing.rows = batch_size
            timeout_us, priority = (
                (_int_parameter(request, "timeout"), _int_parameter(request, "priority"))
                if request.parameters
                else (0, 0)
            )
            deadline_s = request.context.deadline_s
            if timeout_us:
                # Triton's `timeout` parameter doubles as a deadline: it can only shorten the client's.
                timeout_deadline_s = time.monotonic() + timeout_us / 1e6
                deadline_s = timeout_deadline_s if deadline_s is None else min(deadline_s, timeout_deadline_s)
            work = Work(request, feeds, batch_size, names, deadline_s, priority, timeout_us, admission)
            return self._response(request, await self.scheduler.submit(work), names, batch_size)
        finally:
            self._left()

    def _response(self, request: InferRequest, results: Arrays, names: list[str], rows: int) -> InferResponse:
        """The answer to `request`: its outputs `names` of `results`, as the config declares them."""
        return InferResponse(
            model_name=self.config.name,
            model_version=str(self.version),
            request_id=request.context.request_id,
            outputs=tuple(self._output_tensor(name, results.get(name), rows) for name in names),
            id=request.id,
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

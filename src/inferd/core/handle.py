"""One loaded model version: its completed config and what executes it.

`Handle` is what the catalogue finds for a request, whatever serves it: a `ModelHandle` holds a
runtime's instances and the one scheduler chosen at load (core.scheduler: direct, dynamic batcher
or sequence batcher), to which the dispatcher submits requests itself; an `EnsembleHandle`
(core.ensemble) sends one request per step back down to the dispatcher. A decoupled model's
stream runs here (`ModelHandle.stream`): it is scheduled by no scheduler.

Lifecycle: a handle is READY once it was made; the registry then routes requests to it. When it
is replaced (a hot swap) or unloaded, the registry stops routing to it first and then calls
`drain()`: DRAINING lets every request already inside finish, queued ones included, and CLOSED
releases what the handle holds (the batcher, the threads and the sessions).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig
from inferd.core.executor import Arrays, InstancePool
from inferd.core.scheduler import Scheduler
from inferd.core.validation import answer, output_names, prepare_inputs
from inferd.errors import ModelNotReadyError, OverloadedError
from inferd.runtimes.base import release_freed_memory
from inferd.types import InferRequest, InferResponse

_SERIALS = itertools.count()


class HandleState(enum.Enum):
    READY = "READY"
    DRAINING = "DRAINING"
    CLOSED = "CLOSED"


@dataclass(slots=True)
class Handle:
    """The lifecycle every handle shares; subclasses give `_close`."""

    config: ModelConfig
    version: int
    # Requests inside now (between `enter` and `leave`): queued, waiting for an instance or executing.
    in_flight: int = field(default=0, init=False)
    # Requests that ever came inside: the idle unloader (core.idle_unload) tells use from this,
    # so the request path pays one increment and no clock.
    arrivals: int = field(default=0, init=False)
    # Tells this handle from every other one made in the process (an id() may be reused).
    serial: int = field(default_factory=lambda: next(_SERIALS), init=False)
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

    def enter(self) -> None:
        """A request comes inside (or the error that the handle was unloaded). Called before the
        first await, in the same loop turn as the lookup that found this handle, so a drain that
        starts later always waits for this request."""
        if self.state is HandleState.CLOSED:
            raise ModelNotReadyError(f"model '{self.config.name}' version {self.version} was unloaded")
        self.in_flight += 1
        self.arrivals += 1

    def leave(self) -> None:
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
    # When the server has a response cache: its name, version and the fingerprint of what it was
    # loaded from (core.response_cache), which every key of its answers starts with, and of the
    # answers of ensembles it is a step of; else None.
    content_key: bytes | None = None

    @property
    def queued(self) -> int:
        return self.scheduler.queued

    @property
    def sheds(self) -> bool:
        # Asked once, when the handle is published: the registry's snapshot lists the handles
        # whose `refusal` is asked before every request's body is decoded. Not a model that caches:
        # its hits need no queue (a miss is refused by the scheduler, after decoding).
        caches = self.content_key is not None and self.config.response_cache
        return self.scheduler.sheds and not caches

    def refusal(self) -> OverloadedError | None:
        return self.scheduler.refusal()

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """A decoupled model's responses to `request` as it makes them. A decoupled request runs
        alone (no batching) on one instance, its responses handed over from the worker thread as
        the model yields them."""
        self.enter()
        try:
            feeds, batch_size = prepare_inputs(self.config, request)
            names = output_names(self.config, request)
            request.context.timing.rows = batch_size
            instance = await self.pool.acquire()
        except BaseException:
            self.leave()
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
                yield answer(self.config, self.version, request, outputs, names, batch_size)
            await worker  # the model's error, if it raised
        finally:
            if not worker.done():
                await asyncio.wait([worker])
            self.pool.release(instance)
            self.leave()

    async def _close(self) -> None:
        await self.scheduler.close()
        self.state = HandleState.CLOSED
        await asyncio.to_thread(self.pool.close)
        # The sessions' memory is free now, but the C heap keeps its pages: an unload or a hot
        # swap would leave the process larger each time.
        await asyncio.to_thread(release_freed_memory)

"""The load itself: worker processes that send requests and time them, and `LoadGenerator`, which
drives them.

Each worker runs its own event loop (uvloop) and its own `AsyncClient`, so the load is spread over
as many cores as `processes` asks: one Python process drives a few thousand small requests a second
(see the README), and beyond that the client, not the server, would be what is measured. A worker
runs one load at a time, either closed-loop (`concurrency` requests always in flight, each sent as
the one before it returns, as perf_analyzer's --concurrency-range) or open-loop (`rate` requests
a second on a schedule, constant or Poisson, whatever the answers do, as --request-rate-range).
The parent asks each worker for what completed since it last asked: those are the windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

import numpy as np

from inferd.client import NO_RETRIES, AsyncClient, ClientTls
from inferd.client.aio import as_tensors
from inferd.errors import InferdError
from inferd.tools.inputs import Sample
from inferd.types import InferRequest, RequestedOutput

Mode = Literal["concurrency", "rate"]
Distribution = Literal["constant", "poisson"]
# A worker whose request failed for want of a server waits this long before the next, rather
# than spinning on refused connections.
_FAILURE_PAUSE_S = 0.01


@dataclass(frozen=True, slots=True)
class Target:
    """Where the load goes and what it sends; it travels to each worker process."""

    url: str
    model: str
    version: str
    samples: list[Sample]
    binary: bool = True
    outputs: tuple[str, ...] = ()
    timeout_s: float = 30.0
    tls: ClientTls | None = None
    token: str | None = None


@dataclass(slots=True)
class Completed:
    """What completed in a worker since the parent last asked: latencies of the successes, the
    failures by error code, and how many requests were sent."""

    latencies_s: np.ndarray[Any, Any] = field(default_factory=lambda: np.empty(0))
    errors: Counter[str] = field(default_factory=Counter)
    sent: int = 0

    def merged(self, other: Completed) -> Completed:
        return Completed(
            np.concatenate([self.latencies_s, other.latencies_s]), self.errors + other.errors, self.sent + other.sent
        )


class LoadGenerator:
    """`processes` workers sharing one load between them."""

    def __init__(self, target: Target, processes: int = 1) -> None:
        if processes < 1:
            raise ValueError(f"processes {processes} must be at least 1")
        context = multiprocessing.get_context("spawn")  # no fork of a parent with threads and a loop
        self._pipes: list[Connection] = []
        self._workers = []
        for _ in range(processes):
            parent_end, child_end = context.Pipe()
            worker = context.Process(target=_worker_main, args=(child_end, target), daemon=True)
            worker.start()
            child_end.close()
            self._pipes.append(parent_end)
            self._workers.append(worker)
        for pipe in self._pipes:  # each has made its client
            _reply(pipe)

    def start(self, mode: Mode, value: float, distribution: Distribution = "constant") -> None:
        """Start a load (stopping any before it): `value` requests in flight, or a second, in all."""
        shares = _split(value, len(self._pipes), whole=mode == "concurrency")
        for pipe, share in zip(self._pipes, shares, strict=True):
            pipe.send(("start", mode, share, distribution))
        for pipe in self._pipes:
            _reply(pipe)

    def collect(self) -> Completed:
        """What completed since the last collect (or start), in every worker."""
        return self._gather("collect")

    def stop(self) -> Completed:
        """Stop the load and wait for the requests in flight: what completed since the last collect."""
        return self._gather("stop")

    def _gather(self, command: str) -> Completed:
        """Every worker told at once (so their windows end together), then their answers merged."""
        for pipe in self._pipes:
            pipe.send((command,))
        completed = Completed()
        for pipe in self._pipes:
            completed = completed.merged(_reply(pipe))
        return completed

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):  # a worker that died already
                pipe.send(("exit",))
        for worker in self._workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _split(value: float, parts: int, *, whole: bool) -> list[float]:
    if not whole:
        return [value / parts] * parts
    base, extra = divmod(int(value), parts)
    return [float(base + (1 if i < extra else 0)) for i in range(parts)]


def _reply(pipe: Connection) -> Any:
    message = pipe.recv()
    if isinstance(message, BaseException):
        raise message
    return message


# -- the worker process ---------------------------------------------------------------------------


def _worker_main(pipe: Connection, target: Target) -> None:
    import uvloop

    uvloop.run(_Worker(pipe, target).serve())


class _Worker:
    def __init__(self, pipe: Connection, target: Target) -> None:
        self._pipe = pipe
        self._target = target
        self._requests = [
            InferRequest(
                model_name=target.model,
                model_version=target.version,
                inputs=as_tensors(sample),
                outputs=tuple(RequestedOutput(name) for name in target.outputs),
            )
            for sample in target.samples
        ]
        self._completed = Completed()
        self._latencies: list[float] = []
        self._stopping = asyncio.Event()
        self._load: asyncio.Task[None] | None = None
        self._client: AsyncClient | None = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        target = self._target
        self._client = AsyncClient(
            target.url, binary=target.binary, retry=NO_RETRIES, max_in_flight=4096, tls=target.tls, token=target.token
        )
        self._pipe.send("ready")
        while True:
            command = await loop.run_in_executor(None, self._pipe.recv)
            try:
                if command[0] == "start":
                    await self._stop()
                    self._load = asyncio.create_task(self._run(command[1], command[2], command[3]))
                    self._pipe.send("started")
                elif command[0] == "collect":
                    self._pipe.send(self._take())
                elif command[0] == "stop":
                    await self._stop()
                    self._pipe.send(self._take())
                else:
                    await self._stop()
                    await self._client.close()
                    return
            except Exception as exc:  # told to the parent, which raises it
                self._pipe.send(exc)

    def _take(self) -> Completed:
        completed, self._completed = self._completed, Completed()
        completed.latencies_s = np.array(self._latencies)
        self._latencies = []
        return completed

    async def _stop(self) -> None:
        if self._load is not None:
            self._stopping.set()
            await self._load
            self._load = None
        self._stopping = asyncio.Event()

    async def _run(self, mode: Mode, value: float, distribution: Distribution) -> None:
        if mode == "concurrency":
            await asyncio.gather(*(self._closed_loop(offset) for offset in range(int(value))))
        elif value > 0:
            await self._open_loop(value, distribution)

    async def _closed_loop(self, offset: int) -> None:
        requests = itertools.islice(itertools.cycle(self._requests), offset % len(self._requests), None)
        while not self._stopping.is_set():
            await self._send(next(requests))

    async def _open_loop(self, rate: float, distribution: Distribution) -> None:
        requests = itertools.cycle(self._requests)
        in_flight: set[asyncio.Task[None]] = set()
        due = time.perf_counter()
        while not self._stopping.is_set():
            wait_s = due - time.perf_counter()
            if wait_s > 0:
                try:  # wakes early when told to stop
                    await asyncio.wait_for(self._stopping.wait(), wait_s)
                    break
                except TimeoutError:
                    pass
            task = asyncio.create_task(self._send(next(requests)))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            due += random.expovariate(rate) if distribution == "poisson" else 1.0 / rate
        await asyncio.gather(*in_flight)

    async def _send(self, request: InferRequest) -> None:
        assert self._client is not None
        self._completed.sent += 1
        started = time.perf_counter()
        try:
            await self._client.infer_request(request, timeout_s=self._target.timeout_s)
        except InferdError as exc:
            self._completed.errors[exc.code.value] += 1
            if exc.request_id is None:  # not the server's answer: it could not be reached
                await asyncio.sleep(_FAILURE_PAUSE_S)
            return
        self._latencies.append(time.perf_counter() - started)

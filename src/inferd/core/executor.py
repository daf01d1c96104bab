"""Runs batches on a model version's instances: one runtime session per instance_group slot, each
used by one worker thread at a time, so the event loop keeps decoding requests meanwhile
(ONNX Runtime releases the GIL while it computes)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from inferd.runtimes import Runtime

Arrays = dict[str, np.ndarray[Any, Any]]


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
        self._on_execute = on_execute
        self._threads = ThreadPoolExecutor(max_workers=len(instances), thread_name_prefix=f"inferd-{name}")
        # NOTE: created lazily on the serving loop; the pool may be built on a loader thread.
        self._free: asyncio.Queue[Runtime] | None = None

    @property
    def size(self) -> int:
        return len(self._instances)

    @property
    def idle(self) -> int:
        """Instances not executing now (all of them before serving starts)."""
        return self._free_instances().qsize()

    async def acquire(self) -> Runtime:
        """An idle instance, waiting for one to be released when all are busy."""
        return await self._free_instances().get()

    def release(self, instance: Runtime) -> None:
        self._free_instances().put_nowait(instance)

    async def execute(
        self, instance: Runtime, inputs: Mapping[str, np.ndarray[Any, Any]], names: Sequence[str], rows: int
    ) -> Arrays:
        """Run one batch of `rows` rows on an acquired instance, on its worker thread."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            return await loop.run_in_executor(self._threads, instance.execute, inputs, names)
        finally:
            if self._on_execute is not None:
                self._on_execute(rows, time.perf_counter() - started)

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

    def _free_instances(self) -> asyncio.Queue[Runtime]:
        if self._free is None:
            self._free = asyncio.Queue()
            for instance in self._instances:
                self._free.put_nowait(instance)
        return self._free

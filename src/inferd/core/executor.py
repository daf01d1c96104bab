"""Runs batches on a model version's instances: one runtime session per instance_group slot, each
used by one worker thread at a time, so the event loop keeps decoding requests meanwhile
(ONNX Runtime releases the GIL while it computes)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from inferd.runtimes import Runtime


def cores_available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def intra_op_threads_per_instance(total_instances: int) -> int:
    """Split the cores between instances so that instances x threads fit the machine."""
    return max(1, cores_available() // max(1, total_instances))


class InstancePool:
    """The loaded instances of one model version and the threads that run them."""

    def __init__(self, instances: Sequence[Runtime], *, name: str) -> None:
        if not instances:
            raise ValueError("an instance pool needs at least one instance")
        self._instances = list(instances)
        self._threads = ThreadPoolExecutor(max_workers=len(instances), thread_name_prefix=f"inferd-{name}")
        # NOTE: created lazily on the serving loop; the pool may be built on a loader thread.
        self._free: asyncio.Queue[Runtime] | None = None

    @property
    def size(self) -> int:
        return len(self._instances)

    async def run(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        free = self._free_instances()
        instance = await free.get()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._threads, instance.execute, inputs, output_names)
        finally:
            free.put_nowait(instance)

    def run_blocking(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        """For use before serving starts (warm-up), from the loading thread."""
        return self._instances[0].execute(inputs, output_names)

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

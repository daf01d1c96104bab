"""Where a batch job's requests run: an `Engine`.

`LocalEngine` (--engine local, the default) serves the model in this process through core's one
entry point (`core.in_process`), so each mini-batch goes down the dispatcher a server's request
takes (validated, batched by the model's config, answered as declared) with no HTTP hop.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from inferd.core.in_process import InProcessModels
from inferd.types import BATCH_TRANSFORM, ModelMetadata, RequestContext, RequestedOutput, Tensor


class Engine(Protocol):
    """A model that answers mini-batches: its signature, whether it batches, and the call."""

    @property
    def signature(self) -> ModelMetadata: ...

    @property
    def max_batch_size(self) -> int: ...

    async def infer(self, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float) -> tuple[Tensor, ...]:
        """The model's outputs (those named, or all when none is) for `inputs`; an InferdError
        the model or the engine raised, or TimeoutError past `timeout_s`."""
        ...

    async def close(self) -> None: ...


class LocalEngine:
    def __init__(self, models: InProcessModels, model: str, version: str, signature: ModelMetadata, batch: int) -> None:
        self._models = models
        self._model = model
        self._version = version
        self._signature = signature
        self._max_batch_size = batch
        self._cache: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    async def open(
        cls, repositories: Sequence[str], model: str, version: str = "", *, execution_threads: int = 0
    ) -> LocalEngine:
        """`model` of the repositories (folders or fsspec URLs) loaded in this process."""
        cache = tempfile.TemporaryDirectory(prefix="inferd-batch-")
        try:
            models = await InProcessModels.open(
                repositories, [model], Path(cache.name), execution_threads=execution_threads
            )
        except BaseException:
            cache.cleanup()
            raise
        config = await models.config(model, version)
        engine = cls(models, model, version, models.metadata(model, version), config.max_batch_size)
        engine._cache = cache
        return engine

    @property
    def signature(self) -> ModelMetadata:
        return self._signature

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    async def infer(self, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float) -> tuple[Tensor, ...]:
        context = RequestContext(deadline_s=time.monotonic() + timeout_s, door=BATCH_TRANSFORM)
        asked = [RequestedOutput(name) for name in outputs]
        response = await self._models.infer(context.request(self._model, self._version, inputs, asked))
        return response.outputs

    async def close(self) -> None:
        await self._models.close()
        if self._cache is not None:
            self._cache.cleanup()

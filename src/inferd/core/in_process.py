"""`InProcessModels`: a repository's models served in this process, with no server and no door.

What `inferd batch` runs a dataset through (its local engine, and each actor of its Ray engine):
the models load as a server loads them (config completed, warm-up, instance groups, dynamic
batching, ensembles with their step models) and every request goes down the one call every door
makes below the wire, the `Dispatcher`'s `infer`, counted under the `batch` protocol. It is the
tools' one entry into core (an import contract says so): a batch job is served exactly as the
server would serve its requests, without an HTTP hop and without a copy of the serving path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from inferd.config.model import ModelConfig
from inferd.core.registry import ModelRegistry
from inferd.core.repository import open_repositories
from inferd.core.scheduler import Admission
from inferd.core.service import InferenceService
from inferd.errors import ModelNotReadyError
from inferd.types import InferRequest, InferResponse, ModelMetadata

__all__ = ["Admission", "InProcessModels"]


class InProcessModels:
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry
        self._service = InferenceService(registry)
        self._dispatcher = registry.dispatcher

    @classmethod
    async def open(
        cls, locations: Sequence[str], names: Sequence[str], cache_dir: Path, *, execution_threads: int = 0
    ) -> InProcessModels:
        """The models `names` of the repositories at `locations` (folders or fsspec URLs, as
        `inferd serve --model-repository` takes them), loaded; `cache_dir`: where a remote
        repository's files are fetched to. Raises ModelNotReadyError (with the load's reason) when
        one of them does not load."""
        repository = open_repositories(locations, cache_dir)
        await asyncio.to_thread(repository.check)
        registry = ModelRegistry(repository, execution_threads=execution_threads)
        models = cls(registry)
        try:
            await registry.load_all(names)
            for name in names:
                record = registry.record(name)
                if not record.ready_versions():
                    raise ModelNotReadyError(f"model '{name}' did not load: {record.reason or 'no version is ready'}")
        except BaseException:
            await models.close()
            raise
        return models

    def metadata(self, name: str, version: str = "") -> ModelMetadata:
        """The model's signature, as a server's metadata route answers it."""
        return self._service.model_metadata(name, version)

    async def config(self, name: str, version: str = "") -> ModelConfig:
        """The config of the version a request to (name, version) reaches (its batching among it)."""
        return await self._service.serving_config(name, version)

    async def infer(self, request: InferRequest, admission: Admission = Admission.REAL_TIME) -> InferResponse:
        """One answer to `request`, served as a server serves a door's request (validated, batched
        with the model's other requests, answered as its config declares), without the server's
        per-request limits: the caller sized the request."""
        return await self._dispatcher.infer(request, None, admission)

    async def close(self) -> None:
        """Drain and close every loaded model."""
        await self._registry.close()

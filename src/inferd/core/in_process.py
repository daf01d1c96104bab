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
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from inferd.config.model import ModelConfig
from inferd.core.endpoints import EndpointSpec, rendezvous, spec_from_document
from inferd.core.registry import ModelRegistry
from inferd.core.repository import open_repositories
from inferd.core.scheduler import Admission
from inferd.core.service import InferenceService
from inferd.errors import ModelNotReadyError
from inferd.types import InferRequest, InferResponse, ModelMetadata

__all__ = ["Admission", "InProcessModels"]


class InProcessModels:
    def __init__(self, registry: ModelRegistry) -> None:
        self._endpoints: dict[str, EndpointSpec] = {}
        self._registry = registry
        self._service = InferenceService(registry)
        self._dispatcher = registry.dispatcher

    @classmethod
    async def open(
        cls,
        locations: Sequence[str],
        names: Sequence[str],
        cache_dir: Path,
        *,
        execution_threads: int = 0,
        endpoints: Mapping[str, Any] | None = None,
    ) -> InProcessModels:
        """The models `names` of the repositories at `locations` (folders or fsspec URLs, as
        `inferd serve --model-repository` takes them), loaded; `cache_dir`: where a remote
        repository's files are fetched to. `endpoints`: endpoints as `inferd serve --endpoints`
        declares them (name -> `endpoints.spec_document`, as the server's reader of that file
        made it); a name of `names` that is one of them loads its
        variants' models and is set as the server sets it (each variant serving, one signature;
        shadows are left out: nobody waits for the answers they would be compared with). Raises
        ModelNotReadyError (with the load's reason) when one of them does not load."""
        specs = {name: spec_from_document(body) for name, body in (endpoints or {}).items() if name in names}
        models_needed = [
            model for name in names for model in ([v.model for v in specs[name].variants] if name in specs else [name])
        ]
        repository = open_repositories(locations, cache_dir)
        await asyncio.to_thread(repository.check)
        registry = ModelRegistry(repository, execution_threads=execution_threads)
        models = cls(registry)
        try:
            await registry.load_all(dict.fromkeys(models_needed))
            for name in dict.fromkeys(models_needed):
                record = registry.record(name)
                if not record.ready_versions():
                    raise ModelNotReadyError(f"model '{name}' did not load: {record.reason or 'no version is ready'}")
            for spec in specs.values():
                await models._service.endpoints.set(replace(spec, shadows=()))
                models._endpoints[spec.name] = spec
        except BaseException:
            await models.close()
            raise
        return models

    def is_endpoint(self, name: str) -> bool:
        return name in self._endpoints

    def variant_for(self, endpoint: str, key: str) -> tuple[str, str, str]:
        """The variant of `endpoint` the record of `key` goes to (its name, model and version):
        weighted rendezvous hashing of the key, the endpoints' sticky routing, so a record keeps
        its variant in every run and on every engine, and each variant gets its weight's share."""
        variants = self._endpoints[endpoint].variants
        chosen = variants[rendezvous(key, variants)]
        return chosen.name, chosen.model, chosen.version

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

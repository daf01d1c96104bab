"""`InferenceService`: the one facade every transport calls. Transports decode, call, encode."""

from __future__ import annotations

import time

from inferd import __version__
from inferd.config.model import ModelConfig, TensorConfig
from inferd.core.registry import ModelRegistry, ModelState
from inferd.core.statistics import ServingStatistics
from inferd.errors import InferdError, ModelNotReadyError
from inferd.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStatistics,
    ServerMetadata,
    TensorMetadata,
)

SERVER_NAME = "inferd"
# Triton's extension names, so clients that probe for them find what inferd implements.
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")


class InferenceService:
    def __init__(
        self,
        registry: ModelRegistry,
        *,
        strict_readiness: bool = False,
        statistics: ServingStatistics | None = None,
    ) -> None:
        """`statistics` should be the sink the registry reports executions to, as well."""
        self._registry = registry
        self._statistics = statistics or ServingStatistics()
        self._strict_readiness = strict_readiness
        self.shutting_down = False
        # Requests inside `infer` now, from every transport.
        self._inferring = 0

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        if self.shutting_down or not self._registry.startup_complete:
            return False
        return self._registry.all_ready() if self._strict_readiness else True

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    def model_ready(self, name: str, version: str = "") -> bool:
        """Raises NotFoundError for unknown models/versions; False when known but not ready."""
        try:
            self._registry.handle(name, version)
        except ModelNotReadyError:
            return False
        return True

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._registry.handle(name, version).config

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        handle = self._registry.handle(name, version)
        record = self._registry.record(name)
        config = handle.config
        versions = (str(handle.version),) if version else tuple(str(v) for v in record.ready_versions())
        return ModelMetadata(
            name=name,
            versions=versions,
            platform=config.platform,
            inputs=tuple(_tensor_metadata(config, t) for t in config.inputs),
            outputs=tuple(_tensor_metadata(config, t) for t in config.outputs),
        )

    async def infer(self, request: InferRequest, *, alone: bool = False) -> InferResponse:
        """`alone`: the transport holds no other request, so a batcher need not wait a moment for
        company (it still does when another transport's request is in the core)."""
        started = time.perf_counter()
        alone = alone and self._inferring == 0
        self._inferring += 1
        handle = None
        try:
            handle = self._registry.handle(request.model_name, request.model_version)
            response = await handle.infer(request, alone=alone)
        except InferdError as exc:
            exc.request_id = exc.request_id or request.request_id
            if handle is None:
                # Any client can name models that do not exist: such requests share one bounded
                # series, so they cannot grow the statistics (or /metrics) without limit.
                self._statistics.request_unresolved(exc.code.value)
            else:
                elapsed_s = time.perf_counter() - started + request.timing.decode_s
                self._statistics.request_finished(
                    request.model_name,
                    str(handle.version),
                    exc.code.value,
                    elapsed_s,
                    request.timing.rows,
                    request.timing,
                )
            raise
        finally:
            self._inferring -= 1
        # Counted from the start of decoding, as Triton counts from the request's arrival.
        elapsed_s = time.perf_counter() - started + request.timing.decode_s
        self._statistics.request_finished(
            request.model_name, str(handle.version), "success", elapsed_s, request.timing.rows, request.timing
        )
        return response

    def response_encoded(self, response: InferResponse, encode_s: float) -> None:
        self._statistics.response_encoded(response.model_name, response.model_version, encode_s)

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Cumulative statistics of every ready version of `name` (of every model when "")."""
        if not name:
            records = list(self._registry.records())
        else:
            records = [self._registry.record(name)]
            if version:
                found = self._registry.version_record(name, version)
                return [self._statistics.model_statistics(name, str(found.version))]
        return [
            self._statistics.model_statistics(record.name, str(v))
            for record in records
            for v in record.ready_versions()
        ]

    def load(self) -> list[tuple[str, str, int, int]]:
        """(model, version, requests in flight, requests queued) for every ready version."""
        gauges = []
        for record in self._registry.records():
            for version, version_record in sorted(record.versions.items()):
                handle = version_record.handle
                if handle is not None:
                    queued = handle.batcher.queued if handle.batcher is not None else 0
                    gauges.append((record.name, str(version), handle.in_flight, queued))
        return gauges

    def model_states(self) -> list[tuple[str, str, ModelState]]:
        """(model, version, state) for every known version; a model with none reports version ""."""
        states = []
        for record in self._registry.records():
            if not record.versions:
                states.append((record.name, "", record.state))
            for version, version_record in sorted(record.versions.items()):
                states.append((record.name, str(version), version_record.state))
        return states


def _tensor_metadata(config: ModelConfig, tensor: TensorConfig) -> TensorMetadata:
    return TensorMetadata(name=tensor.name, datatype=tensor.datatype.value, shape=config.full_shape(tensor))

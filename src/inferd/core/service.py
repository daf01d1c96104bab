"""`InferenceService`: the one facade every transport calls. Transports decode, call, encode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path

from inferd import __version__
from inferd.config.loader import parse_model_config_json
from inferd.config.model import ModelConfig, TensorConfig
from inferd.config.server import ModelControlMode
from inferd.core.catalogue import ModelState
from inferd.core.dispatcher import Dispatcher
from inferd.core.endpoint_control import EndpointControl
from inferd.core.endpoints import Variant
from inferd.core.metrics import Metrics
from inferd.core.model_files import UPLOAD_FLAG
from inferd.core.registry import ModelRegistry
from inferd.core.repository import LinkedModels
from inferd.core.scheduler import Admission
from inferd.core.state_dir import StateDir
from inferd.core.statistics import ServingStatistics, combined_statistics
from inferd.core.tracing import RequestTracer
from inferd.errors import (
    InferdError,
    InvalidRequestError,
    LoadRequestError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    PermissionDeniedError,
    UnsupportedError,
)
from inferd.limits import RequestLimits
from inferd.types import (
    InferRequest,
    InferResponse,
    ModelIndexEntry,
    ModelMetadata,
    ModelStatistics,
    ServerMetadata,
    TensorMetadata,
)

SERVER_NAME = "inferd"
# Triton's extension names, so clients that probe for them find what inferd implements.
EXTENSIONS = (
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "model_repository",
    "model_repository(unload_dependents)",
    "system_shared_memory",
    "classification",
)


class InferenceService:
    def __init__(
        self,
        registry: ModelRegistry,
        *,
        strict_readiness: bool = False,
        statistics: ServingStatistics | None = None,
        model_control_mode: ModelControlMode = ModelControlMode.NONE,
        linked: LinkedModels | None = None,
        tracer: RequestTracer | None = None,
        allow_model_upload: bool = False,
        limits: RequestLimits | None = None,
        state: StateDir | None = None,
    ) -> None:
        """`statistics` and `tracer` must be the registry's (its dispatcher counts and traces every
        request; `statistics` defaults to the registry's); `linked`, part of the registry's
        repository, takes the folders `load_model_folder` loads; `allow_model_upload`:
        loads may bring files, and config overrides that change what code runs (see
        `core.model_files`); `limits`: what one request may hold and one answer carry, whichever
        door it came by; `state`: where what users set through the API is kept (--state-dir)."""
        dispatcher = registry.dispatcher
        sink = registry.metrics
        if statistics is None:
            statistics = sink if isinstance(sink, ServingStatistics) else ServingStatistics()
        if statistics is not sink or tracer is not dispatcher.tracer:
            # Requests are counted and traced below the service (ensembles' steps too): what the
            # service reads must be what the dispatcher writes.
            raise ValueError("the service's statistics and tracer must be the registry's")
        self._registry = registry
        self._dispatcher = dispatcher
        self._allow_model_upload = allow_model_upload
        self._limits = limits or RequestLimits()
        self._linked = linked
        self._model_control_mode = model_control_mode
        self._statistics = statistics
        self._strict_readiness = strict_readiness
        self.shutting_down = False
        # Set by a server while it does what must precede readiness beyond loading the models
        # (declaring the endpoints a file names, resuming rollouts).
        self.starting = False
        # Endpoints are resolved where a request's model is, in the inference call; their names
        # answer the metadata, config and readiness routes as a model's do.
        self.endpoints = EndpointControl(registry, dispatcher, self._shadow_copy, state)

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        if self.shutting_down or self.starting or not self._registry.startup_complete:
            return False
        return self._registry.all_ready() if self._strict_readiness else True

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)

    def model_ready(self, name: str, version: str = "") -> bool:
        """Raises NotFoundError for unknown models/versions; False when known but not ready."""
        try:
            self.check_model_ready(name, version)
        except ModelNotReadyError:
            return False
        return True

    def check_model_ready(self, name: str, version: str = "") -> None:
        """Raises NotFoundError for unknown models/versions, ModelNotReadyError (with the reason:
        loading, unloaded, or why its load failed) when known but not ready. An endpoint is ready
        when every variant that takes traffic by weight is."""
        endpoint = self.endpoints.endpoints.get(name)
        if endpoint is None:
            self._dispatcher.ready_handle(name, version)
            return
        _no_version(name, version)
        for variant in endpoint.spec.variants:
            if variant.weight > 0:
                try:
                    self._dispatcher.ready_handle(variant.model, variant.version)
                except InferdError as exc:
                    raise ModelNotReadyError(
                        f"endpoint '{name}': variant '{variant.name}' is not ready: {exc.message}"
                    ) from None

    def model_versions(self, name: str, version: str = "") -> list[tuple[str, ModelState, str]]:
        """(version, state, reason) of each version of `name` inferd knows (only `version`'s when
        given); raises NotFoundError for an unknown model or version."""
        if version:
            found = self._registry.version_record(name, version)
            return [(str(found.version), found.state, found.reason)]
        record = self._registry.record(name)
        if not record.versions:  # failed before any version was known (its config, say)
            return [("", record.state, record.reason)]
        return [(str(v), r.state, r.reason or record.reason) for v, r in sorted(record.versions.items())]

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        """The config of (name, version); an endpoint's is its heaviest variant's, under its name
        (every variant has its signature)."""
        if (variant := self._primary(name, version)) is not None:
            return replace(self._dispatcher.ready_handle(variant.model, variant.version).config, name=name)
        return self._dispatcher.ready_handle(name, version).config

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """The metadata of (name, version); an endpoint's names no versions (it has variants)."""
        if (variant := self._primary(name, version)) is not None:
            config = self._dispatcher.ready_handle(variant.model, variant.version).config
            versions: tuple[str, ...] = ()
        else:
            handle = self._dispatcher.ready_handle(name, version)
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

    async def serving_config(self, name: str, version: str = "") -> ModelConfig:
        """The config of the version a request to (name, version) would reach, loading the model
        first where on-demand loading does: what doors that read bodies by the model's signature
        (TF Serving, SageMaker's arrays, TorchServe) need before they can decode. An endpoint's:
        its heaviest variant's (the call has resolved a request's variant before it asks)."""
        if (variant := self._primary(name, version)) is not None:
            name, version = variant.model, variant.version
        handle = self._dispatcher.lookup(name, version)
        if handle is None:
            handle = await self._dispatcher.lease(name, version)
        return handle.config

    async def serving_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """`model_metadata` of the version a request would reach (loaded on demand, as `serving_config`)."""
        await self.serving_config(name, version)
        return self.model_metadata(name, version)

    def _primary(self, name: str, version: str) -> Variant | None:
        """When `name` is an endpoint, the variant that speaks for its metadata and config (every
        variant has its signature); None for a model's name. An endpoint has no versions."""
        if not self.endpoints.is_endpoint(name):
            return None
        _no_version(name, version)
        return self.endpoints.primary(name)

    async def _shadow_copy(self, request: InferRequest) -> InferResponse:
        """A shadow's copy of a client's request: held to the same limits and classification, run
        only in the room clients' requests leave."""
        return await self._dispatcher.infer(request, self._limits, Admission.BACKGROUND)

    @property
    def dispatcher(self) -> Dispatcher:
        """What every inference goes through (core.dispatcher): the one inference call's way down."""
        return self._dispatcher

    @property
    def limits(self) -> RequestLimits:
        """What one client's request may hold and one answer carry, whichever door it came by."""
        return self._limits

    def shed(self, name: str, version: str, protocol: str) -> None:
        """See `Dispatcher.shed`."""
        self._dispatcher.shed(name, version, protocol)

    async def infer(self, request: InferRequest) -> InferResponse:
        """A client's request (held to the server's limits) through the dispatcher."""
        return await self._dispatcher.infer(request, self._limits)

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """A client's request's responses as the model makes them, through the dispatcher."""
        return self._dispatcher.infer_stream(request, self._limits)

    # -- the repository extension ------------------------------------------------------------------

    async def repository_index(self, *, ready_only: bool = False) -> list[ModelIndexEntry]:
        """Every model of the repository, and each of its versions inferd knows, with state and reason."""
        names = await asyncio.to_thread(self._registry.repository.model_names)
        records = {record.name: record for record in self._registry.records()}
        entries = []
        for name in sorted(set(names) | set(records)):
            record = records.get(name)
            if record is None:
                entries.append(ModelIndexEntry(name=name))
            elif not record.versions:
                entries.append(ModelIndexEntry(name=name, state=record.state.value, reason=record.reason))
            else:
                entries.extend(
                    ModelIndexEntry(name, str(version), v.state.value, v.reason or record.reason, v.timings)
                    for version, v in sorted(record.versions.items())
                )
        if ready_only:
            entries = [e for e in entries if e.state == ModelState.READY.value]
        return entries

    async def load_model(self, name: str, *, config_json: str = "", files: Mapping[str, bytes] = {}) -> None:
        """Load or reload `name` (Triton's load_model): with `config_json` replacing its config and
        `files` (relative path -> bytes) its folder. Returns once it serves."""
        self._check_model_control("load")
        self.endpoints.check_model_name(name)
        if files and not self._allow_model_upload:
            raise PermissionDeniedError(
                f"model '{name}': this server does not take model files with a load (the server would run them as "
                f"code); start it with {UPLOAD_FLAG} and management tokens to allow it"
            )
        if files and not config_json:
            raise LoadRequestError(f"model '{name}': files sent with a load need a config beside them")
        try:
            # Inside the try: an override that is not a config is the client's mistake (400), not
            # a model that failed (503).
            config = parse_model_config_json(config_json, model_name=name) if config_json else None
            await self._registry.load(name, config=config, files=files, code_may_change=self._allow_model_upload)
        except ModelLoadError as exc:
            # The client's request could not be done; the model's earlier versions still serve.
            raise LoadRequestError(exc.message) from exc

    async def unload_model(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload `name` (Triton's unload_model). Requests already accepted are answered first.
        `unload_dependents`: an ensemble's step models go too, unless another ensemble uses them."""
        self._check_model_control("unload")
        await self._registry.unload(name, dependents=unload_dependents)

    async def load_model_folder(self, name: str, folder: Path) -> None:
        """Load the model in `folder` under `name` (SageMaker's multi-model endpoints: the platform
        names both). Whatever the model control mode: it is how that platform manages models."""
        if self._linked is None:
            raise UnsupportedError("loading a model from a folder is not enabled on this server")
        self.endpoints.check_model_name(name)
        if self._registry.repository.has_model(name) and self._linked.folder(name) is None:
            raise LoadRequestError(f"model '{name}' is a model of the repository; choose another name")
        self._linked.link(name, folder)
        try:
            await self._registry.load(name)
        except BaseException as exc:
            await self._registry.forget(name)
            self._linked.unlink(name)
            if isinstance(exc, ModelLoadError):
                raise LoadRequestError(exc.message) from exc
            raise

    async def unload_model_folder(self, name: str) -> None:
        """Unload a model loaded by `load_model_folder` and forget its folder."""
        if self._linked is None or self._linked.folder(name) is None:
            raise ModelNotFoundError(f"model '{name}' was not loaded from a folder")
        await self._registry.forget(name)
        self._linked.unlink(name)

    def model_folders(self) -> list[tuple[str, Path]]:
        """(name, folder) of each model loaded by `load_model_folder`."""
        if self._linked is None:
            return []
        return [(name, folder) for name in self._linked.model_names() if (folder := self._linked.folder(name))]

    def _check_model_control(self, action: str) -> None:
        if self._model_control_mode is not ModelControlMode.EXPLICIT:
            raise UnsupportedError(
                f"explicit model load / unload is not allowed in model control mode "
                f"'{self._model_control_mode.value}': cannot {action}; start the server with "
                "--model-control-mode explicit"
            )

    @property
    def metrics(self) -> Metrics:
        """Where requests are counted and timed: the call that encodes a response reports its encode
        time here, directly (every request pays for a hop through the service)."""
        return self._statistics

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Cumulative statistics of every ready version of `name` (of every model when ""); an
        endpoint's are its variants', summed under its name."""
        endpoint = self.endpoints.endpoints.get(name) if name else None
        if endpoint is not None:
            _no_version(name, version)
            parts = []
            for variant in endpoint.spec.variants:
                handle = self._dispatcher.ready_handle(variant.model, variant.version)
                parts.append(self._statistics.model_statistics(variant.model, str(handle.version)))
            # Triton's clients read a version number from statistics: the heaviest variant's.
            primary = self.endpoints.primary(name)
            number = str(self._dispatcher.ready_handle(primary.model, primary.version).version)
            return [combined_statistics(name, number, parts)]
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
                    gauges.append((record.name, str(version), handle.in_flight, handle.queued))
        return gauges

    def model_memory(self) -> list[tuple[str, int]]:
        """(model, estimated resident bytes) for every loaded model."""
        return [(r.name, r.memory_bytes) for r in self._registry.records() if r.memory_bytes]

    def models_at_zero(self) -> list[str]:
        """The models scaled to zero now (their next request loads them)."""
        return self._registry.at_zero()

    def model_states(self) -> list[tuple[str, str, ModelState]]:
        """(model, version, state) for every known version; a model with none reports version ""."""
        states = []
        for record in self._registry.records():
            if not record.versions:
                states.append((record.name, "", record.state))
            for version, version_record in sorted(record.versions.items()):
                states.append((record.name, str(version), version_record.state))
        return states


def _no_version(endpoint: str, version: str) -> None:
    if version:
        raise InvalidRequestError(f"'{endpoint}' is an endpoint: it has variants, not versions")


def _tensor_metadata(config: ModelConfig, tensor: TensorConfig) -> TensorMetadata:
    return TensorMetadata(name=tensor.name, datatype=tensor.datatype.value, shape=config.full_shape(tensor))

"""Which models and versions exist, in what state, and the handles that serve them.

Ownership. Everything here changes on the event loop's thread and nowhere else; the slow parts of
a load (reading files, creating sessions, warm-up) run on worker threads and hand their result
back to the loop. What readers see is a `Snapshot`: immutable records and the request lookup
table, replaced whole on every change. A request's lookup is one dict read of the current
snapshot, never racing a loader; a metrics scrape on another thread reads a consistent one.

Changes. `load(name)` reads the model's config and versions, keeps every version already serving
the same files under the same config, loads the others beside the ones serving (the old ones
keep answering meanwhile), then switches the lookup table in one step and drains what was
replaced: requests already inside an old handle finish there (`Handle.drain`). A version
that fails to load leaves the one serving in place and says why in its record and the log.
`unload(name)` stops routing first, then drains. Loads and unloads of one model are serialized
by its lock; different models load concurrently, `LOAD_WORKERS` at a time.

On-demand loading (a `LoadBudget`, the multi-model pattern). A request for a model of the
repository that is not loaded loads it (`lease`); concurrent first requests wait for the one load
(the model's lock). Before a load, room is made: while the loaded models' estimated memory plus
the new one's would pass the budget (or their count the maximum), the least recently used model
that is idle (nothing in flight or queued), not pinned and not changing is evicted. A model that
cannot fit even then is refused at once (ModelTooLargeError, 507) rather than pushing the process
out of memory. Estimates come from each runtime's rule (`runtimes.estimate_memory_bytes`): RSS
deltas cannot be read while loads run concurrently.

A model that fails to load fails alone: its record keeps the state UNAVAILABLE and the reason,
which every request for it receives, while the other models serve.

Ensembles (core.ensemble) depend on their step models: loading an ensemble first loads the
models its steps name that are not serving (outside the ensemble's lock, so two loads never wait
for each other), and a chain of loads that comes back to a model it is loading is a cycle, a
load error. Steps are looked up per request, so a step model's hot swap reaches the ensemble at
once; an ensemble whose step model does not serve is not ready, and says which. Unloading an
ensemble with `dependents` also unloads the models it used that no other loaded ensemble uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from inferd.config.batching import BatchingDefaults
from inferd.config.model import ModelConfig
from inferd.core.classification import with_labels
from inferd.core.ensemble import EnsembleHandle, StepInference, plan_ensemble, with_step_labels
from inferd.core.executor import execution_threads as make_execution_threads
from inferd.core.handle import Handle
from inferd.core.loading import load_version
from inferd.core.local_model import LocalModel, read_local_model
from inferd.core.metrics import Metrics, NoMetrics
from inferd.core.repository import FileEntry, ModelFingerprint, ModelRepository
from inferd.core.tracing import RequestTracer
from inferd.errors import (
    InferdError,
    ModelConfigError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelTooLargeError,
    PermissionDeniedError,
    VersionNotFoundError,
    relative_to_model_folder,
    with_triton_phrase,
)
from inferd.types import InferRequest, InferResponse, LoadTimings

logger = logging.getLogger("inferd.registry")

# How many versions load at once; loading is mostly file reading and graph optimization.
LOAD_WORKERS = 2
UNLOADED = "unloaded"
EVICTED = "evicted to make room"
# How long a listing of the repository's model names answers on-demand lookups: a client sending
# made-up names costs at most one listing per interval, not one per request.
NAMES_TTL_S = 1.0
# The models whose loads led to this one (an ensemble loading its steps): a name seen twice is a cycle.
_LOAD_CHAIN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("load_chain", default=())


@dataclass(frozen=True, slots=True)
class LoadBudget:
    """Turns on on-demand loading with eviction."""

    memory_bytes: int | None = None
    """Estimated memory of the loaded models at most."""
    max_models: int | None = None
    """Loaded models at most."""
    pinned: frozenset[str] = frozenset()
    """Models never evicted (the ones loaded at startup with --load-model)."""


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass(frozen=True, slots=True)
class VersionRecord:
    version: int
    state: ModelState
    reason: str = ""
    handle: Handle | None = None
    timings: LoadTimings | None = None
    # The version's files and the model's config as loaded, to tell a changed model from the same one.
    files: tuple[FileEntry, ...] | None = None
    config: ModelConfig | None = None
    # The runtime's estimate of what the loaded version keeps resident.
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ModelRecord:
    name: str
    state: ModelState
    reason: str = ""
    versions: Mapping[int, VersionRecord] = field(default_factory=lambda: MappingProxyType({}))
    # What the repository held when this record was made (None for files sent with a load request).
    fingerprint: ModelFingerprint | None = None
    # A folder inferd made for the model's files (sent with a load request): removed on unload.
    owned_dir: Path | None = None

    def ready_versions(self) -> list[int]:
        return sorted(v for v, r in self.versions.items() if r.state is ModelState.READY)

    @property
    def memory_bytes(self) -> int:
        return sum(v.memory_bytes for v in self.versions.values() if v.handle is not None)

    @property
    def busy(self) -> bool:
        """Some request is inside one of its handles (queued, waiting or executing)."""
        return any(v.handle is not None and v.handle.in_flight for v in self.versions.values())

    def default_version(self) -> VersionRecord | None:
        """The highest ready version, which serves requests that name no version (as in Triton)."""
        ready = self.ready_versions()
        return self.versions[ready[-1]] if ready else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    models: Mapping[str, ModelRecord]
    # (name, version as asked, "" for the default) -> the ready handle serving it.
    serving: Mapping[tuple[str, str], Handle]
    # Those of `serving` that may refuse a request before its body is decoded (a bounded queue):
    # every request asks, so a model without a bound costs one dictionary miss.
    shedding: Mapping[tuple[str, str], Handle]

    @classmethod
    def of(cls, models: Mapping[str, ModelRecord]) -> Snapshot:
        serving: dict[tuple[str, str], Handle] = {}
        for name, record in models.items():
            for version, version_record in record.versions.items():
                if version_record.state is ModelState.READY and version_record.handle is not None:
                    serving[(name, str(version))] = version_record.handle
            default = record.default_version()
            if default is not None and default.handle is not None:
                serving[(name, "")] = default.handle
        shedding = {key: handle for key, handle in serving.items() if handle.sheds}
        return cls(MappingProxyType(dict(models)), MappingProxyType(serving), MappingProxyType(shedding))


class ModelRegistry:
    def __init__(
        self,
        repository: ModelRepository,
        metrics: Metrics | None = None,
        budget: LoadBudget | None = None,
        execution_threads: int = 0,
        *,
        shared_intra_op_pool: bool = True,
        batching_defaults: BatchingDefaults | None = None,
        tracer: RequestTracer | None = None,
    ) -> None:
        """`execution_threads`: the worker threads every loaded model shares (0: the default);
        `shared_intra_op_pool`: whether sessions compute on one pool (see core.executor);
        `batching_defaults`: settings every batching model takes (--tfserving-batching-parameters);
        `tracer`: hears of every loaded version's executions when the server traces."""
        self._repository = repository
        self._tracer = tracer
        self._batching_defaults = batching_defaults
        self._shared_intra_op_pool = shared_intra_op_pool
        self._threads = make_execution_threads(execution_threads)
        self._metrics = metrics or NoMetrics()
        self._budget = budget
        # Least recently used, for eviction: model -> the tick of its last lease.
        self._last_used: dict[str, int] = {}
        self._tick = 0
        self._names: tuple[float, frozenset[str]] = (float("-inf"), frozenset())
        self._room = asyncio.Lock()
        # Estimated bytes of loads under way, counted against the budget until they finish.
        self._reserved_bytes = 0
        self._reserved_models = 0
        # What serves now: replaced whole, never changed in place. Reading it is not a use (see
        # `lookup`); InferenceService.shed reads `snapshot.shedding` before a body is decoded.
        self.snapshot = Snapshot.of({})
        self.startup_complete = False
        self._locks: dict[str, asyncio.Lock] = {}
        self._load_slots: asyncio.Semaphore | None = None
        self._draining: set[asyncio.Task[None]] = set()
        # How ensembles' steps are answered; the service replaces it with its own `infer` so that
        # a step counts in its model's statistics as any request does.
        self.infer_step: StepInference = self._infer_directly

    @property
    def repository(self) -> ModelRepository:
        return self._repository

    @property
    def budget(self) -> LoadBudget | None:
        return self._budget

    # -- lookup (any thread) ---------------------------------------------------------------------

    def records(self) -> Iterable[ModelRecord]:
        return list(self.snapshot.models.values())

    def record(self, name: str) -> ModelRecord:
        record = self.snapshot.models.get(name)
        if record is None:
            raise ModelNotFoundError(
                with_triton_phrase(f"Request for unknown model: '{name}' is not found",
                                   f"model '{name}' is not loaded or not in the repository")
            )  # fmt: skip
        return record

    def version_record(self, name: str, version: str) -> VersionRecord:
        """The version asked for ("" = the default one), ready or not."""
        record = self.record(name)
        if not version:
            default = record.default_version()
            if default is None:
                raise ModelNotReadyError(
                    with_triton_phrase(f"Request for unknown model: '{name}' has no available versions",
                                       _not_ready_message(record))
                )  # fmt: skip
            return default
        if not (version.isascii() and version.isdigit()):  # int() refuses "¹", which isdigit() takes
            raise VersionNotFoundError(
                with_triton_phrase(f"failed to get model version from specified version string '{version}'",
                                   f"model '{name}' version '{version}' is not a positive integer")
            )  # fmt: skip
        found = record.versions.get(int(version))
        if found is None:
            raise VersionNotFoundError(
                with_triton_phrase(f"Request for unknown model: '{name}' version {version} is not found",
                                   f"model '{name}' has no version {version}; loaded versions: "
                                   f"{sorted(record.versions)}")
            )  # fmt: skip
        return found

    def handle(self, name: str, version: str) -> Handle:
        """The ready handle that serves a request, or the error that says why there is none."""
        found = self.snapshot.serving.get((name, version))
        if found is not None:
            if isinstance(found, EnsembleHandle) and self._budget is None:
                self._check_steps_serving(found)
            return found
        version_record = self.version_record(name, version)
        reason = f": {version_record.reason}" if version_record.reason else ""
        raise ModelNotReadyError(
            with_triton_phrase(
                f"Request for unknown model: '{name}' version {version_record.version} is not at ready state",
                f"model '{name}' version {version_record.version} is not ready ({version_record.state.value}){reason}",
            )
        )

    def lookup(self, name: str, version: str) -> Handle | None:
        """The hot path: the handle serving (name, version) now, or None (then `lease` says why)."""
        handle = self.snapshot.serving.get((name, version))
        if handle is not None and self._budget is not None:
            self._tick += 1
            self._last_used[name] = self._tick
            self._metrics.on_demand_hit()
        return handle

    async def lease(self, name: str, version: str) -> Handle:
        """The handle serving (name, version), loading the model first when on-demand loading is on
        and the model is in the repository but not loaded (concurrent callers share the one load);
        else the error that says why there is none."""
        handle = self.lookup(name, version)
        if handle is not None:
            return handle
        if self._budget is not None and await self._loadable_on_demand(name):
            self._metrics.on_demand_miss()
            with contextlib.suppress(ModelLoadError):  # the record says why; handle() raises it below
                await self.load(name, if_not_loaded=True)
            self._tick += 1
            self._last_used[name] = self._tick
        return self.handle(name, version)

    async def _infer_directly(self, request: InferRequest) -> InferResponse:
        handle = self.lookup(request.model_name, request.model_version)
        if handle is None:
            handle = await self.lease(request.model_name, request.model_version)
        return await handle.infer(request)

    def _check_steps_serving(self, ensemble: EnsembleHandle) -> None:
        for planned in ensemble.plan.steps:
            step = planned.step
            if (step.model_name, step.version_label) not in self.snapshot.serving:
                try:
                    self.handle(step.model_name, step.version_label)
                except InferdError as exc:
                    raise ModelNotReadyError(
                        f"ensemble '{ensemble.config.name}' {planned.describe()} cannot run: {exc.message}"
                    ) from None

    def all_ready(self) -> bool:
        """Every model loaded (or that failed to) is ready; unloaded ones do not count."""
        return all(r.state is ModelState.READY for r in self.records() if r.reason != UNLOADED)

    # -- changes (event loop) --------------------------------------------------------------------

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load `names` (default: every model of the repository), concurrently; failures stay in
        each model's record."""
        if names is None:
            names = await asyncio.to_thread(self._repository.model_names)
        results = await asyncio.gather(*(self.load(name) for name in names), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, InferdError):
                raise result
        self.startup_complete = True

    async def load(
        self,
        name: str,
        *,
        config: ModelConfig | None = None,
        files: Mapping[str, bytes] = {},
        if_not_loaded: bool = False,
        code_may_change: bool = True,
    ) -> None:
        """Load or reload `name`. `config` replaces its config.pbtxt; `files` (relative path ->
        bytes, e.g. "1/model.onnx") replace its folder; `if_not_loaded`: nothing to do when it
        serves already (an on-demand load that waited for another); `code_may_change`: False
        refuses a `config` that changes what code runs (`model_files.check_override`). Raises the
        InferdError that says why when the model is unknown or a version fails (what was serving
        keeps serving), PermissionDeniedError (nothing published) for a refused override."""
        chain = _LOAD_CHAIN.get()
        if name in chain:
            cycle = " → ".join((*chain[chain.index(name) :], name))
            raise ModelLoadError(f"ensembles depend on each other in a cycle: {cycle}")
        async with self._lock(name):
            if if_not_loaded and self._serves(name):
                return
            fingerprint = None if files else await asyncio.to_thread(self._repository.fingerprint, name)
            try:
                model = await asyncio.to_thread(
                    read_local_model, self._repository, name, config, files, fingerprint,
                    code_may_change=code_may_change, batching_defaults=self._batching_defaults,
                )  # fmt: skip
            except PermissionDeniedError:
                raise  # the caller's request was refused: the model is as it was
            except InferdError as exc:
                self._publish_failure(name, exc.message, fingerprint)
                logger.error("model %s failed to load: %s", name, exc.logged, extra={"model": name})
                raise
            if model.config.ensemble is None:
                await self._load_cleaning_up(name, model)
                return
        # An ensemble: the models of its steps first, outside this model's lock (loading them
        # may wait for other loads, never for this one's).
        try:
            await self._load_steps(name, model.config, chain)
        except InferdError as exc:
            if model.owned_dir is not None:
                shutil.rmtree(model.owned_dir, ignore_errors=True)
            self._publish_failure(name, exc.message, model.fingerprint)
            logger.error("model %s failed to load: %s", name, exc.logged, extra={"model": name})
            raise
        async with self._lock(name):
            if if_not_loaded and self._serves(name):
                if model.owned_dir is not None:
                    shutil.rmtree(model.owned_dir, ignore_errors=True)
                return
            await self._load_cleaning_up(name, model)

    def _serves(self, name: str) -> bool:
        record = self.snapshot.models.get(name)
        return record is not None and bool(record.ready_versions())

    async def _load_cleaning_up(self, name: str, model: LocalModel) -> None:
        try:
            await self._load(name, model)
        except BaseException:
            if model.owned_dir is not None and self._owned_dir(name) != model.owned_dir:
                shutil.rmtree(model.owned_dir, ignore_errors=True)
            raise

    async def _load_steps(self, name: str, config: ModelConfig, chain: tuple[str, ...]) -> None:
        """Load the models an ensemble's steps name that do not serve yet, concurrently."""
        assert config.ensemble is not None
        names = config.ensemble.model_names
        token = _LOAD_CHAIN.set((*chain, name))
        try:
            results = await asyncio.gather(
                *(self.load(step_model, if_not_loaded=True) for step_model in names), return_exceptions=True
            )
        finally:
            _LOAD_CHAIN.reset(token)
        for step_model, result in zip(names, results, strict=True):
            if isinstance(result, InferdError):
                raise ModelLoadError(f"ensemble '{name}': step model '{step_model}' cannot load: {result.message}")
            if isinstance(result, BaseException):
                raise result

    async def unload(self, name: str, *, reason: str = UNLOADED, dependents: bool = False) -> None:
        """Stop serving `name`: requests already accepted finish, later ones are told it is unloaded.
        A model of the repository that is not loaded is left as it is. `dependents` (an ensemble):
        also unload the models its steps use that no other loaded ensemble uses."""
        used = self._step_models(name) if dependents else ()
        await self._unload(name, reason)
        for step_model in used:
            if step_model not in self._models_used_by_ensembles():
                await self.unload(step_model, reason=reason, dependents=True)

    def _step_models(self, name: str) -> tuple[str, ...]:
        """The models the loaded versions of ensemble `name` use (none for a plain model)."""
        record = self.snapshot.models.get(name)
        found: dict[str, None] = {}
        for version in record.versions.values() if record is not None else ():
            if version.handle is not None and version.handle.config.ensemble is not None:
                found.update(dict.fromkeys(version.handle.config.ensemble.model_names))
        return tuple(found)

    def _models_used_by_ensembles(self) -> set[str]:
        return {step_model for name in self.snapshot.models for step_model in self._step_models(name)}

    async def _unload(self, name: str, reason: str) -> None:
        async with self._lock(name):
            record = self.snapshot.models.get(name)
            if record is None:
                if await asyncio.to_thread(self._repository.has_model, name):
                    return
                raise ModelNotFoundError(f"model '{name}' is not loaded or not in the repository")
            handles = [v.handle for v in record.versions.values() if v.handle is not None]
            self._publish(replace(record, state=ModelState.UNLOADING, reason="", versions=MappingProxyType({})))
            logger.info("model %s: unloading", name, extra={"model": name})
            await asyncio.gather(*(handle.drain() for handle in handles))
            if record.owned_dir is not None:
                shutil.rmtree(record.owned_dir, ignore_errors=True)
            await asyncio.to_thread(self._repository.release, name)
            self._publish(ModelRecord(name=name, state=ModelState.FAILED, reason=reason))
            self._last_used.pop(name, None)
            self._metrics.model_unloaded(name)
            logger.info("model %s: unloaded", name, extra={"model": name})

    async def forget(self, name: str) -> None:
        """Unload `name` and drop its record (its folder left the repository)."""
        if name in self.snapshot.models:
            await self.unload(name)
            self._drop(name)

    async def poll(self) -> None:
        """Bring the served models in line with the repository: load what was added or changed,
        forget what was removed. Models whose files did not change are not touched."""
        names, fingerprints = await asyncio.to_thread(self._scan)
        for name in set(self.snapshot.models) - set(names):
            if self.snapshot.models[name].owned_dir is None:
                logger.info("model %s left the repository", name, extra={"model": name})
                await self.forget(name)
        changed = [
            name
            for name in names
            if (record := self.snapshot.models.get(name)) is None or record.fingerprint != fingerprints.get(name)
        ]
        if self._budget is not None:
            # Under a budget a model loads on its first request, not because it appeared; only
            # models serving now are reloaded when their files change.
            # A model that failed is forgotten when its files change, so its next request tries again.
            for name in changed:
                record = self.snapshot.models.get(name)
                if record is not None and not record.versions and record.reason not in (UNLOADED, EVICTED):
                    self._drop(name)
            changed = [name for name in changed if (r := self.snapshot.models.get(name)) is not None and r.versions]
        results = await asyncio.gather(*(self.load(name) for name in changed), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, InferdError):
                raise result

    async def close(self) -> None:
        """Drain every handle (shutdown)."""
        for name in list(self.snapshot.models):
            record = self.snapshot.models[name]
            if record.versions or record.owned_dir is not None:
                await self.unload(name)
        if self._draining:
            await asyncio.gather(*self._draining)
        self._threads.shutdown(wait=False)

    # -- internals -------------------------------------------------------------------------------

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def _owned_dir(self, name: str) -> Path | None:
        record = self.snapshot.models.get(name)
        return record.owned_dir if record is not None else None

    def _drop(self, name: str) -> None:
        """Forget `name`'s record (it serves nothing)."""
        models = dict(self.snapshot.models)
        models.pop(name, None)
        self.snapshot = Snapshot.of(models)

    def _publish(self, record: ModelRecord) -> None:
        models = dict(self.snapshot.models)
        models[record.name] = record
        self.snapshot = Snapshot.of(models)

    def _scan(self) -> tuple[list[str], dict[str, ModelFingerprint | None]]:
        names = self._repository.model_names()
        fingerprints: dict[str, ModelFingerprint | None] = {}
        for name in names:
            try:
                fingerprints[name] = self._repository.fingerprint(name)
            except OSError:  # changing under our feet: look again at the next poll
                fingerprints[name] = None
        return names, fingerprints

    def _publish_failure(self, name: str, reason: str, fingerprint: ModelFingerprint | None) -> None:
        """A load that failed before any version: what serves keeps serving; else the model is UNAVAILABLE."""
        old = self.snapshot.models.get(name)
        if old is not None and old.ready_versions():
            self._publish(replace(old, reason=f"reloading failed: {reason}", fingerprint=fingerprint))
        else:
            self._publish(ModelRecord(name, ModelState.FAILED, reason, fingerprint=fingerprint))

    async def _load(self, name: str, model: LocalModel) -> None:
        old = self.snapshot.models.get(name)
        old_versions = dict(old.versions) if old is not None else {}
        kept: dict[int, VersionRecord] = {}
        to_load: list[int] = []
        for version in model.versions:
            current = old_versions.get(version)
            files = model.fingerprint.version(version) if model.fingerprint is not None else None
            unchanged = (
                current is not None
                and current.state is ModelState.READY
                and files is not None
                and current.files == files
                and current.config == model.config
            )
            if unchanged and current is not None:
                kept[version] = current
            else:
                to_load.append(version)
        # While loading, whatever serves keeps serving; new versions show as LOADING.
        showing = dict(old_versions)
        for version in to_load:
            if version not in showing or showing[version].state is not ModelState.READY:
                showing[version] = VersionRecord(version=version, state=ModelState.LOADING)
        state = ModelState.READY if any(v.state is ModelState.READY for v in showing.values()) else ModelState.LOADING
        self._publish(ModelRecord(name, state, "", MappingProxyType(showing), old.fingerprint if old else None,
                                  old.owned_dir if old else None))  # fmt: skip

        need = sum(model.memory_bytes.get(version, 0) for version in to_load)
        new_model = not any(v.handle is not None for v in old_versions.values())
        if self._budget is not None and to_load:
            await self._make_room(name, need, new_model)
        try:
            loaded = await asyncio.gather(*(self._load_version(name, model, version) for version in to_load))
        finally:
            if self._budget is not None and to_load:
                self._reserved_bytes -= need
                self._reserved_models -= new_model
        versions = dict(kept)
        failures = []
        for version, result in zip(to_load, loaded, strict=True):
            current = old_versions.get(version)
            if result.state is ModelState.READY or current is None or current.state is not ModelState.READY:
                versions[version] = result
            else:  # the new files failed: the version that was serving stays, and says why
                versions[version] = replace(current, reason=f"reloading failed: {result.reason}")
            if result.state is not ModelState.READY:
                failures.append(f"version {version}: {result.reason}")
        if failures:
            # As Triton: when a new version fails, the versions that served keep serving, even
            # those the version policy would now leave out.
            for version, current in old_versions.items():
                if version not in versions and current.state is ModelState.READY:
                    versions[version] = current
        if any(v.state is ModelState.READY for v in versions.values()):
            state, reason = ModelState.READY, ""
        else:
            state, reason = ModelState.FAILED, "; ".join(failures)
        self._publish(ModelRecord(name, state, reason, MappingProxyType(versions), model.fingerprint, model.owned_dir))
        # Traffic has moved: what no longer serves drains in the background.
        serving = {id(v.handle) for v in versions.values() if v.handle is not None}
        for replaced in old_versions.values():
            if replaced.handle is not None and id(replaced.handle) not in serving:
                self._drain_later(replaced.handle)
        if old is not None and old.owned_dir is not None and old.owned_dir != model.owned_dir:
            shutil.rmtree(old.owned_dir, ignore_errors=True)
        if failures:
            raise ModelLoadError(f"model '{name}' failed to load: {'; '.join(failures)}")

    async def _load_version(self, name: str, model: LocalModel, version: int) -> VersionRecord:
        if self._load_slots is None:
            self._load_slots = asyncio.Semaphore(LOAD_WORKERS)
        files = model.fingerprint.version(version) if model.fingerprint is not None else None
        if model.config.ensemble is not None:
            try:
                ensemble = self._ensemble_handle(with_labels(model.config, model.model_dir), version)
            except InferdError as exc:
                return self._version_failed(name, version, exc, model, files)
            self._metrics.version_loaded(name, LoadTimings(session_s=0.0, warmup_s=0.0))
            return VersionRecord(version, ModelState.READY, "", ensemble, None, files, model.config)
        async with self._load_slots:
            try:
                handle: Handle
                handle, timings = await asyncio.to_thread(
                    load_version,
                    model.config,
                    version,
                    model.model_dir / str(version),
                    model.model_dir,
                    self._metrics,
                    self._threads,
                    shared_intra_op_pool=self._shared_intra_op_pool,
                    event_loop=asyncio.get_running_loop(),
                    tracer=self._tracer,
                )
                timings = replace(timings, fetch_s=model.fetch_s)
            except InferdError as exc:
                return self._version_failed(name, version, exc, model, files)
        self._metrics.version_loaded(name, timings)
        return VersionRecord(
            version, ModelState.READY, "", handle, timings, files, model.config, model.memory_bytes.get(version, 0)
        )

    def _version_failed(
        self, name: str, version: int, exc: InferdError, model: LocalModel, files: tuple[FileEntry, ...] | None
    ) -> VersionRecord:
        logger.error(
            "model %s version %d failed to load: %s",
            name,
            version,
            exc.logged,
            extra={"model": name, "version": version},
        )
        self._metrics.version_load_failed(name)
        # The reason clients read (load answers, readiness, the index) names files inside the
        # model's folder, not where the server keeps it.
        reason = relative_to_model_folder(exc, str(model.model_dir)).message
        return VersionRecord(version, ModelState.FAILED, reason, files=files, config=model.config)

    def _ensemble_handle(self, config: ModelConfig, version: int) -> EnsembleHandle:
        """Plan the ensemble against the configs of its step models, which serve by now."""
        assert config.ensemble is not None
        step_configs = []
        for index, step in enumerate(config.ensemble.steps):
            try:
                step_configs.append(self.handle(step.model_name, step.version_label).config)
            except InferdError as exc:
                raise ModelConfigError(
                    f"ensemble '{config.name}' step {index} (model '{step.model_name}'): {exc.message}"
                ) from None
        plan = plan_ensemble(config, step_configs)
        completed = replace(with_step_labels(config, step_configs), platform=config.platform, instance_groups=())
        logger.info(
            "model %s version %d: an ensemble of %d step(s): %s",
            config.name,
            version,
            len(plan.steps),
            " → ".join(step.model_name for step in config.ensemble.steps),
            extra={"model": config.name, "version": version},
        )
        return EnsembleHandle(config=completed, version=version, plan=plan, infer_step=self._infer_step)

    async def _infer_step(self, request: InferRequest) -> InferResponse:
        # Late-bound: the service sets `infer_step` after the registry is made.
        return await self.infer_step(request)

    async def _loadable_on_demand(self, name: str) -> bool:
        record = self.snapshot.models.get(name)
        if record is not None:
            # A model that failed to load keeps its reason until its files change; only one that
            # was never loaded, unloaded or evicted loads on demand, or one loading now (its
            # load's lock is then waited for, not taken again).
            loading = record.state is ModelState.LOADING or self._lock(name).locked()
            return loading or (record.reason in (UNLOADED, EVICTED) and not record.versions)
        now = time.monotonic()
        listed_at, names = self._names
        if now - listed_at > NAMES_TTL_S:
            names = frozenset(await asyncio.to_thread(self._repository.model_names))
            self._names = (now, names)
        return name in names

    async def _make_room(self, name: str, need: int, new_model: bool) -> None:
        """Evict least recently used idle models until `need` more bytes (and, for a model not
        loaded yet, one more model) fit the budget; then reserve them until the load finishes."""
        budget = self._budget
        assert budget is not None
        if budget.memory_bytes is not None and need > budget.memory_bytes:
            raise ModelTooLargeError(
                f"model '{name}' needs about {_mib(need)} (estimated) but the model memory budget is "
                f"{_mib(budget.memory_bytes)} (--model-memory-budget)"
            )
        async with self._room:
            while True:
                others = [r for r in self.snapshot.models.values() if r.name != name and r.memory_bytes]
                used = sum(r.memory_bytes for r in others) + self._reserved_bytes
                count = len(others) + self._reserved_models + new_model
                fits_memory = budget.memory_bytes is None or used + need <= budget.memory_bytes
                fits_count = budget.max_models is None or count <= budget.max_models
                if fits_memory and fits_count:
                    self._reserved_bytes += need
                    self._reserved_models += new_model
                    return
                victims = [
                    r for r in others if r.name not in budget.pinned and not r.busy and not self._lock(r.name).locked()
                ]
                if not victims:
                    raise ModelTooLargeError(
                        f"model '{name}' (about {_mib(need)}, estimated) does not fit: {_mib(used)} of the "
                        f"{_mib(budget.memory_bytes) if budget.memory_bytes else 'unlimited'} model memory budget "
                        f"and {count - new_model} of {budget.max_models or 'unlimited'} models are held by models "
                        "that are pinned or serving requests now; retry later"
                    )
                victim = min(victims, key=lambda r: self._last_used.get(r.name, 0))
                logger.info(
                    "model %s: evicted (least recently used, %s) to make room for %s",
                    victim.name,
                    _mib(victim.memory_bytes),
                    name,
                    extra={"model": victim.name},
                )
                self._metrics.model_evicted(victim.name)
                await self.unload(victim.name, reason=EVICTED)

    def _drain_later(self, handle: Handle) -> None:
        task = asyncio.get_running_loop().create_task(handle.drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _not_ready_message(record: ModelRecord) -> str:
    reason = f": {record.reason}" if record.reason else ""
    return f"model '{record.name}' is not ready ({record.state.value}){reason}"

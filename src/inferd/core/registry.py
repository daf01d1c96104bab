"""Which models and versions exist, in what state, and the handles that serve them.

Ownership. Everything here changes on the event loop's thread and nowhere else; the slow parts of
a load (reading files, creating sessions, warm-up) run on worker threads and hand their result
back to the loop. What readers see is a `Snapshot`: immutable records and the request lookup
table, replaced whole on every change. A request's lookup is one dict read of the current
snapshot, never racing a loader; a metrics scrape on another thread reads a consistent one.

Changes. `load(name)` reads the model's config and versions, keeps every version already serving
the same files under the same config, loads the others beside the ones serving (the old ones
keep answering meanwhile), then switches the lookup table in one step and drains what was
replaced: requests already inside an old handle finish there (`ModelHandle.drain`). A version
that fails to load leaves the one serving in place and says why in its record and the log.
`unload(name)` stops routing first, then drains. Loads and unloads of one model are serialized
by its lock; different models load concurrently, `LOAD_WORKERS` at a time.

A model that fails to load fails alone: its record keeps the state UNAVAILABLE and the reason,
which every request for it receives, while the other models serve.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from inferd.config.loader import read_model_config
from inferd.config.model import ModelConfig
from inferd.core.handle import ModelHandle
from inferd.core.loading import load_version
from inferd.core.metrics import Metrics, NoMetrics
from inferd.core.repository import FileEntry, ModelFingerprint, ModelRepository
from inferd.errors import (
    InferdError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    VersionNotFoundError,
)
from inferd.types import LoadTimings

logger = logging.getLogger("inferd.registry")

# How many versions load at once; loading is mostly file reading and graph optimization.
LOAD_WORKERS = 2
UNLOADED = "unloaded"


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
    handle: ModelHandle | None = None
    timings: LoadTimings | None = None
    # The version's files and the model's config as loaded, to tell a changed model from the same one.
    files: tuple[FileEntry, ...] | None = None
    config: ModelConfig | None = None


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

    def default_version(self) -> VersionRecord | None:
        """The highest ready version, which serves requests that name no version (as in Triton)."""
        ready = self.ready_versions()
        return self.versions[ready[-1]] if ready else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    models: Mapping[str, ModelRecord]
    # (name, version as asked, "" for the default) -> the ready handle serving it.
    serving: Mapping[tuple[str, str], ModelHandle]

    @classmethod
    def of(cls, models: Mapping[str, ModelRecord]) -> Snapshot:
        serving: dict[tuple[str, str], ModelHandle] = {}
        for name, record in models.items():
            for version, version_record in record.versions.items():
                if version_record.state is ModelState.READY and version_record.handle is not None:
                    serving[(name, str(version))] = version_record.handle
            default = record.default_version()
            if default is not None and default.handle is not None:
                serving[(name, "")] = default.handle
        return cls(MappingProxyType(dict(models)), MappingProxyType(serving))


@dataclass(frozen=True, slots=True)
class LocalModel:
    """A model's files as a load sees them: its folder, its config and what to load of it."""

    model_dir: Path
    config: ModelConfig
    versions: list[int]
    fingerprint: ModelFingerprint | None
    owned_dir: Path | None = None
    # Seconds spent bringing the files to `model_dir` (a remote repository's fetch).
    fetch_s: float = 0.0


class ModelRegistry:
    def __init__(self, repository: ModelRepository, metrics: Metrics | None = None) -> None:
        self._repository = repository
        self._metrics = metrics or NoMetrics()
        self._snapshot = Snapshot.of({})
        self.startup_complete = False
        self._locks: dict[str, asyncio.Lock] = {}
        self._load_slots: asyncio.Semaphore | None = None
        self._draining: set[asyncio.Task[None]] = set()

    @property
    def repository(self) -> ModelRepository:
        return self._repository

    # -- lookup (any thread) ---------------------------------------------------------------------

    def records(self) -> Iterable[ModelRecord]:
        return list(self._snapshot.models.values())

    def record(self, name: str) -> ModelRecord:
        record = self._snapshot.models.get(name)
        if record is None:
            raise ModelNotFoundError(f"model '{name}' is not loaded or not in the repository")
        return record

    def version_record(self, name: str, version: str) -> VersionRecord:
        """The version asked for ("" = the default one), ready or not."""
        record = self.record(name)
        if not version:
            default = record.default_version()
            if default is None:
                raise ModelNotReadyError(_not_ready_message(record))
            return default
        if not version.isdigit():
            raise VersionNotFoundError(f"model '{name}' version '{version}' is not a positive integer")
        found = record.versions.get(int(version))
        if found is None:
            raise VersionNotFoundError(
                f"model '{name}' has no version {version}; loaded versions: {sorted(record.versions)}"
            )
        return found

    def handle(self, name: str, version: str) -> ModelHandle:
        """The ready handle that serves a request, or the error that says why there is none."""
        found = self._snapshot.serving.get((name, version))
        if found is not None:
            return found
        version_record = self.version_record(name, version)
        reason = f": {version_record.reason}" if version_record.reason else ""
        raise ModelNotReadyError(
            f"model '{name}' version {version_record.version} is not ready ({version_record.state.value}){reason}"
        )

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

    async def load(self, name: str, *, config: ModelConfig | None = None, files: Mapping[str, bytes] = {}) -> None:
        """Load or reload `name`. `config` replaces its config.pbtxt; `files` (relative path ->
        bytes, e.g. "1/model.onnx") replace its folder. Raises the InferdError that says why when
        the model is unknown or a version fails (the versions that were serving keep serving)."""
        async with self._lock(name):
            fingerprint = None if files else await asyncio.to_thread(self._repository.fingerprint, name)
            try:
                model = await asyncio.to_thread(self._read_model, name, config, files, fingerprint)
            except InferdError as exc:
                self._publish_failure(name, exc.message, fingerprint)
                logger.error("model %s failed to load: %s", name, exc.message, extra={"model": name})
                raise
            try:
                await self._load(name, model)
            except BaseException:
                if model.owned_dir is not None and self._owned_dir(name) != model.owned_dir:
                    shutil.rmtree(model.owned_dir, ignore_errors=True)
                raise

    async def unload(self, name: str) -> None:
        """Stop serving `name`: requests already accepted finish, later ones are told it is unloaded.
        A model of the repository that is not loaded is left as it is."""
        async with self._lock(name):
            record = self._snapshot.models.get(name)
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
            self._publish(ModelRecord(name=name, state=ModelState.FAILED, reason=UNLOADED))
            self._metrics.model_unloaded(name)
            logger.info("model %s: unloaded", name, extra={"model": name})

    async def forget(self, name: str) -> None:
        """Unload `name` and drop its record (its folder left the repository)."""
        if name in self._snapshot.models:
            await self.unload(name)
            models = dict(self._snapshot.models)
            models.pop(name, None)
            self._snapshot = Snapshot.of(models)

    async def poll(self) -> None:
        """Bring the served models in line with the repository: load what was added or changed,
        forget what was removed. Models whose files did not change are not touched."""
        names, fingerprints = await asyncio.to_thread(self._scan)
        for name in set(self._snapshot.models) - set(names):
            if self._snapshot.models[name].owned_dir is None:
                logger.info("model %s left the repository", name, extra={"model": name})
                await self.forget(name)
        changed = [
            name
            for name in names
            if (record := self._snapshot.models.get(name)) is None or record.fingerprint != fingerprints.get(name)
        ]
        results = await asyncio.gather(*(self.load(name) for name in changed), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, InferdError):
                raise result

    async def close(self) -> None:
        """Drain every handle (shutdown)."""
        for name in list(self._snapshot.models):
            record = self._snapshot.models[name]
            if record.versions or record.owned_dir is not None:
                await self.unload(name)
        if self._draining:
            await asyncio.gather(*self._draining)

    # -- internals -------------------------------------------------------------------------------

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def _owned_dir(self, name: str) -> Path | None:
        record = self._snapshot.models.get(name)
        return record.owned_dir if record is not None else None

    def _publish(self, record: ModelRecord) -> None:
        models = dict(self._snapshot.models)
        models[record.name] = record
        self._snapshot = Snapshot.of(models)

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
        old = self._snapshot.models.get(name)
        if old is not None and old.ready_versions():
            self._publish(replace(old, reason=f"reloading failed: {reason}", fingerprint=fingerprint))
        else:
            self._publish(ModelRecord(name, ModelState.FAILED, reason, fingerprint=fingerprint))

    def _read_model(
        self, name: str, config: ModelConfig | None, files: Mapping[str, bytes], fingerprint: ModelFingerprint | None
    ) -> LocalModel:
        """On a worker thread: the model's folder, config and the versions to load."""
        owned_dir = None
        fetch_started = time.perf_counter()
        if files:
            owned_dir = model_dir = write_model_files(name, files)
        else:
            model_dir = self._repository.localize(name, ())  # the config and shared files first
        try:
            if config is None:
                config = read_model_config(model_dir)
            config = replace(config, name=name)
            if config.ignored_fields:
                logger.warning(
                    "model %s: config fields not supported and ignored: %s",
                    name,
                    ", ".join(config.ignored_fields),
                    extra={"model": name},
                )
            if fingerprint is not None:
                available = fingerprint.version_numbers
            else:
                available = sorted(
                    int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0
                )
            selected = config.version_policy.select(available)
            if not selected:
                raise ModelLoadError(
                    f"no version of model '{name}' to load: found versions {available}, "
                    f"version_policy {config.version_policy.kind.value} selects none"
                )
            if owned_dir is None:
                model_dir = self._repository.localize(name, selected)
        except BaseException:
            if owned_dir is not None:
                shutil.rmtree(owned_dir, ignore_errors=True)
            raise
        fetch_s = time.perf_counter() - fetch_started if owned_dir is None else 0.0
        return LocalModel(model_dir, config, selected, fingerprint, owned_dir, fetch_s)

    async def _load(self, name: str, model: LocalModel) -> None:
        old = self._snapshot.models.get(name)
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

        loaded = await asyncio.gather(*(self._load_version(name, model, version) for version in to_load))
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
        async with self._load_slots:
            try:
                handle, timings = await asyncio.to_thread(
                    load_version, model.config, version, model.model_dir / str(version), model.model_dir, self._metrics
                )
                timings = replace(timings, fetch_s=model.fetch_s)
            except InferdError as exc:
                logger.error(
                    "model %s version %d failed to load: %s",
                    name,
                    version,
                    exc.message,
                    extra={"model": name, "version": version},
                )
                self._metrics.version_load_failed(name)
                return VersionRecord(version, ModelState.FAILED, exc.message, files=files, config=model.config)
        self._metrics.version_loaded(name, timings)
        return VersionRecord(version, ModelState.READY, "", handle, timings, files, model.config)

    def _drain_later(self, handle: ModelHandle) -> None:
        task = asyncio.get_running_loop().create_task(handle.drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)


def write_model_files(name: str, files: Mapping[str, bytes]) -> Path:
    """A fresh folder holding `files` (relative path -> bytes) for model `name`; paths that would
    leave it are refused."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=f"inferd-{name}-"))
    try:
        for relative, content in files.items():
            path = (root / relative).resolve()
            if not path.is_relative_to(root.resolve()) or relative.startswith("/") or ".." in Path(relative).parts:
                raise ModelLoadError(f"model '{name}': file path '{relative}' leaves the model's folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def _not_ready_message(record: ModelRecord) -> str:
    reason = f": {record.reason}" if record.reason else ""
    return f"model '{record.name}' is not ready ({record.state.value}){reason}"

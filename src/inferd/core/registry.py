"""Which models and versions exist, in what state, and their loaded handles.

A model that fails to load fails alone: its record keeps the state FAILED and the reason, which
every request for it receives, while the other models serve.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from inferd.config.loader import complete_config, read_model_config
from inferd.config.model import InstanceGroup, ModelConfig
from inferd.core.batcher import DynamicBatcher
from inferd.core.executor import InstancePool, intra_op_threads_per_instance
from inferd.core.handle import ModelHandle
from inferd.core.metrics import Metrics, NoMetrics
from inferd.core.repository import ModelRepository
from inferd.core.warmup import probe_inputs, run_warmup
from inferd.errors import (
    InferdError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    VersionNotFoundError,
)
from inferd.runtimes import Runtime, RuntimeOptions, load_runtime

logger = logging.getLogger("inferd.registry")

# How many models load at once at startup; loading is mostly file reading and graph optimization.
STARTUP_LOAD_WORKERS = 2


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass(slots=True)
class VersionRecord:
    version: int
    state: ModelState
    reason: str = ""
    handle: ModelHandle | None = None


@dataclass(slots=True)
class ModelRecord:
    name: str
    state: ModelState
    reason: str = ""
    # The config as written (None until read); each ready version's handle holds its completed config.
    config: ModelConfig | None = None
    versions: dict[int, VersionRecord] = field(default_factory=dict)

    def ready_versions(self) -> list[int]:
        return sorted(v for v, r in self.versions.items() if r.state is ModelState.READY)

    def default_version(self) -> VersionRecord | None:
        """The highest ready version, which serves requests that name no version (as in Triton)."""
        ready = self.ready_versions()
        return self.versions[ready[-1]] if ready else None


class ModelRegistry:
    def __init__(self, repository: ModelRepository, metrics: Metrics | None = None) -> None:
        self._repository = repository
        self._metrics = metrics or NoMetrics()
        self._records: dict[str, ModelRecord] = {}
        self._lock = threading.Lock()
        self.startup_complete = False
        # (name, version as asked, "" for the default) -> the handle serving it; the per-request
        # lookup. NOTE: cleared whenever any model's state changes, so it never serves a stale one.
        self._serving: dict[tuple[str, str], ModelHandle] = {}

    # -- loading ---------------------------------------------------------------------------------

    def load_all(self) -> None:
        """Load every model of the repository; blocking, meant for a worker thread at startup."""
        self._repository.check()
        names = self._repository.model_names()
        with ThreadPoolExecutor(max_workers=STARTUP_LOAD_WORKERS, thread_name_prefix="inferd-load") as pool:
            list(pool.map(self.load_model, names))
        self.startup_complete = True

    def load_model(self, name: str) -> ModelRecord:
        record = ModelRecord(name=name, state=ModelState.LOADING)
        with self._lock:
            self._records[name] = record
            self._serving.clear()
        try:
            config = read_model_config(self._repository.model_dir(name))
            record.config = config
            available = self._repository.versions(name)
            selected = config.version_policy.select(available)
            if not selected:
                raise ModelLoadError(
                    f"no version of model '{name}' to load: found versions {available} under "
                    f"{self._repository.model_dir(name)}, version_policy {config.version_policy.kind.value} "
                    "selects none"
                )
            if config.ignored_fields:
                logger.warning(
                    "model %s: config fields not supported and ignored: %s",
                    name,
                    ", ".join(config.ignored_fields),
                    extra={"model": name},
                )
            for version in selected:
                record.versions[version] = self._load_version(config, version)
        except InferdError as exc:
            record.state, record.reason = ModelState.FAILED, exc.message
            logger.error("model %s failed to load: %s", name, exc.message, extra={"model": name})
            return record
        if record.ready_versions():
            record.state = ModelState.READY
        else:
            record.state = ModelState.FAILED
            record.reason = "; ".join(f"version {v}: {r.reason}" for v, r in sorted(record.versions.items()))
        with self._lock:
            self._serving.clear()
        return record

    def _load_version(self, config: ModelConfig, version: int) -> VersionRecord:
        version_dir = self._repository.version_dir(config.name, version)
        instances: list[Runtime] = []
        pool: InstancePool | None = None
        try:
            groups = config.instance_groups or (InstanceGroup(),)
            threads = intra_op_threads_per_instance(sum(g.count for g in groups))
            for group in groups:
                for _ in range(group.count):
                    options = RuntimeOptions(instance_group=group, intra_op_threads=threads)
                    instances.append(load_runtime(config, version_dir, options))
            completed = complete_config(config, instances[0].signature)
            metrics, label = self._metrics, str(version)
            pool = InstancePool(
                instances,
                name=config.name,
                on_execute=lambda rows, infer_s: metrics.batch_executed(config.name, label, rows, infer_s),
            )
            # Warm-up runs before the version is ready, outside the metrics (it is not traffic).
            run_warmup(completed, pool, self._repository.model_dir(config.name))
            execute_s = self._calibrate(completed, pool)
        except InferdError as exc:
            if pool is not None:
                pool.close()
            else:
                for instance in instances:
                    instance.close()
            logger.error(
                "model %s version %d failed to load: %s",
                config.name,
                version,
                exc.message,
                extra={"model": config.name, "version": version},
            )
            return VersionRecord(version=version, state=ModelState.FAILED, reason=exc.message)
        batcher = None
        if completed.dynamic_batching is not None and completed.max_batch_size > 0:
            batcher = DynamicBatcher(
                config.name, pool, max_batch_size=completed.max_batch_size, config=completed.dynamic_batching
            )
        handle = ModelHandle(config=completed, version=version, pool=pool, batcher=batcher)
        logger.info(
            "model %s version %d ready (%d instance(s), %d thread(s) each, max_batch_size %d, dynamic batching %s, "
            "%s, %.0f us per execution)",
            config.name,
            version,
            len(instances),
            threads,
            completed.max_batch_size,
            "on" if batcher is not None else "off",
            "inline on the event loop" if pool.runs_inline else "on worker threads",
            execute_s * 1e6,
            extra={"model": config.name, "version": version},
        )
        return VersionRecord(version=version, state=ModelState.READY, handle=handle)

    @staticmethod
    def _calibrate(config: ModelConfig, pool: InstancePool) -> float:
        """Where the model runs (inline or on threads); a model the probe cannot feed uses threads."""
        try:
            return pool.calibrate(probe_inputs(config), [t.name for t in config.outputs])
        except InferdError as exc:
            logger.info("model %s: not timed (%s); it runs on worker threads", config.name, exc.message)
            return 0.0

    # -- lookup ----------------------------------------------------------------------------------

    def records(self) -> Iterable[ModelRecord]:
        with self._lock:
            return list(self._records.values())

    def record(self, name: str) -> ModelRecord:
        record = self._records.get(name)
        if record is None:
            raise ModelNotFoundError(f"model '{name}' is not in the repository")
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
        cached = self._serving.get((name, version))
        if cached is not None:
            return cached
        found = self.version_record(name, version)
        if found.state is not ModelState.READY or found.handle is None:
            reason = f": {found.reason}" if found.reason else ""
            raise ModelNotReadyError(
                f"model '{name}' version {found.version} is not ready ({found.state.value}){reason}"
            )
        self._serving[(name, version)] = found.handle
        return found.handle

    def all_ready(self) -> bool:
        return all(r.state is ModelState.READY for r in self.records())

    def close(self) -> None:
        for record in self.records():
            for version in record.versions.values():
                if version.handle is not None:
                    version.handle.close()


def _not_ready_message(record: ModelRecord) -> str:
    reason = f": {record.reason}" if record.reason else ""
    return f"model '{record.name}' is not ready ({record.state.value}){reason}"

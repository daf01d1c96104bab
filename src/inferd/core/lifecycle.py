"""How models come and go: load (a hot swap when one serves), unload with drain, poll, close,
and loading on a request's demand under the memory budget.

Ownership. Everything here changes the catalogue on the event loop's thread and nowhere else;
the slow parts of a load (reading files, creating sessions, warm-up) run on worker threads and
hand their result back to the loop, which publishes a new snapshot (core.catalogue).

Changes. `load(name)` reads the model's config and versions (core.local_model), keeps every
version already serving the same files under the same config, loads the others beside the ones
serving (the old ones keep answering meanwhile; core.loading.load_version), then switches the
lookup table in one step and drains what was replaced: requests already inside an old handle
finish there (`Handle.drain`). A version that fails to load leaves the one serving in place and
says why in its record and the log. `unload(name)` stops routing first, then drains. Loads and
unloads of one model are serialized by its lock; different models load concurrently,
`LOAD_WORKERS` at a time. A model that fails to load fails alone: its record keeps the state
UNAVAILABLE and the reason, which every request for it receives, while the other models serve.

On demand (with a `MemoryBudget`, core.budget): `load_on_demand` loads a model of the repository
that a request names and that is not loaded; concurrent first requests wait for the one load (the
model's lock). Before any load under a budget, room is made by evicting idle models.

Scale to zero (core.idle_unload, with or without a budget): `scale_to_zero` unloads a model that
stayed idle for its `idle_unload_seconds`; its record says SCALED_TO_ZERO and keeps the files'
fingerprint (a poll does not bring it back), and its next request loads it again through
`load_on_demand`: a cold start, timed under its own cause and logged once. At most `max_held`
requests wait for one model's on-demand load; the next get 503 with Retry-After.

Ensembles (core.ensemble_loading) load their step models first; their handles get the dispatcher
(core.dispatcher), through which their steps run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from inferd.config.batching import BatchingDefaults
from inferd.config.model import ModelConfig
from inferd.config.scale_to_zero import SCALE_TO_ZERO_OFF, ScaleToZeroDefaults, max_held
from inferd.core.budget import MemoryBudget
from inferd.core.catalogue import (
    AT_REST,
    EVICTED,
    SCALED_TO_ZERO,
    UNLOADED,
    Catalogue,
    ModelRecord,
    ModelState,
    VersionRecord,
)
from inferd.core.classification import with_labels
from inferd.core.dispatcher import Dispatcher
from inferd.core.ensemble_loading import (
    check_no_cycle,
    ensemble_handle,
    load_steps,
    models_used_by_ensembles,
    step_models,
)
from inferd.core.executor import execution_threads as make_execution_threads
from inferd.core.handle import Handle
from inferd.core.loading import load_version
from inferd.core.local_model import LocalModel, read_local_model
from inferd.core.metrics import COLD_START, LOAD, Metrics
from inferd.core.repository import FileEntry, ModelFingerprint, ModelRepository
from inferd.core.tracing import RequestTracer
from inferd.errors import (
    InferdError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    PermissionDeniedError,
    copied,
    relative_to_model_folder,
)
from inferd.runtimes.onnx_cache import OptimizedModelCache
from inferd.types import LoadTimings

logger = logging.getLogger("inferd.registry")

# How many versions load at once; loading is mostly file reading and graph optimization.
LOAD_WORKERS = 2
# How long a listing of the repository's model names answers on-demand lookups: a client sending
# made-up names costs at most one listing per interval, not one per request.
NAMES_TTL_S = 1.0


@dataclass(frozen=True, slots=True, eq=False)
class AtRest:
    """A model unloaded to rest (scaled to zero, or evicted under the budget), as its next load
    needs it: loaded again as it was (its config override, the folder of the files its load sent),
    with at most `max_held` requests waiting for it. Compared by identity: a load started for one
    rest does not serve the next."""

    reason: str
    max_held: int
    override: ModelConfig | None = None
    kept_dir: Path | None = None


class ModelLifecycle:
    def __init__(
        self,
        repository: ModelRepository,
        catalogue: Catalogue,
        dispatcher: Dispatcher,
        metrics: Metrics,
        budget: MemoryBudget | None = None,
        execution_threads: int = 0,
        *,
        shared_intra_op_pool: bool = True,
        batching_defaults: BatchingDefaults | None = None,
        tracer: RequestTracer | None = None,
        scale_to_zero: ScaleToZeroDefaults = SCALE_TO_ZERO_OFF,
        onnx_cache: OptimizedModelCache | None = None,
    ) -> None:
        """`dispatcher`: what ensembles' steps run through; `execution_threads`: the worker threads
        every loaded model shares (0: the default); `shared_intra_op_pool`: whether sessions
        compute on one pool (see core.executor); `batching_defaults`: settings every batching model
        takes (--tfserving-batching-parameters); `tracer`: hears of every loaded version's
        executions when the server traces; `scale_to_zero`: the server's --idle-unload-seconds and
        --max-held; `onnx_cache`: where ONNX sessions keep their optimized models (--onnx-cache-dir)."""
        self._repository = repository
        self._catalogue = catalogue
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._budget = budget
        self._tracer = tracer
        self._batching_defaults = batching_defaults
        self._shared_intra_op_pool = shared_intra_op_pool
        self._onnx_cache = onnx_cache
        self._threads = make_execution_threads(execution_threads)
        self._names: tuple[float, frozenset[str]] = (float("-inf"), frozenset())
        self.startup_complete = False
        self._locks: dict[str, asyncio.Lock] = {}
        self._load_slots: asyncio.Semaphore | None = None
        self._poll_lock = asyncio.Lock()
        self._draining: set[asyncio.Task[None]] = set()
        self.scale_to_zero_defaults = scale_to_zero
        # The models at rest (their next request loads them), the on-demand load under way for
        # each (shared by its waiters), and how many requests wait for it.
        self._at_rest: dict[str, AtRest] = {}
        self._starting: dict[str, asyncio.Future[None]] = {}
        self._held: dict[str, int] = {}
        # How long each model's last load took (wall clock, all its versions).
        self._load_s: dict[str, float] = {}

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
        kept_dir: Path | None = None,
        cause: str = LOAD,
        resting: AtRest | None = None,
    ) -> None:
        """Load or reload `name`. `config` replaces its config.pbtxt; `files` (relative path ->
        bytes, e.g. "1/model.onnx") replace its folder; `if_not_loaded`: nothing to do when it
        serves already (an on-demand load that waited for another); `code_may_change`: False
        refuses a `config` that changes what code runs (`model_files.check_override`);
        `kept_dir`: the folder of files an earlier load was sent, kept while it rested; `cause`:
        what its phases are counted under; `resting`: the rest an on-demand load ends, nothing to
        do when the model left it meanwhile (loaded, or unloaded on purpose). Raises the
        InferdError that says why when the model is unknown or a version fails (what was serving
        keeps serving), PermissionDeniedError (nothing published) for a refused override."""
        chain = check_no_cycle(name)
        async with self._lock(name):
            if if_not_loaded and self._catalogue.serves(name):
                return
            if resting is not None and self._at_rest.get(name) is not resting:
                return
            if resting is None:  # asked (the API, a poll): it no longer rests, whatever comes of it
                self._at_rest.pop(name, None)
            started = time.monotonic()
            from_repository = not files and kept_dir is None
            fingerprint = await asyncio.to_thread(self._repository.fingerprint, name) if from_repository else None
            try:
                model = await asyncio.to_thread(
                    read_local_model, self._repository, name, config, files, fingerprint,
                    code_may_change=code_may_change, batching_defaults=self._batching_defaults, kept_dir=kept_dir,
                )  # fmt: skip
            except PermissionDeniedError:
                raise  # the caller's request was refused: the model is as it was
            except InferdError as exc:
                self._publish_failure(name, exc.message, fingerprint)
                logger.error("model %s failed to load: %s", name, exc.logged, extra={"model": name})
                raise
            if model.config.ensemble is None:
                await self._load_cleaning_up(name, model, started, cause)
                return
        # An ensemble: the models of its steps first, outside this model's lock (loading them
        # may wait for other loads, never for this one's).
        try:
            await load_steps(name, model.config, chain, self._load_if_not_loaded)
        except InferdError as exc:
            self._discard_files(name, model)
            self._publish_failure(name, exc.message, model.fingerprint)
            logger.error("model %s failed to load: %s", name, exc.logged, extra={"model": name})
            raise
        async with self._lock(name):
            if if_not_loaded and self._catalogue.serves(name):
                self._discard_files(name, model)
                return
            await self._load_cleaning_up(name, model, time.monotonic(), cause)

    async def _load_cleaning_up(self, name: str, model: LocalModel, started: float, cause: str) -> None:
        try:
            await self._load(name, model, started, cause)
        except BaseException:
            self._discard_files(name, model)
            raise

    def _discard_files(self, name: str, model: LocalModel) -> None:
        """Remove the folder a load that did not happen made, unless the model's record keeps it."""
        if model.owned_dir is not None and self._catalogue.owned_dir(name) != model.owned_dir:
            shutil.rmtree(model.owned_dir, ignore_errors=True)

    async def load_on_demand(self, name: str) -> None:
        """Load `name` when a request names it and it rests (scaled to zero, or evicted), or (under
        a budget) it is a model of the repository that is not loaded. Concurrent callers share the
        one load, and its failure: at most `max_held` of them wait, the next are refused
        (ModelNotReadyError, 503 with Retry-After). A failure stays in the model's record, which
        the request's answer reads; a model that rested still rests, and the next request tries
        again."""
        at_rest = self._at_rest.get(name)
        if (
            name not in self._starting
            and at_rest is None
            and (self._budget is None or not await self._loadable_on_demand(name))
        ):
            return
        limit = at_rest.max_held if at_rest is not None else self.scale_to_zero_defaults.max_held
        held = self._held.get(name, 0)
        if held >= limit:
            raise ModelNotReadyError(
                f"model '{name}' is starting (loading on demand) and {held} requests already wait for it, "
                f"as many as may (max_held {limit}); retry later",
                retry_after_s=self._retry_after_s(name),
            )
        self._held[name] = held + 1
        try:
            if self._budget is not None:
                self._metrics.on_demand_miss()
            try:  # a waiter that leaves does not stop the others' load
                await asyncio.shield(self._start_resting(name, at_rest))
            except InferdError as exc:  # each waiter its own copy: its answer carries its request id
                raise copied(exc) from None
        finally:  # the others may have come and gone meanwhile: one less, whatever the order
            left = self._held[name] - 1
            if left:
                self._held[name] = left
            else:
                del self._held[name]
        if self._budget is not None:
            self._budget.touch(name)

    def _start_resting(self, name: str, at_rest: AtRest | None) -> asyncio.Future[None]:
        """The on-demand load of `name` under way, or a new one."""
        starting = self._starting.get(name)
        if starting is None:
            starting = self._starting[name] = asyncio.ensure_future(self._load_resting(name, at_rest))
            starting.add_done_callback(functools.partial(self._started, name))
        return starting

    async def _load_resting(self, name: str, at_rest: AtRest | None) -> None:
        """The one on-demand load of `name`: as it was when it went to rest."""
        cause = COLD_START if at_rest is not None and at_rest.reason == SCALED_TO_ZERO else LOAD
        with contextlib.suppress(ModelLoadError):  # in its record, which each waiter's answer reads
            await self.load(
                name,
                if_not_loaded=True,
                config=at_rest.override if at_rest is not None else None,
                kept_dir=at_rest.kept_dir if at_rest is not None else None,
                cause=cause,
                resting=at_rest,
            )

    def _started(self, name: str, starting: asyncio.Future[None]) -> None:
        if self._starting.get(name) is starting:
            del self._starting[name]
        if not starting.cancelled():
            starting.exception()  # retrieved: each waiter raised it already, or none was left

    def _retry_after_s(self, name: str) -> float:
        """When a refused waiter may find the model loaded: its last load's length, at least 1 s."""
        return max(1.0, round(self._load_s.get(name, 1.0), 1))

    def at_rest(self, name: str) -> bool:
        """Whether `name` rests (scaled to zero or evicted) or is coming back from it: its next
        request loads it. Not once a load from rest failed: its record says why, as any failure's."""
        if name not in self._at_rest:
            return False
        record = self._catalogue.snapshot.models.get(name)
        return record is None or record.reason in AT_REST or record.state in (ModelState.LOADING, ModelState.UNLOADING)

    def resting(self) -> frozenset[str]:
        """The models `at_rest`, cold starts under way included."""
        return frozenset(name for name in self._at_rest if self.at_rest(name))

    def at_zero(self) -> list[str]:
        """The models scaled to zero now (a cold start under way included)."""
        return sorted(name for name, rest in self._at_rest.items() if rest.reason == SCALED_TO_ZERO)

    async def scale_to_zero(self, name: str, still_idle: Callable[[ModelRecord], bool]) -> bool:
        """Unload `name` because it is idle, when `still_idle(record)` still holds once its lock is
        taken (a request that came meanwhile keeps it): True when it was unloaded."""
        return await self._unload(name, SCALED_TO_ZERO, still_idle)

    async def unload(self, name: str, *, reason: str = UNLOADED, dependents: bool = False) -> None:
        """Stop serving `name`: requests already accepted finish, later ones are told it is unloaded.
        A model of the repository that is not loaded is left as it is. `dependents` (an ensemble):
        also unload the models its steps use that no other loaded ensemble uses."""
        used = step_models(self._catalogue.snapshot.models.get(name)) if dependents else ()
        await self._unload(name, reason)
        for step_model in used:
            if step_model not in models_used_by_ensembles(self._catalogue.snapshot.models.values()):
                await self.unload(step_model, reason=reason, dependents=True)

    async def _unload(self, name: str, reason: str, only_if: Callable[[ModelRecord], bool] | None = None) -> bool:
        """Unload `name` for `reason` (when `only_if(record)` holds under the lock): True when it was."""
        async with self._lock(name):
            record = self._catalogue.snapshot.models.get(name)
            if record is None:
                if await asyncio.to_thread(self._repository.has_model, name):
                    return False
                raise ModelNotFoundError(f"model '{name}' is not loaded or not in the repository")
            if only_if is not None and not only_if(record):
                return False
            handles = [v.handle for v in record.versions.values() if v.handle is not None]
            resting = reason in (SCALED_TO_ZERO, EVICTED)
            if resting:
                # At rest from now on, not once drained: a request meanwhile waits for the unload
                # and then loads it again, as it was (its override, the files its load sent).
                config = next((v.config for v in record.versions.values() if v.config is not None), None)
                defaults = self.scale_to_zero_defaults
                held = max_held(config.parameters, defaults.max_held) if config is not None else defaults.max_held
                self._at_rest[name] = AtRest(reason, held, record.override, record.owned_dir)
            else:
                self._at_rest.pop(name, None)
            self._catalogue.publish(
                replace(record, state=ModelState.UNLOADING, reason="", versions=MappingProxyType({}))
            )
            logger.info("model %s: unloading", name, extra={"model": name})
            await asyncio.gather(*(handle.drain() for handle in handles))
            if record.owned_dir is not None and not resting:
                shutil.rmtree(record.owned_dir, ignore_errors=True)
            await asyncio.to_thread(self._repository.release, name)
            if resting:  # the record keeps the override and the folder too (unload and close remove it)
                # A poll finds a model scaled to zero unchanged (its fingerprint) and leaves it there.
                fingerprint = record.fingerprint if reason == SCALED_TO_ZERO else None
                self._catalogue.publish(
                    ModelRecord(name, ModelState.FAILED, reason, MappingProxyType({}), fingerprint, record.owned_dir,
                                record.override)
                )  # fmt: skip
            else:
                self._catalogue.publish(ModelRecord(name=name, state=ModelState.FAILED, reason=reason))
            if reason == SCALED_TO_ZERO:
                self._metrics.model_scaled_to_zero(name)
            if self._budget is not None:
                self._budget.forget(name)
            if handles:  # a model at rest unloaded again was counted when it left
                self._metrics.model_unloaded(name)
            if reason != SCALED_TO_ZERO:  # the idle unloader says why, with the idle time
                logger.info("model %s: %s", name, reason, extra={"model": name})
            return True

    async def forget(self, name: str) -> None:
        """Unload `name` and drop its record (its folder left the repository)."""
        if name in self._catalogue.snapshot.models:
            with contextlib.suppress(ModelNotFoundError):  # forgotten meanwhile by another poll
                await self.unload(name)
            self._catalogue.drop(name)
        self._at_rest.pop(name, None)

    async def poll(self, only: frozenset[str] | None = None) -> None:
        """Bring the served models in line with the repository: load what was added or changed,
        forget what was removed. Models whose files did not change are not touched. `only`: look
        at these names alone (TF Serving's model config followed: its models, not the others').
        One poll at a time: the repository's poll, the model config's and a reload may overlap."""
        async with self._poll_lock:
            await self._poll(only)

    async def _poll(self, only: frozenset[str] | None) -> None:
        names, fingerprints = await asyncio.to_thread(self._scan, only)
        known = set(self._catalogue.snapshot.models) if only is None else set(self._catalogue.snapshot.models) & only
        for name in known - set(names):
            record = self._catalogue.snapshot.models.get(name)
            if record is not None and record.owned_dir is None:
                logger.info("model %s left the repository", name, extra={"model": name})
                await self.forget(name)
        # A model scaled to zero stays there: its next request loads the files as they are then.
        changed = [
            name
            for name in names
            if name not in self._at_rest
            and (
                (record := self._catalogue.snapshot.models.get(name)) is None
                or record.fingerprint != fingerprints.get(name)
            )
        ]
        if self._budget is not None:
            # Under a budget a model loads on its first request, not because it appeared; only
            # models serving now are reloaded when their files change.
            # A model that failed is forgotten when its files change, so its next request tries again.
            for name in changed:
                record = self._catalogue.snapshot.models.get(name)
                if record is not None and not record.versions and record.reason not in AT_REST:
                    self._catalogue.drop(name)
            changed = [
                name for name in changed if (r := self._catalogue.snapshot.models.get(name)) is not None and r.versions
            ]
        results = await asyncio.gather(*(self.load(name) for name in changed), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, InferdError):
                raise result

    async def close(self) -> None:
        """Drain every handle (shutdown), once the on-demand loads under way are done."""
        if self._starting:
            await asyncio.gather(*self._starting.values(), return_exceptions=True)
        for name in list(self._catalogue.snapshot.models):
            record = self._catalogue.snapshot.models[name]
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

    def _scan(self, only: frozenset[str] | None = None) -> tuple[list[str], dict[str, ModelFingerprint | None]]:
        names = [name for name in self._repository.model_names() if only is None or name in only]
        fingerprints: dict[str, ModelFingerprint | None] = {}
        for name in names:
            try:
                fingerprints[name] = self._repository.fingerprint(name)
            except (OSError, InferdError) as exc:
                # Changing under our feet (look again at the next poll), or in two repositories at
                # once: its load says why, and the other models are polled all the same.
                logger.warning("model %s not scanned: %s", name, exc, extra={"model": name})
                fingerprints[name] = None
        return names, fingerprints

    def _publish_failure(self, name: str, reason: str, fingerprint: ModelFingerprint | None) -> None:
        """A load that failed before any version: what serves keeps serving; else the model is UNAVAILABLE."""
        old = self._catalogue.snapshot.models.get(name)
        if old is not None and old.ready_versions():
            self._catalogue.publish(replace(old, reason=f"reloading failed: {reason}", fingerprint=fingerprint))
        else:
            # A model at rest keeps the folder of its files and its override (unload and close remove it).
            owned_dir, override = (old.owned_dir, old.override) if old is not None else (None, None)
            self._catalogue.publish(ModelRecord(name, ModelState.FAILED, reason, MappingProxyType({}), fingerprint,
                                                owned_dir, override))  # fmt: skip

    async def _load(self, name: str, model: LocalModel, started: float, cause: str) -> None:
        """Load `model`'s versions beside what serves, then switch to them; `started`: when this
        load began (monotonic), for its length; `cause`: what its phases count under."""
        old = self._catalogue.snapshot.models.get(name)
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
        fingerprint, owned_dir = (old.fingerprint, old.owned_dir) if old is not None else (None, None)
        override = old.override if old is not None else None
        self._catalogue.publish(
            ModelRecord(name, state, "", MappingProxyType(showing), fingerprint, owned_dir, override)
        )

        need = sum(model.memory_bytes.get(version, 0) for version in to_load)
        new_model = not any(v.handle is not None for v in old_versions.values())
        budget = self._budget if to_load else None
        if budget is not None:
            await budget.make_room(name, need, new_model, self._catalogue.records, self._changing, self._evict)
        try:
            loaded = await asyncio.gather(*(self._load_version(name, model, version, cause) for version in to_load))
        finally:
            if budget is not None:
                budget.release(need, new_model)
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
        self._catalogue.publish(
            ModelRecord(
                name, state, reason, MappingProxyType(versions), model.fingerprint, model.owned_dir, model.override
            )
        )
        if state is ModelState.READY:
            self._load_s[name] = seconds = time.monotonic() - started
            self._at_rest.pop(name, None)  # whatever loaded it: it serves
            if cause == COLD_START:
                _log_cold_start(name, seconds, [versions[v] for v in to_load if versions[v].state is ModelState.READY])
        # Traffic has moved: what no longer serves drains in the background.
        serving = {id(v.handle) for v in versions.values() if v.handle is not None}
        for replaced in old_versions.values():
            if replaced.handle is not None and id(replaced.handle) not in serving:
                self._drain_later(replaced.handle)
        if old is not None and old.owned_dir is not None and old.owned_dir != model.owned_dir:
            if any(id(v.handle) in serving for v in old_versions.values() if v.handle is not None):
                # A failed reload: the old versions serve on, from the old folder; the new goes.
                self._catalogue.publish(replace(self._catalogue.snapshot.models[name], owned_dir=old.owned_dir))
            else:
                shutil.rmtree(old.owned_dir, ignore_errors=True)
        if failures:
            raise ModelLoadError(f"model '{name}' failed to load: {'; '.join(failures)}")

    async def _load_version(self, name: str, model: LocalModel, version: int, cause: str) -> VersionRecord:
        if self._load_slots is None:
            self._load_slots = asyncio.Semaphore(LOAD_WORKERS)
        files = model.fingerprint.version(version) if model.fingerprint is not None else None
        if model.config.ensemble is not None:
            try:
                ensemble = ensemble_handle(
                    with_labels(model.config, model.model_dir),
                    version,
                    self._dispatcher.ready_handle,
                    self._dispatcher.infer,
                )
            except InferdError as exc:
                return self._version_failed(name, version, exc, model, files)
            self._metrics.version_loaded(name, LoadTimings(session_s=0.0, warmup_s=0.0), cause)
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
                    onnx_cache=self._onnx_cache,
                    caches_answers=self._dispatcher.response_cache is not None,
                )
                timings = replace(timings, fetch_s=model.fetch_s)
            except InferdError as exc:
                return self._version_failed(name, version, exc, model, files)
        self._metrics.version_loaded(name, timings, cause)
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

    async def _loadable_on_demand(self, name: str) -> bool:
        record = self._catalogue.snapshot.models.get(name)
        if record is not None:
            # A model that failed to load keeps its reason until its files change; only one that
            # was never loaded, unloaded or evicted loads on demand, or one loading now (its
            # load's lock is then waited for, not taken again).
            loading = record.state is ModelState.LOADING or self._lock(name).locked()
            return loading or (record.reason in AT_REST and not record.versions)
        now = time.monotonic()
        listed_at, names = self._names
        if now - listed_at > NAMES_TTL_S:
            names = frozenset(await asyncio.to_thread(self._repository.model_names))
            self._names = (now, names)
        return name in names

    def _drain_later(self, handle: Handle) -> None:
        task = asyncio.get_running_loop().create_task(handle.drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _load_if_not_loaded(self, name: str) -> None:
        """An ensemble's step model, loaded unless it serves; one at rest comes back as it was (the
        on-demand load, shared with the requests waiting for it)."""
        at_rest = self._at_rest.get(name)
        if at_rest is None:
            await self.load(name, if_not_loaded=True)
            return
        await asyncio.shield(self._start_resting(name, at_rest))
        if not self._catalogue.serves(name):
            record = self._catalogue.snapshot.models.get(name)
            raise ModelLoadError(f"model '{name}' failed to load: {record.reason if record else 'unknown'}")

    def _changing(self, name: str) -> bool:
        return self._lock(name).locked()

    async def _evict(self, name: str) -> None:
        self._metrics.model_evicted(name)
        await self.unload(name, reason=EVICTED)


def _log_cold_start(name: str, seconds: float, versions: list[VersionRecord]) -> None:
    """One line for a cold start, with each loaded version's phases."""
    phases = "; ".join(
        f"version {v.version}: fetch {v.timings.fetch_s:.3f} s, session {v.timings.session_s:.3f} s, "
        f"warm-up {v.timings.warmup_s:.3f} s"
        for v in versions
        if v.timings is not None
    )
    logger.info(
        "model %s: cold start in %.3f s (%s)",
        name,
        seconds,
        phases or "no phases",
        extra={"model": name, "cold_start_s": round(seconds, 6)},
    )

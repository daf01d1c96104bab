"""`ModelRegistry`: the server's models, in parts, behind one object the composition root holds.

It makes and wires the parts, each with one job: the `Catalogue` (core.catalogue: the records and
the request lookup table, an immutable snapshot), the `ModelLifecycle` (core.lifecycle: load, hot
swap, drain, unload, poll, close), the `MemoryBudget` when models load on demand (core.budget) and
the `Dispatcher` (core.dispatcher: the one way a request finds its handle, counted), which the
service and ensembles' steps call. What it answers itself are the questions about records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from inferd.config.batching import BatchingDefaults
from inferd.config.model import ModelConfig
from inferd.config.scale_to_zero import SCALE_TO_ZERO_OFF, ScaleToZeroDefaults
from inferd.core.budget import LoadBudget, MemoryBudget
from inferd.core.catalogue import UNLOADED, Catalogue, ModelRecord, ModelState, Snapshot, VersionRecord
from inferd.core.dispatcher import Dispatcher
from inferd.core.idle_unload import IdleUnloader
from inferd.core.lifecycle import ModelLifecycle
from inferd.core.metrics import Metrics
from inferd.core.repository import ModelRepository
from inferd.core.response_cache import ResponseCache
from inferd.core.statistics import ServingStatistics
from inferd.core.tracing import RequestTracer
from inferd.runtimes.onnx_cache import OptimizedModelCache

__all__ = ["UNLOADED", "LoadBudget", "ModelRecord", "ModelRegistry", "ModelState", "Snapshot", "VersionRecord"]


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
        scale_to_zero: ScaleToZeroDefaults = SCALE_TO_ZERO_OFF,
        onnx_cache: OptimizedModelCache | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        """`metrics`: where requests, executions and loads are counted (a `ServingStatistics` of
        its own when not given; the service reads the same); `budget`: turns on on-demand loading;
        `execution_threads`: the worker threads every loaded model shares (0: the default);
        `shared_intra_op_pool`: whether sessions compute on one pool (see core.executor);
        `batching_defaults`: settings every batching model takes (--tfserving-batching-parameters);
        `tracer`: hears of every request and every loaded version's executions when the server traces;
        `scale_to_zero`: the server's defaults of idle unloading and cold starts (core.idle_unload);
        `onnx_cache`: where ONNX sessions keep their optimized models (runtimes.onnx_cache);
        `response_cache`: keeps the answers of models whose config enables it (core.response_cache).
        Models load on a request's demand under a budget, and when they were scaled to zero."""
        self._repository = repository
        self._budget = budget
        self.metrics: Metrics = metrics if metrics is not None else ServingStatistics()
        self.catalogue = Catalogue()
        memory = MemoryBudget(budget) if budget is not None else None
        self.dispatcher = Dispatcher(
            self.catalogue,
            self.metrics,
            tracer,
            budget=memory,
            load_on_demand=self._load_on_demand,
            resting=self._resting,
            response_cache=response_cache,
        )
        self._lifecycle = ModelLifecycle(
            repository,
            self.catalogue,
            self.dispatcher,
            self.metrics,
            memory,
            execution_threads,
            shared_intra_op_pool=shared_intra_op_pool,
            batching_defaults=batching_defaults,
            tracer=tracer,
            scale_to_zero=scale_to_zero,
            onnx_cache=onnx_cache,
        )

    @property
    def repository(self) -> ModelRepository:
        return self._repository

    @property
    def budget(self) -> LoadBudget | None:
        return self._budget

    @property
    def snapshot(self) -> Snapshot:
        return self.catalogue.snapshot

    @property
    def startup_complete(self) -> bool:
        return self._lifecycle.startup_complete

    # -- the records (any thread) ------------------------------------------------------------------

    def records(self) -> Iterable[ModelRecord]:
        return self.catalogue.records()

    def record(self, name: str) -> ModelRecord:
        return self.catalogue.record(name)

    def version_record(self, name: str, version: str) -> VersionRecord:
        """The version asked for ("" = the default one), ready or not."""
        return self.catalogue.version_record(name, version)

    def all_ready(self) -> bool:
        """Every model loaded (or that failed to) is ready; unloaded ones, and ones at rest (a cold
        start under way included), do not count."""
        return self.catalogue.all_ready(self._lifecycle.resting())

    def at_zero(self) -> list[str]:
        """The models scaled to zero now (a cold start under way included)."""
        return self._lifecycle.at_zero()

    # -- changes (event loop) ----------------------------------------------------------------------

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load `names` (default: every model of the repository); see `ModelLifecycle.load_all`."""
        await self._lifecycle.load_all(names)

    async def load(
        self,
        name: str,
        *,
        config: ModelConfig | None = None,
        files: Mapping[str, bytes] = {},
        if_not_loaded: bool = False,
        code_may_change: bool = True,
    ) -> None:
        """Load or reload `name`; see `ModelLifecycle.load`."""
        await self._lifecycle.load(
            name, config=config, files=files, if_not_loaded=if_not_loaded, code_may_change=code_may_change
        )

    async def unload(self, name: str, *, reason: str = UNLOADED, dependents: bool = False) -> None:
        """Stop serving `name`; see `ModelLifecycle.unload`."""
        await self._lifecycle.unload(name, reason=reason, dependents=dependents)

    async def forget(self, name: str) -> None:
        """Unload `name` and drop its record (its folder left the repository)."""
        await self._lifecycle.forget(name)

    async def poll(self, only: frozenset[str] | None = None) -> None:
        """Bring the served models in line with the repository; see `ModelLifecycle.poll`."""
        await self._lifecycle.poll(only)

    def idle_unloader(self, backlog: Callable[[], list[str]] = list) -> IdleUnloader:
        """What scales idle models to zero (its `run` is the server's task); `backlog`: the models
        async jobs wait for now, which keeps them loaded."""
        return IdleUnloader(
            lambda: self.catalogue.snapshot,
            self._lifecycle.scale_to_zero,
            self._lifecycle.scale_to_zero_defaults.idle_unload_s,
            backlog,
        )

    async def close(self) -> None:
        """Drain every handle (shutdown)."""
        await self._lifecycle.close()

    def _resting(self, name: str) -> bool:
        return self._lifecycle.at_rest(name)

    async def _load_on_demand(self, name: str) -> None:
        # The dispatcher is made before the lifecycle it asks (the lifecycle gives it to ensembles).
        await self._lifecycle.load_on_demand(name)

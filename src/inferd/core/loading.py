"""`load_version()`: from a model's config and a local version folder to a ready `ModelHandle`.

The one way a version becomes servable, whoever asks (startup, polling, the repository API, a hot
swap): instances are created, the config completed from the model file, warm-up run on every
instance, the model timed to choose where it runs, and a batcher made when the config asks.
Blocking (file reading, graph optimization, warm-up): run it on a worker thread. A failure raises
the InferdError that says why, and whatever was created is closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from pathlib import Path

from inferd.config.loader import complete_config
from inferd.config.model import InstanceGroup, ModelConfig
from inferd.core.batcher import DynamicBatcher
from inferd.core.classification import with_labels
from inferd.core.executor import InstancePool, intra_op_threads_per_instance
from inferd.core.handle import ModelHandle
from inferd.core.metrics import Metrics
from inferd.core.response_cache import Identity, file_identities, version_files, version_fingerprint, version_key
from inferd.core.scheduler import DirectScheduler, Scheduler
from inferd.core.sequence import SequenceBatcher
from inferd.core.tracing import ExecutionTracer, RequestTracer
from inferd.core.warmup import probe_inputs, run_warmup
from inferd.errors import InferdError, ModelLoadError
from inferd.runtimes import Runtime, RuntimeOptions, load_runtime, runtime_kind
from inferd.runtimes.onnx_cache import OptimizedModelCache
from inferd.types import LoadTimings

logger = logging.getLogger("inferd.loading")


def load_version(
    config: ModelConfig,
    version: int,
    version_dir: Path,
    model_dir: Path,
    metrics: Metrics,
    threads: Executor | None = None,
    *,
    shared_intra_op_pool: bool = True,
    event_loop: asyncio.AbstractEventLoop | None = None,
    tracer: RequestTracer | None = None,
    onnx_cache: OptimizedModelCache | None = None,
    caches_answers: bool = False,
) -> tuple[ModelHandle, LoadTimings]:
    """`model_dir` holds the version's `warmup/` data files; `threads` are the server's worker
    threads and `shared_intra_op_pool` says where sessions compute (see core.executor);
    `event_loop` is the server's, where async models run their coroutines; `tracer` hears of the
    version's executions when the server traces; `onnx_cache` keeps ONNX sessions' optimized models;
    `caches_answers`: the server has a response cache, which a config's response_cache then uses (and
    an ensemble's with this model a step)."""
    instances: list[Runtime] = []
    pool: InstancePool | None = None
    started = time.perf_counter()
    content_key, identities = None, None
    # Its answers, and those of the ensembles it is a step of, are kept under what it runs: its
    # files (read first) and config. A model whose answers are not a function of one request (its
    # state's, another server's) has no key, so no ensemble of it caches either.
    if caches_answers and not (config.sequence_batching is not None or config.decoupled or config.backend == "remote"):
        try:
            identities = file_identities(version_files(version_dir, model_dir))
            content_key = version_key(config.name, version, version_fingerprint(config, version_dir, model_dir))
        except OSError as exc:  # a file removed while it was read
            if config.response_cache:
                raise ModelLoadError(f"model '{config.name}' version {version}: cannot read its files: {exc}") from exc
            identities = None  # a model that does not cache itself loads as without a cache
    elif config.response_cache and not caches_answers:
        logger.warning(
            "model %s enables response_cache, but the server has no cache (--cache-config): its answers are not kept",
            config.name, extra={"model": config.name, "version": version},
        )  # fmt: skip
    try:
        groups = config.instance_groups or (InstanceGroup(),)
        intra_op_threads = intra_op_threads_per_instance(sum(g.count for g in groups), shared=shared_intra_op_pool)
        for group in groups:
            for _ in range(group.count):
                options = RuntimeOptions(group, intra_op_threads, event_loop, onnx_cache)
                instances.append(load_runtime(config, version_dir, options))
        kind = runtime_kind(config, version_dir)
        completed = complete_config(config, instances[0].signature, platform=kind.platform, backend=kind.backend)
        completed = with_labels(completed, model_dir)
        label = str(version)
        pool = InstancePool(
            instances,
            name=config.name,
            threads=threads,
            on_execute=lambda rows, infer_s: metrics.batch_executed(config.name, label, rows, infer_s),
        )
        sessions_ready = time.perf_counter()
        # Warm-up runs before the version is ready, outside the metrics (it is not traffic).
        run_warmup(completed, pool, model_dir)
        # A stateful model is never run outside a sequence (a probe would disturb its state).
        execute_s = _calibrate(completed, pool) if completed.sequence_batching is None else 0.0
    except BaseException:
        if pool is not None:
            pool.close()
        else:
            for instance in instances:
                instance.close()
        raise
    timings = LoadTimings(session_s=sessions_ready - started, warmup_s=time.perf_counter() - sessions_ready)
    executions = tracer.executions(config.name, version) if tracer is not None else None
    scheduler = _scheduler(completed, pool, executions)
    logger.info(
        "model %s version %d loaded in %.0f ms (sessions %.0f ms, warm-up %.0f ms): %d instance(s), %s, "
        "max_batch_size %d, dynamic batching %s, %s, %.0f us per execution",
        config.name,
        version,
        (timings.session_s + timings.warmup_s) * 1e3,
        timings.session_s * 1e3,
        timings.warmup_s * 1e3,
        len(instances),
        "the shared intra-op pool" if intra_op_threads is None else f"{intra_op_threads} intra-op thread(s) each",
        completed.max_batch_size,
        "on" if isinstance(scheduler, DynamicBatcher) else "off",
        "inline on the event loop" if pool.runs_inline else "on worker threads",
        execute_s * 1e6,
        extra={"model": config.name, "version": version},
    )
    if identities is not None and _changed(identities, version_dir, model_dir):
        # Files changed between the fingerprint and the runtime's reading: which ones it read is
        # unknown, so its answers are kept under no key (a later load fingerprints them again).
        logger.warning(
            "model %s version %d: its files changed while it loaded: its answers are not cached until it loads again",
            config.name, version, extra={"model": config.name, "version": version},
        )  # fmt: skip
        content_key = None
    handle = ModelHandle(config=completed, version=version, pool=pool, scheduler=scheduler, content_key=content_key)
    return handle, timings


def _changed(identities: list[Identity], version_dir: Path, model_dir: Path) -> bool:
    try:
        return file_identities(version_files(version_dir, model_dir)) != identities
    except OSError:
        return True


def _scheduler(config: ModelConfig, pool: InstancePool, tracer: ExecutionTracer | None) -> Scheduler:
    """The one scheduler a version's requests go through, chosen here, once."""
    if config.sequence_batching is not None:
        return SequenceBatcher(config, pool, tracer=tracer)
    if config.dynamic_batching is not None and config.max_batch_size > 0:
        return DynamicBatcher(
            config.name, pool, max_batch_size=config.max_batch_size, config=config.dynamic_batching, tracer=tracer
        )
    return DirectScheduler(config.name, pool, batched=config.max_batch_size > 0, tracer=tracer)


def _calibrate(config: ModelConfig, pool: InstancePool) -> float:
    """Where the model runs (inline or on threads); a model the probe cannot feed uses threads."""
    try:
        names = [t.name for t in config.outputs]
        return pool.calibrate(probe_inputs(config), names, max_rows=max(1, config.max_batch_size))
    except InferdError as exc:
        logger.info("model %s: not timed (%s); it runs on worker threads", config.name, exc.message)
        return 0.0

"""The composition root: settings → repository, registry, service, and the three listeners.

All wiring happens here and nowhere else; nothing runs at import time.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import signal
import socket
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from inferd.config.scale_to_zero import ScaleToZeroDefaults
from inferd.config.served_models import DEFAULT_MODEL_NAME, ServedModel
from inferd.config.server import HttpServerKind, IntraOpPools, ModelControlMode, ServerSettings
from inferd.config.tracing import EXTRA, TracingSettings
from inferd.core.async_inference import AsyncInference
from inferd.core.endpoint_control import EndpointControl
from inferd.core.endpoints import Endpoints
from inferd.core.model_files import UPLOAD_FLAG
from inferd.core.registry import LoadBudget, ModelRegistry
from inferd.core.repository import LinkedModels, ServedModels, open_repositories
from inferd.core.request_window import TRIM_INTERVAL_S
from inferd.core.response_cache import ResponseCache
from inferd.core.service import InferenceService
from inferd.core.state_dir import StateDir
from inferd.core.statistics import ServingStatistics
from inferd.errors import InferdError, PermissionDeniedError, UnsupportedError
from inferd.protocol.tfserving_batching import read_batching_parameters
from inferd.protocol.tfserving_model_config import read_model_config_file
from inferd.runtimes.base import keep_large_blocks_off_the_heap
from inferd.runtimes.onnx_cache import default_folder, open_cache
from inferd.server.async_api import AsyncApi
from inferd.server.async_setup import AsyncSettingsError, build_async_inference
from inferd.server.auth import Access, AccessPolicy, is_loopback_host, read_tokens
from inferd.server.decoded_bytes import DecodedBytesBudget
from inferd.server.endpoint_file import EndpointFileError, apply_endpoint_file, follow_endpoint_file
from inferd.server.fleet_metrics import metrics_source
from inferd.server.grpc import TokenInterceptor, build_grpc_server, new_grpc_server
from inferd.server.http import HttpApp
from inferd.server.http11 import BodySpool, HttpLimits, HttpServer
from inferd.server.inference_call import CallTracing, InferenceCall
from inferd.server.kserve import KServeDoor
from inferd.server.logging import configure_logging
from inferd.server.openai import OpenAiDoor
from inferd.server.openapi import document_bytes, management_document_bytes
from inferd.server.prometheus import serve_metrics
from inferd.server.rollout_webhooks import RolloutWebhooks, parse_webhooks
from inferd.server.routes import Router
from inferd.server.sagemaker import SageMakerDoor
from inferd.server.shared_memory import SharedMemoryRegions
from inferd.server.tfserving import TfServingDoor
from inferd.server.tfserving_grpc import add_tfserving_servicers
from inferd.server.tls import TlsFiles
from inferd.server.torchserve import TorchServeDoor

if TYPE_CHECKING:  # imported when the server traces or serves on granian, and only then
    from inferd.server.rsgi import GranianServer
    from inferd.server.tracing import Tracing

logger = logging.getLogger("inferd.server")


def run(settings: ServerSettings) -> None:
    """Serve until SIGTERM/SIGINT, then finish in-flight requests and exit."""
    configure_logging(settings.log_format, settings.log_level)
    # A JSON number past a float type's range becomes ±inf, as a C cast (and Triton) makes it;
    # the decoders' fast path lets numpy cast without np.errstate (a microsecond a request), so
    # numpy's warning about it is the server's to silence, not a line in its log.
    warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
    keep_large_blocks_off_the_heap()
    try:
        import uvloop

        uvloop.run(serve(settings))
    except ImportError:  # pragma: no cover - uvloop is a dependency, but not on every platform
        asyncio.run(serve(settings))
    except (UnsafeSettingsError, EndpointFileError, AsyncSettingsError) as exc:
        logger.error("not starting: %s", exc)
        raise SystemExit(2) from None


async def serve(settings: ServerSettings) -> None:
    cache_dir = Path(tempfile.mkdtemp(prefix="inferd-cache-"))
    tracing = start_tracing(settings.tracing) if settings.tracing is not None else None
    try:
        await _serve(settings, cache_dir, tracing)
    finally:
        if tracing is not None:
            await asyncio.to_thread(tracing.shutdown)  # the spans still queued are exported first
        shutil.rmtree(cache_dir, ignore_errors=True)


def _backlog_models(service: InferenceService, jobs: AsyncInference | None) -> Callable[[], list[str]]:
    """The models async jobs wait for now (an endpoint's: its variants'), which stay loaded."""

    def models() -> list[str]:
        names = []
        for entry in jobs.backlog if jobs is not None else ():
            endpoint = service.endpoints.endpoints.get(entry.model)
            names += [v.model for v in endpoint.spec.variants] if endpoint is not None else [entry.model]
        return names

    return models


def start_tracing(settings: TracingSettings) -> Tracing:
    """The server's tracer; imports OpenTelemetry (the `tracing` extra), which nothing else does."""
    try:
        from inferd.server.tracing import Tracing
    except ImportError as exc:
        raise RuntimeError(f"tracing needs OpenTelemetry ({exc}); install it with: pip install '{EXTRA}'") from exc
    return Tracing.start(settings)


async def _serve(settings: ServerSettings, cache_dir: Path, tracing: Tracing | None) -> None:
    """`cache_dir`: where files of remote repositories are fetched to; `tracing`: None when off."""
    linked = LinkedModels(max_models=settings.sagemaker_max_models) if settings.sagemaker else None
    served = await asyncio.to_thread(_served_models, settings, cache_dir)
    repository = open_repositories(settings.model_repository, cache_dir, linked, served)
    await asyncio.to_thread(repository.check)
    statistics = ServingStatistics()
    budget = None
    if settings.model_memory_budget_bytes is not None or settings.max_loaded_models is not None:
        budget = LoadBudget(
            memory_bytes=settings.model_memory_budget_bytes,
            max_models=settings.max_loaded_models,
            pinned=frozenset(name for name in settings.load_models if name != "*"),
        )
    batching_defaults = None
    if settings.tfserving_batching_parameters is not None:
        batching_defaults, mapping = read_batching_parameters(settings.tfserving_batching_parameters)
        for line in mapping:
            logger.info("TF Serving batching parameters: %s", line)
    registry = ModelRegistry(
        repository,
        statistics,
        budget,
        settings.execution_threads,
        shared_intra_op_pool=settings.intra_op_pools is IntraOpPools.SHARED,
        batching_defaults=batching_defaults,
        tracer=tracing,
        scale_to_zero=ScaleToZeroDefaults(settings.idle_unload_seconds, settings.max_held),
        onnx_cache=open_cache(
            Path(settings.onnx_cache_dir) if settings.onnx_cache_dir else default_folder(), settings.onnx_cache_bytes
        ),
        response_cache=ResponseCache(cache, statistics) if (cache := settings.response_cache) is not None else None,
    )
    service = InferenceService(
        registry,
        strict_readiness=settings.strict_readiness,
        statistics=statistics,
        model_control_mode=settings.model_control_mode,
        linked=linked,
        tracer=tracing,
        allow_model_upload=settings.allow_model_upload,
        limits=settings.request_limits,
        state=StateDir(Path(settings.state_dir)) if settings.state_dir else None,
    )
    # Not ready until the models load and the declared endpoints serve: a client (or a load
    # balancer) told "ready" must find them.
    service.starting = True
    service.endpoints.rollouts.webhook = RolloutWebhooks(parse_webhooks(settings.rollout_webhooks))
    service.endpoints.identify(f"{socket.gethostname()}:{settings.http_port}")
    if settings.rollout_controller is not None:
        figures = metrics_source(settings.rollout_controller, settings.rollout_scrape_interval_s)
        service.endpoints.judge_across_fleet(figures)
        logger.info(
            "rollout controller of the fleet sharing %s: judged from %s", settings.state_dir, figures.describe()
        )
    if settings.endpoints_file is None and (restored := service.endpoints.restore()):
        logger.info("endpoints restored from %s: %s", settings.state_dir, ", ".join(restored))

    access = access_policy(settings)
    logger.info("management: %s", check_management_exposure(settings, access))
    # Regions registered by local clients, read and written by the KServe doors (HTTP and gRPC).
    regions = SharedMemoryRegions(prefix=settings.shared_memory_prefix, max_regions=settings.max_shared_memory_regions)
    tls = tls_files(settings)
    call = inference_call(service, settings, tracing)
    jobs = build_async_inference(service, settings, tracing)
    router = build_router(service, settings, regions, access, call, jobs)
    # Tokens first: a call refused for its credentials makes no span (the call begins spans).
    interceptors: list[grpc.aio.ServerInterceptor] = [TokenInterceptor(access)] if access is not None else []
    http_app = HttpApp(router, max_request_bytes=settings.max_request_bytes, access=access)
    limits = HttpLimits(
        max_request_bytes=settings.max_request_bytes,
        keep_alive_s=settings.keep_alive_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        write_timeout_s=settings.write_timeout_s,
        max_connections=settings.max_connections,
        # Async submits' bodies go to disk as they arrive, beside the payloads they become.
        spool=BodySpool(Path(settings.state_dir) / "async" / "spool", settings.max_async_request_bytes)
        if jobs is not None and settings.state_dir is not None
        else None,
    )
    management_app = None
    if settings.torchserve_management_port is not None:
        management_app = HttpApp(
            build_management_router(service, settings, access),
            max_request_bytes=settings.max_request_bytes,
            access=access,
        )
    grpc_server = build_grpc_server(
        service,
        call,
        limits=settings.request_limits,
        max_message_bytes=settings.max_request_bytes,
        regions=regions,
        interceptors=interceptors,
        access=access,
    )
    _listen(grpc_server, f"{settings.host}:{settings.grpc_port}", tls)
    tfserving_server = None
    if settings.tfserving_grpc_port is not None:
        tfserving_server = new_grpc_server(settings.max_request_bytes, interceptors)

        async def reload_config(models: list[ServedModel]) -> None:  # HandleReloadConfigRequest
            if served is None:
                raise UnsupportedError(
                    "this server serves no TF Serving model config: start it with --model-config-file (or "
                    "--model-base-path) to reload one"
                )
            new = served.new_base_paths(models)
            if new and not settings.allow_model_upload:
                # A base path holds what the server then runs (a SavedModel's ops, a Python model's
                # code): one the operator did not give is a client's choice, as an upload is.
                raise PermissionDeniedError(
                    f"the config names base paths this server was not given ({', '.join(new)}), whose models it "
                    f"would run; start it with {UPLOAD_FLAG} to allow that (versions, labels and removals of the "
                    "models it serves need nothing)"
                )
            before = served.names()
            served.replace(models)
            await registry.poll(before | served.names())  # the config's models alone

        add_tfserving_servicers(service, call, settings.request_limits, tfserving_server, reload_config, access)
        _listen(tfserving_server, f"{settings.host}:{settings.tfserving_grpc_port}", tls)
    metrics_server = serve_metrics(
        statistics,
        service.model_states,
        service.load,
        service.model_memory,
        service.endpoints.endpoints.totals,
        (lambda: list(jobs.backlog)) if jobs is not None else list,
        settings.host,
        settings.metrics_port,
        budget_bytes=settings.model_memory_budget_bytes,
        tls=tls,
        at_zero=service.models_at_zero,
    )

    # Listeners come up before models load: liveness answers at once, readiness once loading is done.
    await grpc_server.start()
    if tfserving_server is not None:
        await tfserving_server.start()
        logger.info("TF Serving gRPC API on %s:%d", settings.host, settings.tfserving_grpc_port)
    http_server = await start_http_server(settings, http_app, limits, settings.http_port, tls)
    management_server = None
    if management_app is not None and settings.torchserve_management_port is not None:
        port = settings.torchserve_management_port
        management_server = await start_http_server(settings, management_app, limits, port, tls)
        logger.info("TorchServe management API on %s:%d", settings.host, settings.torchserve_management_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    logger.info(
        "listening: HTTP%s %s:%d, gRPC %s:%d, metrics %s:%d",
        "S (TLS on every port%s)" % (", clients need certificates" if settings.tls_client_ca else "") if tls else "",
        settings.host,
        settings.http_port,
        settings.host,
        settings.grpc_port,
        settings.host,
        settings.metrics_port,
    )

    mode = settings.model_control_mode
    if (mode is ModelControlMode.EXPLICIT or budget is not None) and "*" not in settings.load_models:
        # Under a budget the rest load on demand, on their first request. TF Serving's model config
        # names what serves: its models load whatever the mode (budget permitting), as TF Serving's do.
        config_models = sorted(served.names()) if served is not None and budget is None else []
        await registry.load_all(tuple(dict.fromkeys((*settings.load_models, *config_models))))
    else:
        await registry.load_all()
    ready = [f"{r.name} (versions {r.ready_versions()})" for r in registry.records() if r.ready_versions()]
    failed = [f"{r.name}: {r.reason}" for r in registry.records() if not r.ready_versions()]
    logger.info("models ready: %s", ", ".join(ready) or "none", extra={"ready": len(ready), "failed": len(failed)})
    if failed:
        logger.warning("models not ready: %s", "; ".join(failed))
    if settings.endpoints_file is not None:  # once the models serve: each endpoint is checked
        await apply_endpoint_file(service.endpoints, settings.endpoints_file)
        logger.info(
            "endpoints declared by %s: %s",
            settings.endpoints_file,
            ", ".join(service.endpoints.endpoints.by_name) or "none",
        )
    elif resumed := await service.endpoints.restore_rollouts():
        logger.info("rollouts resumed: %s", ", ".join(resumed))
    service.starting = False
    if jobs is not None:  # once the models serve: jobs run through them
        jobs.start()
    _freeze_startup_objects()

    poller = loop.create_task(_poll(registry, settings.repository_poll_s)) if mode is ModelControlMode.POLL else None
    # Scale to zero: a sweep a second at most, whether or not a model has an idle limit yet (one
    # loaded later may have).
    idle_unloader = loop.create_task(registry.idle_unloader(_backlog_models(service, jobs)).run())
    config_follower = None
    if served is not None and settings.model_config_file is not None and settings.model_config_file_poll_wait_s > 0:
        config_follower = loop.create_task(
            _follow_model_config(served, registry, settings.model_config_file, settings.model_config_file_poll_wait_s)
        )
    endpoint_follower = None
    if settings.endpoints_file is not None:
        endpoint_follower = loop.create_task(
            follow_endpoint_file(service.endpoints, settings.endpoints_file, settings.repository_poll_s)
        )
    elif settings.state_dir:  # replicas sharing the directory follow what any of them (or a controller) sets
        endpoint_follower = loop.create_task(_follow_state(service.endpoints, settings.repository_poll_s))
    # Endpoints' windows held to their bound: a success is recorded without a look at the size.
    window_trimmer = loop.create_task(_trim_windows(service.endpoints.endpoints))
    await stop.wait()
    for task in (poller, endpoint_follower, idle_unloader, config_follower, window_trimmer):
        if task is not None:
            task.cancel()
    # An unload under way finishes before the registry closes (it would skip a half-unloaded model).
    await asyncio.gather(idle_unloader, return_exceptions=True)
    logger.info("shutting down: finishing in-flight requests (up to %.0f s)", settings.shutdown_timeout_s)
    service.shutting_down = True
    await asyncio.gather(
        http_server.shutdown(settings.shutdown_timeout_s),
        grpc_server.stop(grace=settings.shutdown_timeout_s),
        *([management_server.shutdown(settings.shutdown_timeout_s)] if management_server is not None else []),
        *([tfserving_server.stop(grace=settings.shutdown_timeout_s)] if tfserving_server is not None else []),
    )
    if jobs is not None:  # a job cut short runs again at the next start
        await jobs.stop()
    metrics_server.shutdown()
    regions.close()
    await service.endpoints.shadows.close()  # copies no client waits for
    await service.endpoints.rollouts.close()  # kept in the state directory: resumed at the next start
    await registry.close()
    if registry.dispatcher.response_cache is not None:
        await registry.dispatcher.response_cache.close()
    logger.info("stopped")


async def _trim_windows(endpoints: Endpoints) -> None:
    """Every endpoint variant's window held to its bound every TRIM_INTERVAL_S, until cancelled."""
    while True:
        await asyncio.sleep(TRIM_INTERVAL_S)
        try:
            endpoints.trim()
        except Exception:  # the trimmer must not end: the windows would grow unbounded
            logger.exception("the endpoints' request windows could not be trimmed")


async def _follow_state(control: EndpointControl, interval_s: float) -> None:
    """The state directory's endpoints, read again every `interval_s` when they changed (a stat
    a poll otherwise), and the rollouts of servers sharing it that are gone, taken up; until
    cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            problems = await control.follow_state()
            taken = await control.take_up_orphans()
        except Exception as exc:  # read again at the next poll: the follower must not end
            logger.warning("the state directory cannot be read now: %r", exc)
            continue
        for name, problem in problems.items():
            logger.warning("endpoint '%s' from the state directory is not served: %s", name, problem)
        if taken:
            logger.warning("rollouts of a server sharing the state directory that is gone, taken up: %s", taken)


def access_policy(settings: ServerSettings) -> AccessPolicy | None:
    """The tokens the server asks for, from the files named and INFERD_*_TOKENS; None if there are none."""
    management = read_tokens(settings.management_tokens_file, "INFERD_MANAGEMENT_TOKENS")
    data = read_tokens(settings.inference_tokens_file, "INFERD_INFERENCE_TOKENS")
    if management is None and data is None:
        return None
    logger.info(
        "tokens: %d for the management API, %s",
        len(management.digests) if management is not None else 0,
        f"{len(data.digests)} for the data plane" if data is not None else "the data plane open",
    )
    if settings.sagemaker:
        logger.warning(
            "--sagemaker: /invocations and the multi-model routes (/models...) take no tokens; the SageMaker "
            "platform calls them after authenticating its callers with IAM"
        )
    return AccessPolicy(management=management, data=data)


class UnsafeSettingsError(Exception):
    """Settings that would open the server to anyone who can reach it: the server does not start."""


def check_management_exposure(settings: ServerSettings, access: AccessPolicy | None) -> str:
    """Which management operations are open to whom, in one line for the startup log; raises
    UnsafeSettingsError for model upload without management tokens on a non-loopback address
    (anyone who reached the port could then run code as the server's user)."""
    management_tokens = access is not None and access.management is not None
    loopback_only = is_loopback_host(settings.host)
    if settings.allow_model_upload and not management_tokens and not loopback_only:
        raise UnsafeSettingsError(
            f"--allow-model-upload lets clients send code that the server runs, and --host {settings.host} is not "
            "a loopback address: give management tokens (--management-tokens-file or INFERD_MANAGEMENT_TOKENS), "
            "or listen on 127.0.0.1"
        )
    if management_tokens:
        who = "management-token holders"
    elif access is not None:
        who = "inference-token holders (no management tokens)"
    else:
        who = "any client (no tokens)" if loopback_only else f"any client that reaches {settings.host} (no tokens)"
    explicit = settings.model_control_mode is ModelControlMode.EXPLICIT
    upload = settings.allow_model_upload and explicit
    if management_tokens:
        local = "management-token holders"
    else:
        local = ("inference-token holders" if access is not None else "clients") + " on this host (loopback)"
    parts = [
        f"repository load/unload: {who}"
        if explicit
        else f"repository load/unload: off ({settings.model_control_mode.value} mode)",
        f"model upload and code-changing config overrides: {who if upload else 'refused (--allow-model-upload)'}",
        f"shared memory registration: {local}"
        + (f", objects named {settings.shared_memory_prefix}*" if settings.shared_memory_prefix else ""),
    ]
    if settings.sagemaker:
        parts.append(f"SageMaker POST /models: the platform (no tokens), from under {settings.sagemaker_model_root}")
    return "; ".join(parts)


async def start_http_server(
    settings: ServerSettings, app: HttpApp, limits: HttpLimits, port: int, tls: TlsFiles | None
) -> HttpServer | GranianServer:
    """`app` served on `port` by the server `settings.http_server` names."""
    if settings.http_server is HttpServerKind.GRANIAN:
        from inferd.server.rsgi import GranianServer

        granian = GranianServer(app, limits)
        await granian.start(settings.host, port, tls=tls)
        logger.warning("experimental: the REST edge on %s is served by granian", port)
        return granian
    server = HttpServer(app, limits)
    await server.start(settings.host, port, tls=tls.http_context() if tls is not None else None)
    return server


def tls_files(settings: ServerSettings) -> TlsFiles | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    client_ca = Path(settings.tls_client_ca) if settings.tls_client_ca is not None else None
    return TlsFiles(Path(settings.tls_cert), Path(settings.tls_key), client_ca)


def _listen(server: grpc.aio.Server, address: str, tls: TlsFiles | None) -> None:
    if tls is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, tls.grpc_credentials())


def inference_call(
    service: InferenceService, settings: ServerSettings, tracing: CallTracing | None = None
) -> InferenceCall:
    """The one inference call every door's inference goes through, with the server's limits (and
    its tracing, when on)."""
    decoded = DecodedBytesBudget(settings.max_decoded_bytes_in_flight, settings.max_compression_ratio)
    return InferenceCall(service, max_request_bytes=settings.max_request_bytes, decoded=decoded, tracing=tracing)


def build_router(
    service: InferenceService,
    settings: ServerSettings,
    regions: SharedMemoryRegions | None = None,
    access: AccessPolicy | None = None,
    call: InferenceCall | None = None,
    jobs: AsyncInference | None = None,
) -> Router:
    """Every REST door on the HTTP port, and its OpenAPI document (with the tokens `access` asks for).
    Each door's codecs hold requests to the server's limits, given here once. `jobs`: the server's
    async inference (None: its routes answer that it is off)."""
    call = call or inference_call(service, settings)
    limits = settings.request_limits
    async_api = AsyncApi(service, jobs)
    kserve = KServeDoor(service, call, regions, limits=limits, access=access, async_api=async_api)
    sagemaker = SageMakerDoor(
        service,
        call,
        regions,
        limits=limits,
        multi_model=settings.sagemaker,
        model_root=Path(settings.sagemaker_model_root),
        default_model=settings.sagemaker_default_model,
        async_api=async_api,
    )
    kserve_routes = kserve.routes()
    doors = [
        kserve_routes,
        TfServingDoor(service, call).routes(),
        OpenAiDoor(service, call, limits).routes(),
        sagemaker.routes(),
        TorchServeDoor(service, call, regions, limits=limits).inference_routes(),
    ]
    router = Router(doors, fallback=kserve_routes)
    kserve.openapi_document = document_bytes(
        sagemaker_multi_model=settings.sagemaker, access=route_access(router), policy=access
    )
    return router


def build_management_router(
    service: InferenceService, settings: ServerSettings, access: AccessPolicy | None = None
) -> Router:
    """The TorchServe management port's routes, its OpenAPI document at /api-description."""
    door = TorchServeDoor(service, limits=settings.request_limits)
    management = door.management_routes()
    router = Router([management], fallback=management)
    door.management_document = management_document_bytes(access=route_access(router), policy=access)
    return router


def route_access(router: Router) -> dict[tuple[str, str], Access]:
    """Each (METHOD, path pattern)'s access, as the route table says."""
    return {
        (method, route.pattern): route.access
        for group in router.groups
        for route in group.routes
        for method in route.methods
    }


def _freeze_startup_objects() -> None:
    """Keep what start-up made (modules, configs, sessions' wrappers) out of every later collection.

    A full collection walks every tracked object, and traffic triggers one about every second: with
    the imports and models of a server that took 12-15 ms each (on the loop's thread), the whole
    p99 tail of the tiny model at concurrency 32 (13 ms against the floor's 3.3). Frozen, a full
    collection walks only what was made since. Garbage first, so none of it is kept for good.
    Sessions frozen here are still freed on unload: nothing of a handle is held by a cycle.
    """
    gc.collect()
    gc.freeze()


def _served_models(settings: ServerSettings, cache_dir: Path) -> ServedModels | None:
    """TF Serving's models (--model-config-file, or --model-name with --model-base-path), or None."""
    if settings.model_config_file is not None:
        models = read_model_config_file(settings.model_config_file)
        logger.info("model config %s: %s", settings.model_config_file, ", ".join(m.name for m in models) or "no model")
        return ServedModels(models, cache_dir)
    if settings.model_base_path is not None:
        model = ServedModel(settings.model_name or DEFAULT_MODEL_NAME, settings.model_base_path)
        return ServedModels([model], cache_dir)
    return None


async def _follow_model_config(served: ServedModels, registry: ModelRegistry, location: str, interval_s: float) -> None:
    """TF Serving's --model_config_file_poll_wait_seconds: read the file again, serve what it says
    (a file that cannot be read or parsed leaves the models as they are, and says so)."""
    while True:
        await asyncio.sleep(interval_s)
        before = served.names()
        try:
            served.replace(await asyncio.to_thread(read_model_config_file, location))
        except InferdError as exc:
            logger.error("model config %s not followed: %s", location, exc.message)
            continue
        try:
            await registry.poll(before | served.names())  # the config's models alone
        except Exception:  # one failed scan must not end following
            logger.exception("following the model config %s failed; trying again in %.0f s", location, interval_s)


async def _poll(registry: ModelRegistry, interval_s: float) -> None:
    """Poll mode: follow the repository's changes until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await registry.poll()
        except Exception:  # one failed scan (a folder vanishing mid-listing) must not end polling
            logger.exception("polling the model repository failed; trying again in %.0f s", interval_s)

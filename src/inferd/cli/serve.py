"""`inferd serve`: serve a Triton-layout model repository."""

from __future__ import annotations

import os

import click
import pydantic
from click.core import ParameterSource

from inferd.config.scale_to_zero import DEFAULT_MAX_HELD
from inferd.config.server import (
    DEFAULT_MAX_COMPRESSION_RATIO,
    DEFAULT_MAX_DECODED_BYTES_IN_FLIGHT,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_ONNX_CACHE_BYTES,
    DEFAULT_SAGEMAKER_MAX_MODELS,
    HttpServerKind,
    IntraOpPools,
    LogFormat,
    ModelControlMode,
    ServerSettings,
)
from inferd.config.sizes import parse_size
from inferd.config.tracing import EXTRA, TracingSettings, missing_tracing_modules, tracing_settings
from inferd.limits import DEFAULT_MAX_REQUEST_ELEMENTS, DEFAULT_MAX_REQUEST_TEXT_BYTES, DEFAULT_MAX_RESPONSE_BYTES


class ByteSize(click.ParamType):  # type: ignore[type-arg]
    """A size such as 4GiB, 512MiB, 1.5GB or 1000000 (bytes)."""

    name = "size"

    def __init__(self, *, allow_zero: bool = False) -> None:
        self._allow_zero = allow_zero

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            asked = parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        size = int(asked)
        if self._allow_zero and (asked < 0 or (asked > 0 and size == 0)):
            self.fail(f"'{value}' must be 0 (off) or at least 1 byte", param, ctx)
        if not self._allow_zero and size <= 0:
            self.fail(f"'{value}' must be more than 0 bytes", param, ctx)
        return size


def _local_folders_exist(locations: tuple[str, ...]) -> tuple[str, ...]:
    """Local repositories are checked here, for a usage error; remote ones when the server reads them."""
    from pathlib import Path

    for location in locations:
        if "://" not in location or location.startswith("file://"):
            path = Path(location.removeprefix("file://"))
            if not path.is_dir():
                raise click.BadParameter(
                    f"folder '{path}' does not exist" if not path.exists() else f"'{path}' is not a folder"
                )
    return locations


@click.command()
@click.option(
    "--model-repository",
    "model_repository",
    multiple=True,
    envvar="INFERD_MODEL_REPOSITORY",
    callback=lambda _ctx, _param, value: _local_folders_exist(value),
    help="Repository in Triton's layout (<repo>/<model>/config.pbtxt, <repo>/<model>/<version>/model.onnx): "
    "a local folder or an fsspec URL such as s3://bucket/prefix (AWS credentials and AWS_ENDPOINT_URL "
    "as boto reads them). Repeatable: model names must be unique across repositories. Needed unless "
    "--model-config-file or --model-base-path names the models.",
)
@click.option(
    "--model-config-file",
    default=None,
    envvar="INFERD_MODEL_CONFIG_FILE",
    help="TF Serving's model config (--model_config_file: a model_config_list in protobuf's text format, a "
    "path or an fsspec URL): serve exactly the models it names, each from its base_path (a folder of version "
    "folders, local or s3://), with its model_version_policy and version_labels.",
)
@click.option(
    "--model-config-file-poll-wait-seconds",
    "model_config_file_poll_wait_s",
    default=0.0,
    type=click.FloatRange(min=0),
    envvar="INFERD_MODEL_CONFIG_FILE_POLL_WAIT_SECONDS",
    help="As TF Serving's: read --model-config-file again this often and follow it (models added, removed, "
    "their policies and labels changed); 0: read it once.",
)
@click.option(
    "--model-name",
    default=None,
    envvar="INFERD_MODEL_NAME",
    help="As TF Serving's: with --model-base-path, the name of the one model served from there (default: 'default').",
)
@click.option(
    "--model-base-path",
    default=None,
    envvar="INFERD_MODEL_BASE_PATH",
    help="As TF Serving's: serve one model from this folder of version folders (local or s3://), under --model-name.",
)
@click.option(
    "--host",
    default="0.0.0.0",
    show_default=True,
    envvar="INFERD_HOST",
    help="Address that the HTTP, gRPC and metrics listeners bind to.",
)
@click.option(
    "--http-port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    envvar="INFERD_HTTP_PORT",
    help="KServe v2 REST port (JSON and binary tensors).",
)
@click.option(
    "--grpc-port",
    default=8001,
    show_default=True,
    type=click.IntRange(0, 65535),
    envvar="INFERD_GRPC_PORT",
    help="KServe v2 gRPC port (inference.GRPCInferenceService).",
)
@click.option(
    "--metrics-port",
    default=8002,
    show_default=True,
    type=click.IntRange(0, 65535),
    envvar="INFERD_METRICS_PORT",
    help="Prometheus metrics port, served at /metrics.",
)
@click.option(
    "--model-control-mode",
    default="none",
    show_default=True,
    type=click.Choice([m.value for m in ModelControlMode]),
    envvar="INFERD_MODEL_CONTROL_MODE",
    help="none: load every model at startup, never change; poll: load every model, then follow the "
    "repository's changes; explicit: load the --load-model ones, then load and unload through the "
    "repository API (POST /v2/repository/models/NAME/load|unload).",
)
@click.option(
    "--repository-poll-secs",
    "repository_poll_s",
    default=15.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    envvar="INFERD_REPOSITORY_POLL_SECS",
    help="In poll mode, seconds between scans of the repository for added, changed and removed models.",
)
@click.option(
    "--load-model",
    "load_models",
    multiple=True,
    envvar="INFERD_LOAD_MODEL",
    help="In explicit mode, a model to load at startup (repeatable; '*' loads all of them).",
)
@click.option(
    "--model-memory-budget",
    "model_memory_budget_bytes",
    default=None,
    type=ByteSize(),
    envvar="INFERD_MODEL_MEMORY_BUDGET",
    help="Estimated memory the loaded models may hold, such as 4GiB or 512MiB. Turns on on-demand loading: "
    "a model loads on its first request, and the least recently used idle ones are evicted to make room.",
)
@click.option(
    "--max-loaded-models",
    default=None,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_LOADED_MODELS",
    help="Loaded models at most. Turns on on-demand loading with eviction, as --model-memory-budget does.",
)
@click.option(
    "--idle-unload-seconds",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    envvar="INFERD_IDLE_UNLOAD_SECONDS",
    help="Scale to zero: unload a model after this many seconds with nothing in flight, queued or waiting in an "
    "async backlog; its next request loads it again (a cold start). A model's idle_unload_seconds parameter "
    "overrides it (0: never). Off unless given.",
)
@click.option(
    "--max-held",
    default=DEFAULT_MAX_HELD,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_HELD",
    help="Requests that may wait for one model's cold start (an on-demand load) at once; the next get 503 "
    "with Retry-After. A model's max_held parameter overrides it.",
)
@click.option(
    "--log-format",
    default="json",
    show_default=True,
    type=click.Choice([f.value for f in LogFormat]),
    envvar="INFERD_LOG_FORMAT",
    help="json: one JSON object per line, with request ids; text: for humans.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    envvar="INFERD_LOG_LEVEL",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Least severe log level written.",
)
@click.option(
    "--max-request-bytes",
    default=DEFAULT_MAX_REQUEST_BYTES,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_REQUEST_BYTES",
    help="Largest HTTP request body or gRPC message accepted; larger ones get 413 / RESOURCE_EXHAUSTED.",
)
@click.option(
    "--max-request-elements",
    default=DEFAULT_MAX_REQUEST_ELEMENTS,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_REQUEST_ELEMENTS",
    help="Most elements one request's inputs hold together, at every door; more get 413 / RESOURCE_EXHAUSTED.",
)
@click.option(
    "--max-request-text-bytes",
    default=DEFAULT_MAX_REQUEST_TEXT_BYTES,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_REQUEST_TEXT_BYTES",
    help="Most bytes one request's BYTES elements (texts) hold, 4 counted for each element, at every door; "
    "more get 413 / RESOURCE_EXHAUSTED.",
)
@click.option(
    "--max-response-bytes",
    default=DEFAULT_MAX_RESPONSE_BYTES,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_RESPONSE_BYTES",
    help="Most bytes one answer's output tensors hold; a larger answer is refused with 413 / RESOURCE_EXHAUSTED.",
)
@click.option(
    "--max-decoded-bytes-in-flight",
    default=DEFAULT_MAX_DECODED_BYTES_IN_FLIGHT,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_DECODED_BYTES_IN_FLIGHT",
    help="HTTP: bytes all compressed request bodies in progress may inflate to together; past it, 503 to retry.",
)
@click.option(
    "--max-compression-ratio",
    default=DEFAULT_MAX_COMPRESSION_RATIO,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_COMPRESSION_RATIO",
    help="HTTP: a compressed request body may inflate to this many times its size at most; more gets 413.",
)
@click.option(
    "--strict-readiness/--no-strict-readiness",
    default=False,
    show_default=True,
    envvar="INFERD_STRICT_READINESS",
    help="Report /v2/health/ready only when every model is ready (else: once startup loading is done).",
)
@click.option(
    "--shutdown-timeout",
    "shutdown_timeout_s",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    envvar="INFERD_SHUTDOWN_TIMEOUT",
    help="Seconds SIGTERM waits for in-flight requests before closing.",
)
@click.option(
    "--keep-alive-timeout",
    "keep_alive_timeout_s",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    envvar="INFERD_KEEP_ALIVE_TIMEOUT",
    help="Seconds an idle HTTP keep-alive connection stays open.",
)
@click.option(
    "--read-timeout",
    "read_timeout_s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    envvar="INFERD_READ_TIMEOUT",
    help="Seconds an HTTP request head may take from its first byte; a body must then arrive at 1 KiB/s "
    "or more on average. Slower requests get 408 and their connection is closed.",
)
@click.option(
    "--write-timeout",
    "write_timeout_s",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    envvar="INFERD_WRITE_TIMEOUT",
    help="Seconds an HTTP client may leave its response unread before it is disconnected.",
)
@click.option(
    "--max-connections",
    default=4096,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_CONNECTIONS",
    help="Open HTTP connections at most; one more is answered 503 with Retry-After and closed.",
)
@click.option(
    "--http-server",
    default=HttpServerKind.INFERD.value,
    type=click.Choice([k.value for k in HttpServerKind]),
    envvar="INFERD_HTTP_SERVER",
    hidden=True,
    help="Experimental: the server of the REST edge, inferd's own or granian's embedded one (pip install granian).",
)
@click.option(
    "--intra-op-pools",
    type=click.Choice([p.value for p in IntraOpPools]),
    default=IntraOpPools.SHARED.value,
    show_default=True,
    envvar="INFERD_INTRA_OP_POOLS",
    help="ONNX Runtime's threads within one execution: one pool sized to the cores that every model "
    "shares (threads do not grow with models), or a pool per instance of cores / instances threads "
    "(a model's intra_op_thread_count and allow_spinning parameters then apply).",
)
@click.option(
    "--onnx-cache-dir",
    default=None,
    type=click.Path(file_okay=False),
    envvar="INFERD_ONNX_CACHE_DIR",
    help="Where ONNX models' optimized graphs are kept after their first load, with their weights in a file of "
    "their own that later loads map instead of reading (MiniLM's session: about 3x faster). Made if missing, "
    "private to this user. [default: $XDG_CACHE_HOME/inferd/onnx, else ~/.cache/inferd/onnx]",
)
@click.option(
    "--onnx-cache-size",
    "onnx_cache_bytes",
    default=f"{DEFAULT_ONNX_CACHE_BYTES >> 30}GiB",
    show_default=True,
    type=ByteSize(allow_zero=True),
    envvar="INFERD_ONNX_CACHE_SIZE",
    help="Disk the optimized-model cache may take, such as 10GiB; the least recently loaded entries go past it. "
    "0 turns the cache off.",
)
@click.option(
    "--cache-config",
    "cache_config",
    multiple=True,
    envvar="INFERD_CACHE_CONFIG",
    help="The response cache, as Triton's flag: local,size=BYTES (such as 256MiB) with an optional ttl_s=SECONDS, "
    "and/or redis,url=redis://host:6379/0 (optional ttl_s=, timeout_ms=) shared by the servers naming it (the "
    "local tier in front). Models whose config.pbtxt says response_cache { enable: true } then answer identical "
    "requests from it (Inferd-Cache: hit); other models never use it. Off unless given.",
)
@click.option(
    "--execution-threads",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    envvar="INFERD_EXECUTION_THREADS",
    help="Worker threads every model shares for executions too slow to run on the event loop "
    "(0: 4 per core, at least 16). They do not grow with the number of models.",
)
@click.option(
    "--tfserving-grpc-port",
    default=None,
    type=click.IntRange(1, 65535),
    envvar="INFERD_TFSERVING_GRPC_PORT",
    help="Serve TF Serving's gRPC API (tensorflow.serving.PredictionService Predict and GetModelMetadata, "
    "ModelService GetModelStatus) on this port (TF Serving uses 8500). Off unless given; TF Serving's REST "
    "API (/v1/models/...) is on the HTTP port in every mode.",
)
@click.option(
    "--tfserving-batching-parameters",
    default=None,
    envvar="INFERD_TFSERVING_BATCHING_PARAMETERS",
    help="A TF Serving batching_parameters file (max_batch_size, batch_timeout_micros, max_enqueued_batches, "
    "num_batch_threads, allowed_batch_sizes), a path or an fsspec URL such as s3://...: its settings apply to "
    "every model that batches, mapped onto dynamic batching and instances as the log says.",
)
@click.option(
    "--torchserve-management-port",
    default=None,
    type=click.IntRange(1, 65535),
    envvar="INFERD_TORCHSERVE_MANAGEMENT_PORT",
    help="Serve TorchServe's management API (GET /models, GET /models/NAME) on this port (TorchServe "
    "uses 8081). Off unless given; TorchServe's /predictions/NAME is on the HTTP port in every mode.",
)
@click.option(
    "--sagemaker",
    is_flag=True,
    default=False,
    envvar="INFERD_SAGEMAKER",
    help="Run as a SageMaker container: HTTP on SAGEMAKER_BIND_TO_PORT, else on --http-port when given, else "
    "on 8080; the gRPC and metrics ports moved into SAGEMAKER_SAFE_PORT_RANGE when it is set, the "
    "multi-model endpoint routes (/models, /models/NAME/invoke) and /endpoints/NAME/invocations (boto3's "
    "path, for local testing). "
    "/ping and /invocations are served in every mode.",
)
@click.option(
    "--sagemaker-model-root",
    default="/opt/ml/models",
    show_default=True,
    envvar="INFERD_SAGEMAKER_MODEL_ROOT",
    help="With --sagemaker: the folder the 'url' of every POST /models must lie under.",
)
@click.option(
    "--sagemaker-max-models",
    default=DEFAULT_SAGEMAKER_MAX_MODELS,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_SAGEMAKER_MAX_MODELS",
    help="With --sagemaker: models POST /models may have loaded at once; one more is answered 507, "
    "as SageMaker's multi-model contract asks (the platform then unloads one and retries).",
)
@click.option(
    "--tls-cert",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    envvar="INFERD_TLS_CERT",
    help="A PEM certificate (chain): every port (HTTP, gRPC, TF Serving gRPC, TorchServe management, metrics) "
    "serves TLS with it and --tls-key. TLS 1.2 at least; HTTP/1.1 only.",
)
@click.option(
    "--tls-key",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    envvar="INFERD_TLS_KEY",
    help="The PEM private key of --tls-cert.",
)
@click.option(
    "--tls-client-ca",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    envvar="INFERD_TLS_CLIENT_CA",
    help="Mutual TLS: a PEM CA bundle; every client must present a certificate it signed, on every port.",
)
@click.option(
    "--management-tokens-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    envvar="INFERD_MANAGEMENT_TOKENS_FILE",
    help="Bearer tokens (one a line, # comments) that the management API (repository load/unload, shared-memory "
    "registration) asks for, as 'Authorization: Bearer TOKEN' over HTTP and gRPC metadata; INFERD_MANAGEMENT_TOKENS "
    "(comma-separated) adds more. Open without either.",
)
@click.option(
    "--inference-tokens-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    envvar="INFERD_INFERENCE_TOKENS_FILE",
    help="Bearer tokens that inference and every other data-plane route ask for (health stays open; management "
    "tokens are accepted too); INFERD_INFERENCE_TOKENS adds more. Open without either.",
)
@click.option(
    "--rollout-webhook",
    "rollout_webhooks",
    multiple=True,
    envvar="INFERD_ROLLOUT_WEBHOOKS",
    help="NAME=URL (repeatable): an outside alarm a rollout may ask at each step by name (POSTed the step's "
    'figures, it answers {"pass": true|false, "reason": ...}; no answer is a no). Only these URLs are ever called.',
)
@click.option(
    "--rollout-controller",
    default=None,
    envvar="INFERD_ROLLOUT_CONTROLLER",
    help="prometheus=URL or scrape=HOST:PORT,HOST:PORT,...: this server is its fleet's rollout controller; the "
    "rollouts its API starts are judged on every replica's traffic (PromQL, or the replicas' own /metrics summed) "
    "and write the weights of the --state-dir the replicas share. One server a fleet.",
)
@click.option(
    "--rollout-scrape-interval",
    "rollout_scrape_interval_s",
    default=15.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    envvar="INFERD_ROLLOUT_SCRAPE_INTERVAL",
    help="With --rollout-controller prometheus=URL: seconds between its scrapes (PromQL ranges are at least 4).",
)
@click.option(
    "--endpoints",
    "endpoints_file",
    default=None,
    envvar="INFERD_ENDPOINTS",
    help="A YAML file (a path, or an fsspec URL such as s3://bucket/endpoints.yaml) that declares the endpoints, "
    "read once the models serve and again every --repository-poll-secs; the endpoints API then changes none.",
)
@click.option(
    "--state-dir",
    default=None,
    type=click.Path(file_okay=False),
    envvar="INFERD_STATE_DIR",
    help="A folder where what is set through the API (endpoints, async inference jobs) is kept, so it survives a "
    "restart or a crash; made if missing. Without it, endpoints last as long as the process, and async inference "
    "is off.",
)
@click.option(
    "--async-output-path",
    default=None,
    envvar="INFERD_ASYNC_OUTPUT_PATH",
    help="Where async inference results are written, as ID.out: a folder or an s3:// prefix (default "
    "STATE_DIR/async/results). Chosen here, never by a caller.",
)
@click.option(
    "--async-failure-path",
    default=None,
    envvar="INFERD_ASYNC_FAILURE_PATH",
    help="Where failed async jobs' documents are written, as ID-error.out (default: the output path).",
)
@click.option(
    "--async-payload-path",
    default=None,
    envvar="INFERD_ASYNC_PAYLOAD_PATH",
    help="Where inline async request bodies are kept for their job (default STATE_DIR/async/payloads).",
)
@click.option(
    "--async-input-root",
    "async_input_roots",
    multiple=True,
    envvar="INFERD_ASYNC_INPUT_ROOTS",
    help="A folder or s3:// prefix (repeatable) that an async submit's input_location may lie under; any other "
    "location is refused (403). None: only inline bodies.",
)
@click.option(
    "--async-webhook",
    "async_webhooks",
    multiple=True,
    envvar="INFERD_ASYNC_WEBHOOKS",
    help="A URL (repeatable) POSTed every async job's end, with an Inferd-Idempotency-Key header (the job's id); "
    "retried with backoff until it answers 2xx.",
)
@click.option(
    "--async-webhook-secret-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    envvar="INFERD_ASYNC_WEBHOOK_SECRET_FILE",
    help="A file holding the secret that webhook bodies are signed with (Inferd-Signature: t=...,v1=HMAC-SHA256).",
)
@click.option(
    "--async-success-topic",
    default=None,
    envvar="INFERD_ASYNC_SUCCESS_TOPIC",
    help="An SNS topic ARN told of each succeeded async job, as SageMaker's SuccessTopic is.",
)
@click.option(
    "--async-error-topic",
    default=None,
    envvar="INFERD_ASYNC_ERROR_TOPIC",
    help="An SNS topic ARN told of each failed async job, as SageMaker's ErrorTopic is.",
)
@click.option(
    "--async-queue",
    default=None,
    envvar="INFERD_ASYNC_QUEUE",
    help="Where async jobs wait: by default an SQLite database in --state-dir (one server); redis://HOST:PORT/DB, "
    "Redis Streams that several servers share (each takes over the jobs of one that died; --async-payload-path "
    "and --async-output-path must then be s3:// places all of them reach).",
)
@click.option(
    "--max-async-request-bytes",
    default=1 << 30,
    show_default=True,
    type=ByteSize(),
    envvar="INFERD_MAX_ASYNC_REQUEST_BYTES",
    help="Largest body an async submit (POST .../infer_async) takes, such as 4GiB: written to disk as it arrives, "
    "never held in memory. Every other route keeps --max-request-bytes.",
)
@click.option(
    "--async-max-attempts",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_ASYNC_MAX_ATTEMPTS",
    help="Runs an async job gets (a crash or a transient refusal takes one); then it fails as a dead letter.",
)
@click.option(
    "--async-concurrency",
    default=8,
    show_default=True,
    type=click.IntRange(min=0),
    envvar="INFERD_ASYNC_CONCURRENCY",
    help="Async jobs run at once; they batch with each other, and yield to real-time requests. 0 (with a shared "
    "--async-queue): this server takes submits and answers their status, and the other servers run the jobs.",
)
@click.option(
    "--allow-model-upload/--no-allow-model-upload",
    default=False,
    show_default=True,
    envvar="INFERD_ALLOW_MODEL_UPLOAD",
    help="Let the repository API (explicit mode) take model files, and config overrides that change a model's "
    "backend or platform or a remote model's URL: code that the server then runs. Needs management tokens, "
    "unless --host is a loopback address.",
)
@click.option(
    "--shared-memory-prefix",
    default="",
    envvar="INFERD_SHARED_MEMORY_PREFIX",
    help="Map only shared memory objects whose names start with this prefix (such as /inferd_), for hosts "
    "shared by several users. Objects of another user than the server's are never mapped.",
)
@click.option(
    "--max-shared-memory-regions",
    default=256,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="INFERD_MAX_SHARED_MEMORY_REGIONS",
    help="Shared memory regions registered at once at most.",
)
@click.option(
    "--otlp-endpoint",
    default=None,
    envvar="INFERD_OTLP_ENDPOINT",
    help="Trace every inference request with OpenTelemetry and export the spans by OTLP over gRPC to this "
    "URL (http://collector:4317). Tracing is also on when OTEL_TRACES_EXPORTER (otlp, console) or "
    "OTEL_EXPORTER_OTLP_ENDPOINT asks for it; OTEL_SERVICE_NAME names the service (default inferd). "
    f"Needs the tracing extra: pip install '{EXTRA}'. Off, it costs nothing.",
)
@click.option(
    "--trace-sample-ratio",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    envvar="INFERD_TRACE_SAMPLE_RATIO",
    help="With tracing on: the share of requests traced among those whose client sent no sampling decision; "
    "a W3C traceparent's decision is always followed.",
)
def serve(**options: object) -> None:
    """Serve the models of a model repository over KServe v2 REST and gRPC, TF Serving's REST API,
    SageMaker's /invocations and OpenAI-compatible embeddings.

    Every flag can also be set by the INFERD_* environment variable named in its help.
    """
    from inferd.server.app import run
    from inferd.server.rollout_webhooks import parse_webhooks

    options["tracing"] = _tracing(options.pop("otlp_endpoint"), options.pop("trace_sample_ratio"))
    if options["sagemaker"]:
        source = click.get_current_context().get_parameter_source("http_port")
        given = source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        options.update(sagemaker_ports(options, http_port_given=given))
        options["sagemaker_default_model"] = os.environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "")
    try:
        parse_webhooks(tuple(str(entry) for entry in options["rollout_webhooks"]))  # type: ignore[attr-defined]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        settings = ServerSettings.model_validate(options)
    except pydantic.ValidationError as error:
        raise click.UsageError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in error.errors())) from None
    run(settings)


def _tracing(otlp_endpoint: object, sample_ratio: object) -> TracingSettings | None:
    """The tracing the flags and OTEL_* variables ask for, checked before anything starts."""
    try:
        settings = tracing_settings(str(otlp_endpoint) if otlp_endpoint else None, float(str(sample_ratio)), os.environ)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if settings is not None and (missing := missing_tracing_modules()):
        raise click.UsageError(
            f"tracing is on (--otlp-endpoint or OTEL_* variables) but OpenTelemetry is not installed "
            f"({', '.join(missing)} missing): pip install '{EXTRA}'"
        )
    return settings


# SageMaker's container contract: the platform calls the container on 8080.
SAGEMAKER_HTTP_PORT = 8080


def sagemaker_ports(options: dict[str, object], *, http_port_given: bool = False) -> dict[str, int]:
    """SageMaker's port rules: HTTP on SAGEMAKER_BIND_TO_PORT, else on the --http-port the user gave
    (`http_port_given`: on the command line or in INFERD_HTTP_PORT), else on 8080; every other
    listener inside SAGEMAKER_SAFE_PORT_RANGE ("low-high") when set: a port outside it moves to the
    lowest free one."""
    # The platform's variable wins: inside SageMaker it names the one port the platform calls.
    # Outside it, a port the user named is kept rather than silently traded for 8080.
    bound = os.environ.get("SAGEMAKER_BIND_TO_PORT")
    if bound:
        http_port = int(bound)
    elif http_port_given:
        http_port = int(str(options["http_port"]))
    else:
        http_port = SAGEMAKER_HTTP_PORT
    ports = {"http_port": http_port}
    safe = os.environ.get("SAGEMAKER_SAFE_PORT_RANGE", "")
    if not safe:
        return ports
    low_text, _, high_text = safe.partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        raise click.BadParameter(f"SAGEMAKER_SAFE_PORT_RANGE {safe!r} is not 'low-high'") from None
    taken = {http_port}
    for name in ("grpc_port", "metrics_port"):
        port = int(str(options[name]))
        if not low <= port <= high or port in taken:
            free = [p for p in range(low, high + 1) if p not in taken]
            if not free:
                raise click.BadParameter(f"SAGEMAKER_SAFE_PORT_RANGE {safe!r} has no port left for {name}")
            port = free[0]
        ports[name] = port
        taken.add(port)
    return ports

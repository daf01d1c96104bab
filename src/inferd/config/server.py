"""Server settings: what `inferd serve` flags and INFERD_* environment variables decide."""

from __future__ import annotations

import enum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferd.config.response_cache import CacheSettings, parse_cache_config
from inferd.config.scale_to_zero import DEFAULT_MAX_HELD
from inferd.config.tracing import TracingSettings
from inferd.limits import (
    DEFAULT_MAX_REQUEST_ELEMENTS,
    DEFAULT_MAX_REQUEST_TEXT_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    RequestLimits,
)


class LogFormat(enum.Enum):
    JSON = "json"
    TEXT = "text"


DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_SAGEMAKER_MAX_MODELS = 1000
DEFAULT_MAX_DECODED_BYTES_IN_FLIGHT = 256 * 1024 * 1024
DEFAULT_MAX_COMPRESSION_RATIO = 100
# Disk the optimized-model cache may take: 100 models of MiniLM's size.
DEFAULT_ONNX_CACHE_BYTES = 10 << 30


class IntraOpPools(enum.Enum):
    """Where ONNX Runtime's sessions find threads to split one execution over."""

    SHARED = "shared"
    """One pool for the whole server, sized to the cores: threads do not grow with models."""
    PER_INSTANCE = "per-instance"
    """A pool per session, of cores / the model's instances (its `intra_op_thread_count` wins)."""


class HttpServerKind(enum.Enum):
    """Which HTTP server carries the REST edge."""

    INFERD = "inferd"
    """inferd's own HTTP/1.1 server (server/http11.py)."""
    GRANIAN = "granian"
    """granian's embedded server (experimental; server/rsgi.py; needs `pip install granian`)."""


class ModelControlMode(enum.Enum):
    """Triton's model control modes."""

    NONE = "none"
    """Load every model at startup; never change."""
    POLL = "poll"
    """Load every model at startup; then follow the repository's changes."""
    EXPLICIT = "explicit"
    """Load the --load-model ones at startup; then load and unload through the repository API."""


class ServerSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_repository: tuple[str, ...] = ()
    """Model repositories in Triton's layout: local folders or fsspec URLs such as s3://bucket/prefix."""
    model_config_file: str | None = None
    """TF Serving's model config (a path or an fsspec URL): its models are served beside the repositories'."""
    model_config_file_poll_wait_s: float = Field(default=0.0, ge=0)
    """How often the model config file is read again and followed; 0: once."""
    model_name: str | None = None
    """TF Serving's single model: its name (default 'default'), with model_base_path."""
    model_base_path: str | None = None
    """TF Serving's single model: the folder of its version folders."""
    host: str = "0.0.0.0"
    """Address every listener binds to."""
    http_port: int = Field(default=8000, ge=0, le=65535)
    """KServe v2 REST port (default 8000)."""
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """KServe v2 gRPC port (default 8001)."""
    metrics_port: int = Field(default=8002, ge=0, le=65535)
    """Prometheus /metrics port (default 8002)."""
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    """How the set of served models may change after startup (default none)."""
    repository_poll_s: float = Field(default=15.0, gt=0)
    """In poll mode, how often the repository is scanned for changes (default 15 s, as Triton)."""
    load_models: tuple[str, ...] = ()
    """In explicit mode, the models loaded at startup ("*": all of them); pinned under a budget."""
    model_memory_budget_bytes: int | None = Field(default=None, gt=0)
    """Estimated memory of the loaded models at most; turns on on-demand loading and eviction."""
    max_loaded_models: int | None = Field(default=None, gt=0)
    """Loaded models at most; turns on on-demand loading and eviction."""
    idle_unload_seconds: float | None = Field(default=None, gt=0)
    """Seconds after which an idle model is unloaded (scaled to zero), unless its
    idle_unload_seconds parameter says otherwise; None: models stay loaded."""
    max_held: int = Field(default=DEFAULT_MAX_HELD, gt=0)
    """Requests that may wait for one model's on-demand load (a cold start) at once, unless its
    max_held parameter says otherwise."""
    intra_op_pools: IntraOpPools = IntraOpPools.SHARED
    """Intra-op thread pools of ONNX Runtime: one shared (default) or one per instance."""
    onnx_cache_dir: str | None = None
    """Where ONNX models' optimized graphs are kept between loads; None: the user's cache folder."""
    onnx_cache_bytes: int = Field(default=DEFAULT_ONNX_CACHE_BYTES, ge=0)
    """Disk the optimized-model cache may take (default 10 GiB); 0 turns it off."""
    cache_config: tuple[str, ...] = ()
    """The response cache, as Triton's --cache-config: `local,size=BYTES[,ttl_s=SECONDS]`; none: no cache."""
    execution_threads: int = Field(default=0, ge=0)
    """Worker threads the server runs executions on, shared by every model (0: 4 per core, at least 16)."""
    log_format: LogFormat = LogFormat.JSON
    log_level: str = "INFO"
    max_request_bytes: int = Field(default=DEFAULT_MAX_REQUEST_BYTES, gt=0)
    """Largest request body (HTTP) or message (gRPC) accepted, in bytes (default 64 MiB)."""
    max_request_elements: int = Field(default=DEFAULT_MAX_REQUEST_ELEMENTS, gt=0)
    """Elements of one request's inputs together, at every door (default 16 Mi = 16,777,216)."""
    max_request_text_bytes: int = Field(default=DEFAULT_MAX_REQUEST_TEXT_BYTES, gt=0)
    """Bytes of one request's BYTES elements (texts), 4 more counted for each element, at every door
    (default 16 MiB)."""
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, gt=0)
    """Bytes of one answer's output tensors, before encoding (default 256 MiB)."""
    max_decoded_bytes_in_flight: int = Field(default=DEFAULT_MAX_DECODED_BYTES_IN_FLIGHT, gt=0)
    """HTTP: bytes of compressed bodies' inflated form held by all requests at once (default 256 MiB);
    a compressed body that would pass it is answered 503, to retry."""
    max_compression_ratio: int = Field(default=DEFAULT_MAX_COMPRESSION_RATIO, gt=0)
    """HTTP: a compressed body may inflate to this many times its size at most (default 100)."""
    strict_readiness: bool = False
    """When true, /v2/health/ready needs every model ready; else it needs startup loading done."""
    shutdown_timeout_s: float = Field(default=30.0, ge=0)
    """How long SIGTERM waits for in-flight requests before closing (default 30 s)."""
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    """HTTP: an idle keep-alive connection closes after this long (default 5 s)."""
    read_timeout_s: float = Field(default=10.0, gt=0)
    """HTTP: a request head must arrive within this long of its first byte, and a body at least
    1 KiB/s on average after this long (default 10 s); else 408."""
    write_timeout_s: float = Field(default=30.0, gt=0)
    """HTTP: a client that reads nothing of its response for this long is disconnected (default 30 s)."""
    tfserving_grpc_port: int | None = Field(default=None, ge=1, le=65535)
    """TF Serving's gRPC API (PredictionService, ModelService) on this port; off when None (TF uses 8500)."""
    tfserving_batching_parameters: str | None = None
    """A TF Serving batching_parameters file whose settings every batching model takes."""
    torchserve_management_port: int | None = Field(default=None, ge=1, le=65535)
    """TorchServe's management API (read side) on this port; off when None (TorchServe uses 8081)."""
    sagemaker: bool = False
    """Run as a SageMaker container: the multi-model endpoint routes and /endpoints/NAME/invocations."""
    sagemaker_model_root: str = "/opt/ml/models"
    """With sagemaker: the folder every model loaded by POST /models must lie under."""
    sagemaker_max_models: int = Field(default=DEFAULT_SAGEMAKER_MAX_MODELS, gt=0)
    """With sagemaker: models POST /models may have loaded at once; one more is refused with 507
    (SageMaker then unloads one it no longer uses and retries). Default 1000."""
    sagemaker_default_model: str = ""
    """The model /invocations serves without X-Amzn-SageMaker-Target-Model (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)."""
    max_connections: int = Field(default=4096, gt=0)
    """HTTP: open connections at most; one more is answered 503 and closed (default 4096)."""
    tracing: TracingSettings | None = None
    """Traces exported by OpenTelemetry (--otlp-endpoint, OTEL_* variables); None: off, and free."""
    http_server: HttpServerKind = HttpServerKind.INFERD
    """Which server carries the REST edge (experimental; default inferd's own)."""
    tls_cert: str | None = None
    """A PEM certificate (chain): every listener (HTTP, gRPC, metrics) serves TLS with it and `tls_key`."""
    tls_key: str | None = None
    """The certificate's PEM private key."""
    tls_client_ca: str | None = None
    """With TLS: a PEM CA bundle; clients must present a certificate it signed (mutual TLS)."""
    management_tokens_file: str | None = None
    """Bearer tokens (one a line) for the management API; INFERD_MANAGEMENT_TOKENS adds more."""
    inference_tokens_file: str | None = None
    """Bearer tokens (one a line) for the data plane; INFERD_INFERENCE_TOKENS adds more."""
    rollout_webhooks: tuple[str, ...] = ()
    """NAME=URL: outside alarms a rollout may ask at each step, by name."""
    endpoints_file: str | None = None
    """A YAML file (path or fsspec URL) that declares the endpoints, re-read every repository_poll_s."""
    rollout_controller: str | None = None
    """This server is its fleet's rollout controller: the rollouts its API starts are judged on every
    replica's traffic, from `prometheus=URL` or `scrape=HOST:PORT,...` (the replicas' /metrics),
    and their weights are the state directory the replicas share."""
    rollout_scrape_interval_s: float = Field(default=15.0, gt=0)
    """With rollout_controller prometheus=URL: how often that Prometheus scrapes the replicas."""
    state_dir: str | None = None
    """Where what users set through the API (endpoints, async jobs) is kept across restarts; None: in
    memory only, and no async inference."""
    async_output_path: str | None = None
    """Where async jobs' results are written (a folder or s3:// prefix); default STATE_DIR/async/results."""
    async_failure_path: str | None = None
    """Where async jobs' failure documents are written; default the output path."""
    async_payload_path: str | None = None
    """Where inline async bodies are kept until their job ends; default STATE_DIR/async/payloads."""
    async_input_roots: tuple[str, ...] = ()
    """Folders or s3:// prefixes a submit's input location may lie under; none: inline bodies only."""
    async_webhooks: tuple[str, ...] = ()
    """URLs told of every async job's end (POST, signed with async_webhook_secret_file's secret)."""
    async_webhook_secret_file: str | None = None
    """A file whose content (stripped) is the HMAC-SHA256 key webhooks' bodies are signed with."""
    async_success_topic: str | None = None
    """An SNS topic ARN told of each succeeded async job (SageMaker's SuccessTopic)."""
    async_error_topic: str | None = None
    """An SNS topic ARN told of each failed async job (SageMaker's ErrorTopic)."""
    async_queue: str | None = None
    """Where async jobs wait: None, an SQLite database in the state directory (one server);
    redis://HOST:PORT/DB, Redis Streams shared by several servers (payloads then on s3://)."""
    max_async_request_bytes: int = Field(default=1 << 30, gt=0)
    """Largest body an async submit takes (1 GiB): written to disk as it arrives, never held whole
    in memory (inferd's own HTTP server; other routes keep max_request_bytes)."""
    async_max_attempts: int = Field(default=3, gt=0)
    """Leases an async job gets; after the last it ends failed, as a dead letter (default 3)."""
    async_concurrency: int = Field(default=8, ge=0)
    """Async jobs run at once (they batch with each other; default 8)."""
    allow_model_upload: bool = False
    """Let the repository API take model files, and config overrides that change a model's backend
    or platform or a remote model's URL (code the server then runs). Off by default; on, it needs
    management tokens unless every listener is on loopback."""
    shared_memory_prefix: str = ""
    """Shared memory objects a client may register must have names starting with this ("" for any):
    for hosts shared by several users or services."""
    max_shared_memory_regions: int = Field(default=256, gt=0)
    """Shared memory regions registered at once at most (default 256)."""

    @model_validator(mode="after")
    def _models_come_from_somewhere(self) -> Self:
        if not self.model_repository and self.model_config_file is None and self.model_base_path is None:
            raise ValueError("give --model-repository, --model-config-file or --model-base-path: nothing to serve")
        if self.model_base_path is not None and self.model_config_file is not None:
            raise ValueError("--model-base-path and --model-config-file both name the models: give one (as TF Serving)")
        if self.model_name is not None and self.model_base_path is None:
            raise ValueError("--model-name names the model of --model-base-path: give that too")
        if self.model_config_file_poll_wait_s > 0 and self.model_config_file is None:
            raise ValueError("--model-config-file-poll-wait-seconds follows --model-config-file: give that too")
        return self

    @model_validator(mode="after")
    def _cache_config_reads(self) -> Self:
        parse_cache_config(self.cache_config)  # a usage error now rather than at the first request
        return self

    @property
    def response_cache(self) -> CacheSettings | None:
        return parse_cache_config(self.cache_config)

    @model_validator(mode="after")
    def _rollout_controller_writes_shared_state(self) -> Self:
        if self.rollout_controller is None:
            return self
        kind, _, where = self.rollout_controller.partition("=")
        if kind not in ("prometheus", "scrape") or not where.strip():
            raise ValueError("--rollout-controller is prometheus=URL or scrape=HOST:PORT,HOST:PORT,...")
        if not self.state_dir:
            raise ValueError(
                "--rollout-controller writes the weights its replicas follow: give --state-dir, the directory they "
                "share"
            )
        if self.endpoints_file is not None:
            raise ValueError(
                "--rollout-controller sets the weights of a shared --state-dir; replicas that serve an --endpoints "
                "file are rolled out by inferd rollout start --controller --endpoints FILE"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_come_together(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
        return self

    @property
    def request_limits(self) -> RequestLimits:
        return RequestLimits(
            max_elements=self.max_request_elements,
            max_text_bytes=self.max_request_text_bytes,
            max_response_bytes=self.max_response_bytes,
        )

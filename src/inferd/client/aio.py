"""`AsyncClient`: inferd's asyncio client of any KServe v2 server (inferd, Triton).

    async with AsyncClient("http://localhost:8000") as client:      # or "grpc://localhost:8001"
        response = await client.infer("add_sub", {"INPUT0": a, "INPUT1": b})
        response.as_numpy("OUTPUT0")

numpy arrays in and out; connections kept alive and reused; every call with a deadline (the
client's `timeout_s`, or the call's own) that the server is told and honours; 503s retried after
the server's Retry-After or an exponential backoff (`RetryPolicy`); the server's errors raised as
inferd's typed errors (`inferd.errors`: `ShapeMismatchError`, `ModelNotFoundError`,
`OverloadedError`, ...), each with its `code`, `message`, `tensor` and `request_id`.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, TypedDict, TypeVar

import numpy as np

from inferd.client.async_jobs import AsyncJob, submit_query
from inferd.client.http import HttpInferenceClient
from inferd.client.retry import RetryPolicy, call_with_retries
from inferd.client.security import ClientTls, bearer
from inferd.client.transport import Transport
from inferd.errors import UnsupportedError
from inferd.types import (
    DataType,
    InferRequest,
    InferResponse,
    ModelIndexEntry,
    ModelMetadata,
    ModelStatistics,
    RequestContext,
    RequestedOutput,
    ServerMetadata,
    Tensor,
    new_request_id,
)

T = TypeVar("T")
Protocol = Literal["http", "grpc"]
Inputs = Mapping[str, Any] | Iterable[Tensor]
DEFAULT_TIMEOUT_S = 60.0


class ClientOptions(TypedDict, total=False):
    """`AsyncClient`'s keyword arguments, which `Client` takes as they are."""

    protocol: Protocol | None
    binary: bool
    timeout_s: float
    retry: RetryPolicy | None
    max_in_flight: int
    connections: int
    tls: ClientTls | None
    token: str | None


class AsyncClient:
    def __init__(
        self,
        url: str,
        *,
        protocol: Protocol | None = None,
        binary: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        max_in_flight: int = 64,
        connections: int = 2,
        tls: ClientTls | None = None,
        token: str | None = None,
    ) -> None:
        """`url`: `http://host:port`, `grpc://host:port`, or `host:port` with `protocol` (default
        http). `binary`: HTTP tensors as raw bytes (the binary extension), else JSON. `timeout_s`:
        each call's deadline unless it names its own. `retry`: when to try again (default
        `RetryPolicy()`: up to 3 retries; `NO_RETRIES` for none). `max_in_flight`: calls at once
        (each HTTP call in flight holds a connection); `connections`: gRPC channels. `https://` and
        `grpcs://` URLs (or `tls`) speak TLS: `tls` names the CA to trust and, for mutual TLS, the
        client's certificate. `token`: sent as `Authorization: Bearer TOKEN` on every call."""
        self.protocol, address, secure = parse_url(url, protocol)
        if secure and tls is None:
            tls = ClientTls()  # the system's trust store
        self.url = address
        self.timeout_s = timeout_s
        self.retry = retry if retry is not None else RetryPolicy()
        self._transport: Transport
        if self.protocol == "grpc":
            from inferd.client.grpc import GrpcInferenceClient  # grpc only for gRPC

            self._transport = GrpcInferenceClient(
                address,
                connections=connections,
                max_in_flight=max_in_flight,
                credentials=tls.grpc_credentials() if tls is not None else None,
                authorization=bearer(token),
            )
        else:
            self._transport = HttpInferenceClient(
                address,
                max_in_flight=max_in_flight,
                binary=binary,
                tls=tls.ssl_context() if tls is not None else None,
                authorization=bearer(token),
            )

    async def infer(
        self,
        model: str,
        inputs: Inputs,
        *,
        outputs: Iterable[str] = (),
        version: str = "",
        request_id: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> InferResponse:
        """Run `model` on `inputs` (name → numpy array, or Tensors); `outputs` narrows what comes
        back (default: every output). Arrays of str or bytes travel as BYTES."""
        request = _request(model, version, inputs, outputs, parameters, request_id)
        return await self.infer_request(request, timeout_s=timeout_s)

    async def infer_request(self, request: InferRequest, *, timeout_s: float | None = None) -> InferResponse:
        """Send an InferRequest as it is (what `infer` builds)."""
        return await self._retrying(lambda left: self._transport.infer(request, timeout_s=left), timeout_s)

    async def server_live(self, *, timeout_s: float | None = None) -> bool:
        return await self._retrying(lambda left: self._transport.server_live(timeout_s=left), timeout_s)

    async def server_ready(self, *, timeout_s: float | None = None) -> bool:
        return await self._retrying(lambda left: self._transport.server_ready(timeout_s=left), timeout_s)

    async def model_ready(self, model: str, version: str = "", *, timeout_s: float | None = None) -> bool:
        return await self._retrying(lambda left: self._transport.model_ready(model, version, timeout_s=left), timeout_s)

    async def server_metadata(self, *, timeout_s: float | None = None) -> ServerMetadata:
        return await self._retrying(lambda left: self._transport.server_metadata(timeout_s=left), timeout_s)

    async def model_metadata(self, model: str, version: str = "", *, timeout_s: float | None = None) -> ModelMetadata:
        return await self._retrying(
            lambda left: self._transport.model_metadata(model, version, timeout_s=left), timeout_s
        )

    async def model_config(self, model: str, version: str = "", *, timeout_s: float | None = None) -> dict[str, Any]:
        """The model's configuration as Triton's ModelConfig JSON (as `GET /v2/models/{m}/config`)."""
        return await self._retrying(
            lambda left: self._transport.model_config(model, version, timeout_s=left), timeout_s
        )

    async def statistics(
        self, model: str = "", version: str = "", *, timeout_s: float | None = None
    ) -> list[ModelStatistics]:
        """The statistics extension's cumulative counts and times: of one model, or every model."""
        return await self._retrying(lambda left: self._transport.statistics(model, version, timeout_s=left), timeout_s)

    async def repository_index(self, ready: bool = False, *, timeout_s: float | None = None) -> list[ModelIndexEntry]:
        return await self._retrying(lambda left: self._transport.repository_index(ready, timeout_s=left), timeout_s)

    async def load_model(
        self,
        model: str,
        *,
        config: Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Load (or reload) `model`; `config` overrides its config (Triton's ModelConfig as a dict),
        `files` supply its files by path within the model folder ("1/model.onnx")."""
        config_json = json.dumps(dict(config)) if config else ""
        await self._retrying(
            lambda left: self._transport.load_model(model, config_json, files, timeout_s=left), timeout_s
        )

    async def unload_model(
        self, model: str, *, unload_dependents: bool = False, timeout_s: float | None = None
    ) -> None:
        await self._retrying(
            lambda left: self._transport.unload_model(model, unload_dependents, timeout_s=left), timeout_s
        )

    async def submit_async(
        self,
        model: str,
        inputs: Inputs | None = None,
        *,
        input_location: str = "",
        version: str = "",
        inference_id: str = "",
        ttl_s: float | None = None,
        job_timeout_s: float | None = None,
        priority: int = 0,
        outputs: Iterable[str] = (),
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> AsyncJob:
        """Keep an async inference job of `model` (answered at once): `inputs` sent inline, or the
        object at `input_location` (under one of the server's --async-input-root) read later.
        `inference_id` makes the submit idempotent; `ttl_s` expires it unstarted; `job_timeout_s`
        fails it if it runs longer; a higher `priority` runs first. Not retried, unless it names
        its `inference_id` (a retry is then the same job)."""
        transport = self._http("submit_async")
        query = submit_query(inference_id, ttl_s, job_timeout_s, priority)
        request = None
        location = None
        if input_location:
            location = {"model": model, "version": version, "body": {"input_location": input_location}}
        elif inputs is not None:
            request = _request(model, version, inputs, outputs, parameters)
        else:
            raise ValueError("submit_async needs inputs or an input_location")

        async def call(left: float) -> Any:
            return await transport.submit_async(request, location, query, timeout_s=left)

        left = self.timeout_s if timeout_s is None else timeout_s
        answer = await (self._retrying(call, timeout_s) if inference_id else call(left))
        return AsyncJob.from_json(answer)

    async def async_job(self, inference_id: str, *, wait_s: float = 0.0, timeout_s: float | None = None) -> AsyncJob:
        """The job; with `wait_s`, answered when it ends or after `wait_s` (120 at most), whichever is first."""
        path = f"/v2/async/{urllib.parse.quote(inference_id, safe='')}" + (f"?wait_s={wait_s!r}" if wait_s else "")
        left = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        return AsyncJob.from_json(await self.call_json("GET", path, timeout_s=left))

    async def wait_async(self, inference_id: str, *, timeout_s: float = 3600.0) -> AsyncJob:
        """The job once it has ended (succeeded, failed, cancelled or expired), or after `timeout_s`
        as it then is."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            job = await self.async_job(inference_id, wait_s=max(0.0, min(60.0, left)))
            if job.ended or left <= 0:
                return job

    async def cancel_async(self, inference_id: str, *, timeout_s: float | None = None) -> AsyncJob:
        """Cancel a queued job (a running or ended one is refused: AlreadyExistsError, 409)."""
        path = f"/v2/async/{urllib.parse.quote(inference_id, safe='')}"
        return AsyncJob.from_json(await self.call_json("DELETE", path, timeout_s=timeout_s))

    async def list_async(
        self, *, model: str = "", state: str = "", limit: int = 100, timeout_s: float | None = None
    ) -> list[AsyncJob]:
        """Jobs, newest first (a management call: it needs a management token when tokens are on)."""
        query = urllib.parse.urlencode({k: v for k, v in (("model", model), ("state", state)) if v} | {"limit": limit})
        answer = await self.call_json("GET", f"/v2/async?{query}", timeout_s=timeout_s)
        return [AsyncJob.from_json(document) for document in answer["jobs"]]

    def _http(self, call: str) -> HttpInferenceClient:

        if not isinstance(self._transport, HttpInferenceClient):
            raise UnsupportedError(f"{call} is an HTTP API: call the server with an http:// URL")
        return self._transport

    async def call_json(self, method: str, path: str, document: Any = None, *, timeout_s: float | None = None) -> Any:
        """A JSON call over HTTP of an API the typed methods do not cover (`/v2/endpoints/...`):
        its answer as JSON. Not retried: such calls change the server's state."""
        transport = self._http(f"{method} {path}")
        return await transport.call_json(
            method, path, document, timeout_s=self.timeout_s if timeout_s is None else timeout_s
        )

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    async def _retrying(self, call: Callable[[float], Awaitable[T]], timeout_s: float | None) -> T:
        return await call_with_retries(call, self.retry, self.timeout_s if timeout_s is None else timeout_s)


def _request(
    model: str,
    version: str,
    inputs: Inputs,
    outputs: Iterable[str],
    parameters: Mapping[str, Any] | None,
    request_id: str = "",
) -> InferRequest:
    return InferRequest(
        model_name=model,
        model_version=version,
        inputs=as_tensors(inputs),
        outputs=tuple(RequestedOutput(name) for name in outputs),
        parameters=dict(parameters or {}),
        context=RequestContext(request_id or new_request_id()),
    )


def parse_url(url: str, protocol: Protocol | None = None) -> tuple[Protocol, str, bool]:
    """(protocol, host:port, TLS or not) from `http://`, `https://`, `grpc://` or `grpcs://host:port`,
    or `host:port` with `protocol`."""
    scheme, separator, address = url.partition("://")
    if not separator:
        scheme, address = protocol or "http", url
    if scheme not in ("http", "https", "grpc", "grpcs"):
        raise ValueError(f"url {url!r}: the scheme must be http://, https://, grpc:// or grpcs://")
    kind: Protocol = "grpc" if scheme.startswith("grpc") else "http"
    if protocol is not None and protocol != kind:
        raise ValueError(f"url {url!r} says {scheme}, but protocol {protocol!r} was asked for")
    host, _, port = address.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"url {url!r} must name a host and a port, as http://localhost:8000")
    return kind, f"{host}:{port}", scheme.endswith("s")


def as_tensors(inputs: Inputs) -> tuple[Tensor, ...]:
    """Tensors from name → array (any array-like; str and bytes become BYTES), or Tensors as they are."""
    if not isinstance(inputs, Mapping):
        return tuple(inputs)
    tensors = []
    for name, value in inputs.items():
        if isinstance(value, Tensor):
            tensors.append(value)
            continue
        array = np.asarray(value)
        if array.dtype.kind in ("U", "S"):
            array = np.array([_utf8(item) for item in array.reshape(-1)], dtype=object).reshape(array.shape)
        tensors.append(Tensor(name, DataType.from_numpy(array.dtype), tuple(array.shape), array))
    return tuple(tensors)


def _utf8(item: Any) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode("utf-8")

"""Remote models: a model served by another inferd (or Triton) process, called over KServe v2
(gRPC, or HTTP with binary tensors) through `inferd.client`, so a pipeline can run its light steps
in one process and its heavy model in another (the split deployment: a tokenizer process in front
of an encoder process).

    <model>/config.pbtxt   backend: "remote"
                           max_batch_size: 32              # batches merge here, then go as one call
                           dynamic_batching { }
                           parameters { key: "url" value { string_value: "10.0.0.7:8000" } }
                           # optional: protocol ("http", the default: binary tensors over the
                           # HTTP port; or "grpc": url is then the gRPC port), model_name (default:
                           # this model's name), model_version, timeout_ms (default 10000),
                           # connections (gRPC channels, 2), max_in_flight (64)

The version folder may be empty (or left out). Inputs and outputs come from the config, or from
the remote model's metadata at load. Each batch is one gRPC call carrying the batch's earliest
deadline (or `timeout_ms`, whichever comes first); a remote server that is down or does not answer
in time answers the batch's requests with a 503 that names it. Calls run on the server's event
loop over a bounded pool of kept-alive connections; the instance waits on a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from inferd.client import GrpcInferenceClient, HttpInferenceClient, Transport
from inferd.config.model import ModelConfig, ModelSignature, TensorSpec
from inferd.config.parameters import (
    REMOTE_CONNECTIONS,
    REMOTE_MAX_IN_FLIGHT,
    REMOTE_MODEL_NAME,
    REMOTE_MODEL_VERSION,
    REMOTE_PROTOCOL,
    REMOTE_TIMEOUT_MS,
    REMOTE_URL,
)
from inferd.errors import (
    DeadlineUnreachableError,
    InferdError,
    InvalidRequestError,
    ModelConfigError,
    ModelLoadError,
    ModelOutputError,
    UnavailableError,
    with_context,
)
from inferd.runtimes.base import (
    RuntimeOptions,
    positive_parameter,
    running_loop,
    signature_from_config,
)
from inferd.types import DataType, InferRequest, RequestContext, RequestedOutput, Tensor, TensorMetadata, new_request_id

DEFAULT_TIMEOUT_MS = 10_000
# A remote model keeps nothing here but its connections.
MEMORY_BYTES = 1 << 20
T = TypeVar("T")


def estimate_memory_bytes(model_bytes: int) -> int:
    return MEMORY_BYTES


class RemoteRuntime:
    def __init__(self, config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> None:
        parameters = config.parameters
        url = parameters.get(REMOTE_URL.name, "")
        if not url:
            raise ModelConfigError(f"model '{config.name}': a remote model needs the parameter url (host:port)")
        self._name = config.name
        self._remote_name = parameters.get(REMOTE_MODEL_NAME.name, config.name)
        self._remote_version = parameters.get(REMOTE_MODEL_VERSION.name, "")
        self._timeout_s = (positive_parameter(config, REMOTE_TIMEOUT_MS.name) or DEFAULT_TIMEOUT_MS) / 1000
        self._loop, self._own_loop = _event_loop(options.event_loop)
        self._client = _client(config, url)
        self._signature = signature_from_config(config) if config.inputs and config.outputs else self._metadata()
        self._datatypes = {t.name: t.datatype for t in self._signature.inputs}

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def may_run_inline(self) -> bool:
        return False  # it waits on the network

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        timeout_s = self._timeout_s
        if deadline_s is not None:
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                raise DeadlineUnreachableError(f"model '{self._name}': the request's deadline passed before the call")
            timeout_s = min(timeout_s, left_s)
        request = InferRequest(
            model_name=self._remote_name,
            model_version=self._remote_version,
            inputs=tuple(Tensor(n, self._datatypes[n], a.shape, a) for n, a in inputs.items()),
            outputs=tuple(RequestedOutput(name) for name in output_names),
            context=RequestContext(new_request_id()),
        )
        try:
            response = self._run(self._client.infer(request, timeout_s=timeout_s))
        except InvalidRequestError as exc:  # the request's fault, as the remote server judged it
            where = f"remote model '{self._remote_name}': server {self._client.url} refused the request"
            raise with_context(exc, where) from None
        except InferdError as exc:  # anything else is this deployment's: the remote server is unavailable to it
            raise UnavailableError(
                f"remote model '{self._remote_name}': {exc.message}",
                retry_after_s=exc.retry_after_s if isinstance(exc, UnavailableError) else None,
            ) from None
        results = {tensor.name: tensor.data for tensor in response.outputs}
        missing = [name for name in output_names if name not in results]
        if missing:
            raise ModelOutputError(f"model '{self._name}': the remote model answered without {missing}")
        return results

    def close(self) -> None:
        # When the loop is gone (shutdown), so are the connections.
        with contextlib.suppress(InferdError, RuntimeError, TimeoutError):
            self._run(self._client.close(), timeout_s=5.0)
        if self._own_loop:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _metadata(self) -> ModelSignature:
        """The remote model's tensors, from its metadata (the config declared none)."""
        try:
            metadata = self._run(
                self._client.model_metadata(self._remote_name, self._remote_version, timeout_s=self._timeout_s)
            )
        except InferdError as exc:
            raise ModelLoadError(
                f"model '{self._name}': cannot read the remote model's tensors (declare input and output in "
                f"config.pbtxt to load without asking): {exc.message}"
            ) from exc

        def specs(tensors: Sequence[TensorMetadata]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(t.name, DataType.from_wire(t.datatype), t.shape) for t in tensors)

        return ModelSignature(inputs=specs(metadata.inputs), outputs=specs(metadata.outputs))

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run on the loop the client's connections live on, from this (worker) thread."""
        if running_loop() is self._loop:
            coroutine.close()
            raise RuntimeError("a remote model cannot run on its own event loop's thread")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)


# HTTP first: in the split sentence-similarity pipeline at one client, a remote call over inferd's
# HTTP server took 0.4 ms beyond the model's own time, over grpc.aio 1.1 ms.
PROTOCOLS = ("http", "grpc")


def _client(config: ModelConfig, url: str) -> Transport:
    protocol = config.parameters.get(REMOTE_PROTOCOL.name, PROTOCOLS[0])
    max_in_flight = positive_parameter(config, REMOTE_MAX_IN_FLIGHT.name) or 64
    if protocol == "grpc":
        return GrpcInferenceClient(
            url, connections=positive_parameter(config, REMOTE_CONNECTIONS.name) or 2, max_in_flight=max_in_flight
        )
    if protocol == "http":
        try:
            return HttpInferenceClient(url, max_in_flight=max_in_flight)
        except ValueError as exc:
            raise ModelConfigError(f"model '{config.name}': {exc}") from None
    raise ModelConfigError(f"model '{config.name}': parameter protocol is {protocol!r}; it must be one of {PROTOCOLS}")


def _event_loop(server_loop: asyncio.AbstractEventLoop | None) -> tuple[asyncio.AbstractEventLoop, bool]:
    """The server's loop, or outside a server a loop of the model's own on a daemon thread."""
    if server_loop is not None:
        return server_loop, False
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="inferd-remote", daemon=True).start()
    return loop, True

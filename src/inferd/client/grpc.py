"""An asyncio KServe v2 gRPC transport: every method of the service (health, metadata, config,
statistics, repository, infer).

Bounded and kept alive: `connections` HTTP/2 channels, opened on first use and kept (with gRPC
keep-alive pings), requests spread over them in turn and multiplexed on each; at most
`max_in_flight` requests at once, the others wait their turn within their own deadline. Every
call has a deadline, which the server receives and honours. A server's error comes back as
inferd's typed error (from the `inferd-code` trailer inferd sends, else the status); a server
down or slow as an UnavailableError that names it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferd.errors import InferdError, UnavailableError
from inferd.protocol import grpc_v2
from inferd.protocol.request_id import REQUEST_ID_HEADER, header_value
from inferd.types import InferRequest, InferResponse, ModelIndexEntry, ModelMetadata, ModelStatistics, ServerMetadata

_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    # Keep idle connections open and find dead ones: a ping every 30 s, even without calls.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
)
T = TypeVar("T")
AUTHORIZATION = "authorization"


class GrpcInferenceClient:
    def __init__(
        self,
        url: str,
        *,
        connections: int = 2,
        max_in_flight: int = 64,
        credentials: grpc.ChannelCredentials | None = None,
        authorization: str | None = None,
    ) -> None:
        """`url`: host:port of the server's gRPC endpoint. `credentials`: TLS channel credentials
        (None: plaintext). `authorization`: the `authorization` metadata every call carries."""
        self._credentials = credentials
        self._authorization = ((AUTHORIZATION, authorization),) if authorization is not None else ()
        self.url = url
        self._connections = max(1, connections)
        self._max_in_flight = max(1, max_in_flight)
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[Any] = []
        self._turn = itertools.count()
        self._slots: asyncio.Semaphore | None = None

    async def infer(self, request: InferRequest, *, timeout_s: float) -> InferResponse:
        """The server's response, within `timeout_s` seconds (waiting for a slot included)."""
        request_id = request.context.request_id
        metadata = ((REQUEST_ID_HEADER, header_value(request_id)),) if request_id else None
        message = await self._call(
            lambda stub: stub.ModelInfer, grpc_v2.encode_request(request), timeout_s, metadata=metadata
        )
        return grpc_v2.decode_response(message, request_id=request_id)

    async def server_live(self, *, timeout_s: float) -> bool:
        message = await self._call(lambda stub: stub.ServerLive, service_pb2.ServerLiveRequest(), timeout_s)
        return bool(message.live)

    async def server_ready(self, *, timeout_s: float) -> bool:
        message = await self._call(lambda stub: stub.ServerReady, service_pb2.ServerReadyRequest(), timeout_s)
        return bool(message.ready)

    async def model_ready(self, name: str, version: str = "", *, timeout_s: float) -> bool:
        request = service_pb2.ModelReadyRequest(name=name, version=version)
        return bool((await self._call(lambda stub: stub.ModelReady, request, timeout_s)).ready)

    async def server_metadata(self, *, timeout_s: float) -> ServerMetadata:
        message = await self._call(lambda stub: stub.ServerMetadata, service_pb2.ServerMetadataRequest(), timeout_s)
        return grpc_v2.decode_server_metadata(message)

    async def model_metadata(self, name: str, version: str = "", *, timeout_s: float) -> ModelMetadata:
        request = service_pb2.ModelMetadataRequest(name=name, version=version)
        return grpc_v2.decode_model_metadata(await self._call(lambda stub: stub.ModelMetadata, request, timeout_s))

    async def model_config(self, name: str, version: str = "", *, timeout_s: float) -> dict[str, Any]:
        request = service_pb2.ModelConfigRequest(name=name, version=version)
        return grpc_v2.decode_model_config(await self._call(lambda stub: stub.ModelConfig, request, timeout_s))

    async def statistics(self, name: str = "", version: str = "", *, timeout_s: float) -> list[ModelStatistics]:
        request = service_pb2.ModelStatisticsRequest(name=name, version=version)
        return grpc_v2.decode_statistics(await self._call(lambda stub: stub.ModelStatistics, request, timeout_s))

    async def repository_index(self, ready: bool = False, *, timeout_s: float) -> list[ModelIndexEntry]:
        request = service_pb2.RepositoryIndexRequest(ready=ready)
        return grpc_v2.decode_repository_index(await self._call(lambda stub: stub.RepositoryIndex, request, timeout_s))

    async def load_model(
        self, name: str, config_json: str = "", files: Mapping[str, bytes] | None = None, *, timeout_s: float
    ) -> None:
        request = grpc_v2.encode_load_request(name, config_json, files)
        await self._call(lambda stub: stub.RepositoryModelLoad, request, timeout_s)

    async def unload_model(self, name: str, unload_dependents: bool = False, *, timeout_s: float) -> None:
        request = grpc_v2.encode_unload_request(name, unload_dependents)
        await self._call(lambda stub: stub.RepositoryModelUnload, request, timeout_s)

    async def _call(
        self,
        method: Callable[[Any], Callable[..., Awaitable[T]]],
        message: Any,
        timeout_s: float,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> T:
        """One call on the next channel, within `timeout_s` (waiting for a slot included)."""
        deadline = time.monotonic() + timeout_s
        if self._slots is None:
            self._open()
        slots = self._slots  # this call's, even if the client is closed meanwhile
        assert slots is not None
        try:
            if slots.locked():  # wait for a slot within the deadline (a free one needs no timer)
                await asyncio.wait_for(slots.acquire(), timeout=max(0.0, timeout_s))
            else:
                await slots.acquire()
        except TimeoutError:
            raise UnavailableError(
                f"server {self.url}: all {self._max_in_flight} request slots stayed busy for {timeout_s * 1000:.0f} ms",
                retry_after_s=timeout_s,
            ) from None
        try:
            stub = self._stubs[next(self._turn) % len(self._stubs)]
            if self._authorization:
                metadata = (*(metadata or ()), *self._authorization)
            return await method(stub)(message, timeout=max(0.001, deadline - time.monotonic()), metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, timeout_s) from None
        finally:
            slots.release()

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], []
        self._slots = None
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)

    def _open(self) -> None:
        # On the event loop that will use them: grpc.aio channels belong to the loop they start on.
        self._channels = [self._channel() for _ in range(self._connections)]
        self._stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in self._channels]
        self._slots = asyncio.Semaphore(self._max_in_flight)

    def _channel(self) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.url, options=_CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(self.url, self._credentials, options=_CHANNEL_OPTIONS)

    def _error(self, exc: grpc.aio.AioRpcError, timeout_s: float) -> InferdError:
        code, details = exc.code(), exc.details() or ""
        trailing = tuple(exc.trailing_metadata() or ())
        if any(key == "inferd-code" for key, _ in trailing):  # inferd's server said what went wrong
            return grpc_v2.decode_error(code.name, details, trailing)
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return UnavailableError(
                f"server {self.url} did not answer within {timeout_s * 1000:.0f} ms", retry_after_s=timeout_s
            )
        if code is grpc.StatusCode.UNAVAILABLE:
            return UnavailableError(f"server {self.url} is unavailable: {details}")
        return grpc_v2.decode_error(code.name, details, trailing)

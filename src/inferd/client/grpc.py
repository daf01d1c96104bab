"""An asyncio KServe v2 gRPC client for server-to-server calls (the `remote` runtime).

Bounded and kept alive: `connections` HTTP/2 channels, opened on first use and kept (with gRPC
keep-alive pings), requests spread over them in turn and multiplexed on each; at most
`max_in_flight` requests at once, the others wait their turn within their own deadline. Every
call has a deadline, which the server receives and honours. The server's answer comes back as
inferd's own errors: a request it refused as invalid stays the request's fault (400); a server
down, slow or overloaded is a 503 that says which server and why.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferd.errors import InferdError, InvalidRequestError, UnavailableError
from inferd.protocol import grpc_v2
from inferd.protocol.request_id import REQUEST_ID_HEADER, header_value
from inferd.types import InferRequest, InferResponse, ModelMetadata

_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    # Keep idle connections open and find dead ones: a ping every 30 s, even without calls.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
)


class GrpcInferenceClient:
    def __init__(self, url: str, *, connections: int = 2, max_in_flight: int = 64) -> None:
        """`url`: host:port of the server's gRPC endpoint."""
        self.url = url
        self._connections = max(1, connections)
        self._max_in_flight = max(1, max_in_flight)
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[Any] = []
        self._turn = itertools.count()
        self._slots: asyncio.Semaphore | None = None

    async def infer(self, request: InferRequest, *, timeout_s: float) -> InferResponse:
        """The server's response, within `timeout_s` seconds (waiting for a slot included)."""
        deadline = time.monotonic() + timeout_s
        if self._slots is None:
            self._open()
        assert self._slots is not None
        try:
            if self._slots.locked():  # wait for a slot within the deadline (a free one needs no timer)
                await asyncio.wait_for(self._slots.acquire(), timeout=max(0.0, timeout_s))
            else:
                await self._slots.acquire()
        except TimeoutError:
            raise UnavailableError(
                f"remote model server {self.url}: all {self._max_in_flight} request slots stayed busy for "
                f"{timeout_s * 1000:.0f} ms",
                retry_after_s=timeout_s,
            ) from None
        try:
            stub = self._stubs[next(self._turn) % len(self._stubs)]
            metadata = ((REQUEST_ID_HEADER, header_value(request.request_id)),) if request.request_id else None
            try:
                message = await stub.ModelInfer(
                    grpc_v2.encode_request(request),
                    timeout=max(0.001, deadline - time.monotonic()),
                    metadata=metadata,
                )
            except grpc.aio.AioRpcError as exc:
                raise self._error(exc, request.model_name, timeout_s) from None
        finally:
            self._slots.release()
        return grpc_v2.decode_response(message, request_id=request.request_id)

    async def model_metadata(self, name: str, version: str = "", *, timeout_s: float) -> ModelMetadata:
        if self._slots is None:
            self._open()
        request = service_pb2.ModelMetadataRequest(name=name, version=version)
        try:
            message = await self._stubs[0].ModelMetadata(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, name, timeout_s) from None
        return grpc_v2.decode_model_metadata(message)

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], []
        self._slots = None
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)

    def _open(self) -> None:
        # On the event loop that will use them: grpc.aio channels belong to the loop they start on.
        self._channels = [
            grpc.aio.insecure_channel(self.url, options=_CHANNEL_OPTIONS) for _ in range(self._connections)
        ]
        self._stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in self._channels]
        self._slots = asyncio.Semaphore(self._max_in_flight)

    def _error(self, exc: grpc.aio.AioRpcError, model: str, timeout_s: float) -> InferdError:
        code, details = exc.code(), exc.details() or ""
        where = f"remote model server {self.url} (model '{model}')"
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidRequestError(f"{where} refused the request: {details}")
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return UnavailableError(f"{where} did not answer within {timeout_s * 1000:.0f} ms", retry_after_s=timeout_s)
        if code is grpc.StatusCode.UNAVAILABLE:
            return UnavailableError(f"{where} is unavailable: {details}")
        return UnavailableError(f"{where} failed: {code.name} {details}")

"""inferd's client: reaches KServe v2 servers (inferd, Triton) over the wire, never through their
code. Used by the `remote` runtime (a model served by another process) and by the tools."""

from typing import Protocol

from inferd.client.grpc import GrpcInferenceClient
from inferd.client.http import HttpInferenceClient
from inferd.types import InferRequest, InferResponse, ModelMetadata


class InferenceClient(Protocol):
    """What the gRPC and the HTTP client share: an asyncio KServe v2 client of one server."""

    url: str

    async def infer(self, request: InferRequest, *, timeout_s: float) -> InferResponse: ...

    async def model_metadata(self, name: str, version: str = "", *, timeout_s: float) -> ModelMetadata: ...

    async def close(self) -> None: ...


__all__ = ["GrpcInferenceClient", "HttpInferenceClient", "InferenceClient"]

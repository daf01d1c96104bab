"""inferd's client of KServe v2 servers (inferd, Triton), over HTTP (binary or JSON tensors) or
gRPC: `Client` (blocking) and `AsyncClient` (asyncio). It reaches servers over the wire only;
the tools (`inferd perf`, `analyze`, ...) and the `remote` runtime use it too.

An HTTP-only program imports no grpc: the gRPC transport is imported when a gRPC client is made.
"""

from typing import TYPE_CHECKING, Any

from inferd.client.aio import AsyncClient, parse_url
from inferd.client.async_jobs import AsyncJob
from inferd.client.http import HttpInferenceClient
from inferd.client.retry import NO_RETRIES, RetryPolicy
from inferd.client.security import ClientTls
from inferd.client.sync import Client
from inferd.client.transport import Transport

if TYPE_CHECKING:
    from inferd.client.grpc import GrpcInferenceClient


def __getattr__(name: str) -> Any:
    if name == "GrpcInferenceClient":
        from inferd.client.grpc import GrpcInferenceClient

        return GrpcInferenceClient
    raise AttributeError(f"module 'inferd.client' has no attribute {name!r}")


__all__ = [
    "NO_RETRIES",
    "AsyncClient",
    "AsyncJob",
    "Client",
    "ClientTls",
    "GrpcInferenceClient",
    "HttpInferenceClient",
    "RetryPolicy",
    "Transport",
    "parse_url",
]

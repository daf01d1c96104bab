"""Triton's CUDA shared memory extension on a server that maps no GPU memory: its status and
unregister calls succeed with no regions, and registering is refused with Triton's own answer for
a build without GPUs (INVALID_ARGUMENT, "... GPUs not supported").

Why serve it at all: Triton's clients clean up before they start (`unregister_cuda_shared_memory()`,
`get_cuda_shared_memory_status()`) even when they only use system shared memory; a 404 or
UNIMPLEMENTED there ends the program before its first inference. The HTTP routes are here; the
gRPC methods (`CudaSharedMemory*`) are in `server.grpc`, both calling `CudaSharedMemory`.
"""

from __future__ import annotations

from inferd.errors import InvalidRequestError, NotFoundError, with_triton_phrase
from inferd.protocol import json_v2
from inferd.server.auth import AUTHORIZATION_HEADER, Access, AccessPolicy, check_local_client
from inferd.server.http import json_response
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.routes import READ, Params, Route
from inferd.server.shared_memory import SharedMemoryRegions

_JSON_HEADERS = [(b"content-type", json_v2.JSON_CONTENT_TYPE)]
_AUTHORIZATION = AUTHORIZATION_HEADER.encode()


class CudaSharedMemory:
    """The CUDA regions of this server: always none. `regions`: the system shared memory regions,
    so that a status asked by a system region's name says which kind it is, as Triton's does;
    `access`: the tokens, for the check that registering comes from this host, as for system
    shared memory (a client elsewhere gets a 403, not the "GPUs not supported" answer)."""

    def __init__(self, regions: SharedMemoryRegions | None = None, access: AccessPolicy | None = None) -> None:
        self._regions = regions
        self._access = access

    def status(self, name: str | None) -> list[object]:
        if name is None:
            return []
        if self._regions is not None and any(region.name == name for region in self._regions.status(None)):
            raise NotFoundError(
                f"The region named '{name}' is registered as system shared memory, not CUDA shared memory"
            )
        raise NotFoundError(f"Unable to find cuda shared memory region: '{name}'")

    def register(self, name: str) -> None:
        raise InvalidRequestError(
            with_triton_phrase(
                f"failed to register CUDA shared memory region: '{name}', GPUs not supported",
                "inferd maps no GPU memory from clients; place the tensors in system shared memory "
                "(tritonclient.utils.shared_memory) or send them in the request",
            )
        )

    def unregister(self, name: str | None) -> None:
        """Nothing to unregister: no CUDA region is ever registered (an unknown name is not an error, as in Triton)."""

    def routes(self) -> tuple[Route, ...]:
        """The extension's routes on the KServe v2 door (`server.kserve`); register and unregister
        are management operations, as the system shared memory ones are."""
        return (
            Route("/v2/cudasharedmemory/status", READ, self._status),
            Route("/v2/cudasharedmemory/region/{region}/status", READ, self._status),
            Route("/v2/cudasharedmemory/region/{region}/register", ("POST",), self._register, Access.MANAGEMENT),
            Route("/v2/cudasharedmemory/unregister", ("POST",), self._unregister, Access.MANAGEMENT),
            Route("/v2/cudasharedmemory/region/{region}/unregister", ("POST",), self._unregister, Access.MANAGEMENT),
        )

    async def _status(self, request: HttpRequest, params: Params) -> HttpResponse:
        return json_response(self.status(params.get("region")))

    async def _register(self, request: HttpRequest, params: Params) -> HttpResponse:
        check_local_client(self._access, request.local_peer, request.headers.get(_AUTHORIZATION))
        self.register(params["region"])
        return HttpResponse(200, b"", list(_JSON_HEADERS))

    async def _unregister(self, request: HttpRequest, params: Params) -> HttpResponse:
        check_local_client(self._access, request.local_peer, request.headers.get(_AUTHORIZATION))
        self.unregister(params.get("region"))
        return HttpResponse(200, b"", list(_JSON_HEADERS))

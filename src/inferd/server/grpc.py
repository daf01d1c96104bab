"""KServe v2 over gRPC (`inference.GRPCInferenceService`) on grpc.aio.

ModelInfer and each request of ModelStreamInfer go through `server.inference_call.InferenceCall`
with the KServe codecs (`protocol.codecs.kserve`); the other methods call `InferenceService` and
encode with `protocol.grpc_v2`. Errors abort the call as `server.grpc_calls` says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from inferd.core.service import InferenceService
from inferd.errors import InferdError, UnsupportedError
from inferd.limits import RequestLimits
from inferd.protocol import grpc_v2, shared_memory
from inferd.protocol.codecs.kserve import KServeGrpcCodec, KServeStreamCodec
from inferd.server.auth import (
    Access,
    AccessPolicy,
    check_local_client,
    grpc_authorization,
    grpc_peer_is_local,
)
from inferd.server.cuda_shared_memory import CudaSharedMemory
from inferd.server.grpc_calls import abort, call, call_async, metadata_request_id
from inferd.server.inference_call import InferenceCall
from inferd.server.shared_memory import SharedMemoryRegions
from inferd.types import new_request_id

logger = logging.getLogger("inferd.grpc")

T = TypeVar("T")


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        service: InferenceService,
        call: InferenceCall,
        limits: RequestLimits,
        regions: SharedMemoryRegions | None = None,
        access: AccessPolicy | None = None,
    ) -> None:
        """`call`: the server's one inference call; `limits`: the server's, what one request may hold;
        `access`: the tokens, for shared memory's check of who is on this host."""
        self._service = service
        self._call = call
        self._codec = KServeGrpcCodec(limits, regions)
        self._stream_codec = KServeStreamCodec(limits, regions)
        self._regions = regions
        self._access = access
        self._cuda_shared_memory = CudaSharedMemory(regions, access)

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await call(context, "ServerLive", lambda: pb.ServerLiveResponse(live=self._service.live()))

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await call(context, "ServerReady", lambda: pb.ServerReadyResponse(ready=self._service.ready()))

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await call(
            context,
            "ModelReady",
            lambda: pb.ModelReadyResponse(ready=self._service.model_ready(request.name, request.version)),
        )

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await call(
            context, "ServerMetadata", lambda: grpc_v2.encode_server_metadata(self._service.server_metadata())
        )

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await call(
            context,
            "ModelMetadata",
            lambda: grpc_v2.encode_model_metadata(self._service.model_metadata(request.name, request.version)),
        )

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await call(
            context,
            "ModelConfig",
            lambda: grpc_v2.encode_model_config(self._service.model_config(request.name, request.version)),
        )

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await call(
            context,
            "ModelStatistics",
            lambda: grpc_v2.encode_statistics(self._service.model_statistics(request.name, request.version)),
        )

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def index() -> Any:
            return grpc_v2.encode_repository_index(await self._service.repository_index(ready_only=request.ready))

        return await call_async(context, "RepositoryIndex", index)

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def load() -> Any:
            config, files = grpc_v2.decode_load_parameters(request)
            await self._service.load_model(request.model_name, config_json=config, files=files)
            return pb.RepositoryModelLoadResponse()

        return await call_async(context, "RepositoryModelLoad", load)

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def unload() -> Any:
            dependents = grpc_v2.decode_unload_parameters(request)
            await self._service.unload_model(request.model_name, unload_dependents=dependents)
            return pb.RepositoryModelUnloadResponse()

        return await call_async(context, "RepositoryModelUnload", unload)

    def _shared_memory(self) -> SharedMemoryRegions:
        if self._regions is None:
            raise UnsupportedError("system shared memory is not served on this port")
        return self._regions

    def _check_local(self, context: grpc.aio.ServicerContext) -> None:
        authorization = grpc_authorization(context.invocation_metadata())
        check_local_client(self._access, grpc_peer_is_local(context.peer()), authorization)

    async def SystemSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await call(
            context,
            "SystemSharedMemoryStatus",
            lambda: shared_memory.status_proto(self._shared_memory().status(request.name or None)),
        )

    async def SystemSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        def register() -> Any:
            self._check_local(context)
            self._shared_memory().register(request.name, request.key, request.offset, request.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()

        return await call(context, "SystemSharedMemoryRegister", register)

    async def SystemSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        def unregister() -> Any:
            self._check_local(context)
            self._shared_memory().unregister(request.name or None)
            return pb.SystemSharedMemoryUnregisterResponse()

        return await call(context, "SystemSharedMemoryUnregister", unregister)

    async def CudaSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        def status() -> Any:
            self._cuda_shared_memory.status(request.name or None)  # no regions, or the error naming it
            return pb.CudaSharedMemoryStatusResponse()

        return await call(context, "CudaSharedMemoryStatus", status)

    async def CudaSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        def register() -> Any:
            self._check_local(context)
            self._cuda_shared_memory.register(request.name)
            return pb.CudaSharedMemoryRegisterResponse()

        return await call(context, "CudaSharedMemoryRegister", register)

    async def CudaSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        def unregister() -> Any:
            self._check_local(context)
            self._cuda_shared_memory.unregister(request.name or None)
            return pb.CudaSharedMemoryUnregisterResponse()

        return await call(context, "CudaSharedMemoryUnregister", unregister)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        """Bidirectional stream: each request's responses (a decoupled model's several, any other
        model's one) as they are made, requests served concurrently. An error is sent in the stream
        (`error_message`) and the stream goes on, as Triton does."""
        answers: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        metadata = dict(context.invocation_metadata() or ())

        async def serve(message: Any) -> None:
            await self._answer_streamed(message, metadata, answers)

        async def read() -> None:
            async for message in requests:
                task = asyncio.ensure_future(serve(message))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.wait(set(running))
            await answers.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _answer_streamed(self, message: Any, metadata: Mapping[str, Any], answers: asyncio.Queue[Any]) -> None:
        """Put one streamed request's responses (or its error) on the stream's queue of answers."""
        try:
            async for answer in self._call.stream(self._stream_codec, message, metadata):
                await answers.put(answer)
        except InferdError as exc:
            logger.warning("ModelStreamInfer -> %s: %s", exc.code.value, exc.logged)
            await answers.put(pb.ModelStreamInferResponse(error_message=exc.message))
        except Exception:
            logger.exception("unexpected error in ModelStreamInfer")
            await answers.put(pb.ModelStreamInferResponse(error_message="internal error; see the server log"))

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._call.unary(self._codec, request, context, SERVICE, "ModelInfer")


SERVICE = "inference.GRPCInferenceService"
_reported_unimplemented: set[str] = set()


def _unimplemented(method: str) -> Callable[..., Awaitable[None]]:
    """A method of the service inferd does not serve: UNIMPLEMENTED naming it (not the generated
    base's NotImplementedError, which grpc.aio turns into UNKNOWN and a traceback per call), logged
    once."""

    async def answer(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> None:
        if method not in _reported_unimplemented:
            _reported_unimplemented.add(method)
            logger.warning("a client called %s/%s, which inferd does not implement", SERVICE, method)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"inferd does not implement {SERVICE}/{method}")

    answer.__name__ = method
    return answer


for _method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
    if _method.name not in InferenceServicer.__dict__:
        setattr(InferenceServicer, _method.name, _unimplemented(_method.name))


def build_grpc_server(
    service: InferenceService,
    call: InferenceCall,
    *,
    limits: RequestLimits,
    max_message_bytes: int,
    regions: SharedMemoryRegions | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    access: AccessPolicy | None = None,
) -> grpc.aio.Server:
    server = new_grpc_server(max_message_bytes, interceptors)
    servicer = InferenceServicer(service, call, limits, regions, access)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    return server


def new_grpc_server(max_message_bytes: int, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> grpc.aio.Server:
    """A gRPC server with inferd's limits, for any door's services; `interceptors`: tokens' and
    tracing's, each only when on (an interceptor costs every call)."""
    return grpc.aio.server(
        interceptors=list(interceptors) or None,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )


# Methods by access (any service's, by method name); the rest are DATA. Health needs no token, as
# over HTTP; whatever changes the server's state (Triton's trace and log settings included) is
# management, as is TF Serving's ModelService/HandleReloadConfigRequest.
_GRPC_ACCESS = {
    **dict.fromkeys(("ServerLive", "ServerReady", "ModelReady", "Check", "Watch"), Access.PUBLIC),
    **dict.fromkeys(
        (
            "RepositoryModelLoad",
            "RepositoryModelUnload",
            "SystemSharedMemoryRegister",
            "SystemSharedMemoryUnregister",
            "CudaSharedMemoryRegister",
            "CudaSharedMemoryUnregister",
            "TraceSetting",
            "LogSettings",
            "HandleReloadConfigRequest",
        ),
        Access.MANAGEMENT,
    ),
}


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks the `authorization` metadata of each call against the access its method needs; a call
    without the right token is aborted UNAUTHENTICATED or PERMISSION_DENIED before its method runs."""

    def __init__(self, access: AccessPolicy) -> None:
        self._access = access

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = details.method.rpartition("/")[2]
        authorization = grpc_authorization(details.invocation_metadata)
        try:
            self._access.check(_GRPC_ACCESS.get(method, Access.DATA), authorization)
        except InferdError as error:
            return _refusing(await continuation(details), method, error)
        return await continuation(details)


def _refusing(handler: grpc.RpcMethodHandler | None, method: str, error: InferdError) -> grpc.RpcMethodHandler | None:
    """A handler of the same kind as `handler` that aborts with `error` (the method never runs)."""
    if handler is None:  # an unknown method: grpc answers UNIMPLEMENTED itself
        return None

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await abort(context, method, error, metadata_request_id(context) or new_request_id())

    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(
        refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )

"""Where a traced request's span begins and ends: around each HTTP door's inference routes, around
the gRPC inference methods (KServe's ModelInfer, TF Serving's Predict), and around each request of
a ModelStreamInfer stream (from its message to its last response).

Both read the W3C `traceparent` and `tracestate` the client sent (HTTP headers, gRPC metadata),
so a client's trace continues into inferd, and put the trace where the service finds it
(`server.tracing.current_trace`) for the request the door decodes. Installed only when the
server traces: a server that does not has the doors' own handlers and no interceptor, so its
requests do not pay for a test of whether to trace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

import grpc

from inferd.errors import InferdError
from inferd.server.grpc import ignore_failure
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.routes import Handler, Params, RouteGroup, Router
from inferd.server.tracing import RequestTrace, Tracing, current_trace

_TRACEPARENT, _TRACESTATE = b"traceparent", b"tracestate"

# gRPC methods traced: path -> (the door's name, how to read the model's name off the message).
_GRPC_METHODS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "/inference.GRPCInferenceService/ModelInfer": ("kserve_grpc", lambda message: message.model_name),
    "/tensorflow.serving.PredictionService/Predict": ("tfserving_grpc", lambda message: message.model_spec.name),
}


def traced_router(router: Router, tracing: Tracing) -> Router:
    """`router` with every inference route traced."""
    return router.wrap_inference(lambda route, group: _traced_handler(route.handler, group, tracing))


def _traced_handler(handler: Handler, group: RouteGroup, tracing: Tracing) -> Handler:
    door = {"inferd.protocol": group.protocol}

    async def traced(request: HttpRequest, params: Params) -> HttpResponse:
        headers = request.headers
        model = params.get("model", "")
        request_trace = tracing.begin(_text(headers.get(_TRACEPARENT)), _text(headers.get(_TRACESTATE)), model, door)
        if request_trace is None:  # not sampled: this is all it costs
            return await handler(request, params)
        request_trace.span.set_attributes({"http.request.method": request.method, "url.path": request.path})
        token = current_trace.set(request_trace)
        try:
            response = await handler(request, params)
        except InferdError as exc:
            # The status the door answers with (TF Serving's differ from KServe's).
            status, _, _ = group.encode_error(exc, exc.request_id or "")
            tracing.end(request_trace, {"http.response.status_code": status}, exc.code.value, exc.message)
            raise
        except asyncio.CancelledError:  # the client left
            tracing.end(request_trace, {}, "CANCELLED", "the client closed the connection")
            raise
        except Exception as exc:  # answered 500 by HttpApp
            tracing.end(request_trace, {"http.response.status_code": 500}, "INTERNAL", type(exc).__name__)
            raise
        finally:
            current_trace.reset(token)
        tracing.end(request_trace, {"http.response.status_code": response.status})
        return response

    return traced


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Traces the gRPC inference methods; every other method passes untouched."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = _GRPC_METHODS.get(details.method)
        if handler is None or method is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self._traced(handler.unary_unary, details, *method),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _traced(
        self,
        behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
        protocol: str,
        model_of: Callable[[Any], str],
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        metadata = dict(details.invocation_metadata or ())
        service, _, name = details.method.strip("/").partition("/")
        attributes = {"inferd.protocol": protocol, "rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        tracing = self._tracing

        async def traced(message: Any, context: grpc.aio.ServicerContext) -> Any:
            request_trace = tracing.begin(
                _text(metadata.get("traceparent")), _text(metadata.get("tracestate")), model_of(message), attributes
            )
            if request_trace is None:
                return await behavior(message, context)
            token = current_trace.set(request_trace)
            try:
                answer = await behavior(message, context)
            except BaseException:
                # The servicer answered an error by aborting: its status and inferd's code are on the context.
                _end_failed(tracing, request_trace, context)
                raise
            finally:
                current_trace.reset(token)
            tracing.end(request_trace, {"rpc.grpc.status_code": grpc.StatusCode.OK.value[0]})
            return answer

        return traced


# A streamed request's span: the stream's method (its status is the stream's, not the request's).
_STREAM_ATTRIBUTES = {
    "inferd.protocol": "kserve_grpc",
    "rpc.system": "grpc",
    "rpc.service": "inference.GRPCInferenceService",
    "rpc.method": "ModelStreamInfer",
}


class StreamTracer:
    """Each request of a ModelStreamInfer stream is a span of its own, continuing the trace in the
    stream's metadata (`traceparent`, sent once for the stream): a decoupled model's requests are
    traced as any other's (server.grpc.StreamRequestTracer)."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    def request(self, model: str, metadata: Mapping[str, Any]) -> AbstractContextManager[Callable[[str, str], None]]:
        request_trace = self._tracing.begin(
            _text(metadata.get("traceparent")), _text(metadata.get("tracestate")), model, _STREAM_ATTRIBUTES
        )
        if request_trace is None:  # not sampled
            return contextlib.nullcontext(ignore_failure)
        return _StreamRequestSpan(self._tracing, request_trace)


class _StreamRequestSpan:
    """The span of one streamed request, current while the request is served; ended when it is
    answered, failed (an error sent in the stream), or cancelled (the stream closed)."""

    def __init__(self, tracing: Tracing, request_trace: RequestTrace) -> None:
        self._tracing = tracing
        self._trace = request_trace
        self._failure = ("", "")
        self._token: Any = None

    def _report(self, error_code: str, message: str) -> None:
        self._failure = (error_code, message)

    def __enter__(self) -> Callable[[str, str], None]:
        self._token = current_trace.set(self._trace)
        return self._report

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        current_trace.reset(self._token)
        if kind is not None and issubclass(kind, asyncio.CancelledError):
            self._failure = ("CANCELLED", "the stream was closed")
        elif kind is not None:
            self._failure = ("INTERNAL", kind.__name__)
        self._tracing.end(self._trace, {}, *self._failure)


def _end_failed(tracing: Tracing, request_trace: RequestTrace, context: grpc.aio.ServicerContext) -> None:
    code = context.code()
    status = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.CANCELLED
    trailers = dict(context.trailing_metadata() or ())
    error_code = str(trailers.get("inferd-code") or status.name)
    tracing.end(request_trace, {"rpc.grpc.status_code": status.value[0]}, error_code, str(context.details() or ""))


def _text(value: bytes | str | None) -> str | None:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value

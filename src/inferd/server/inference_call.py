"""`InferenceCall`: the one place every door's inference goes through, over HTTP and gRPC alike.

A door is a route (or gRPC method) plus a codec pair (`protocol.codecs`); the call does the rest,
in this order, the same for all of them:

1. the target: the model and version the route names (a TF Serving label resolved through the
   model's config), or the one the body names (OpenAI's, read before anything else of the body);
   a target that is an endpoint becomes the model and version of the variant it routes the
   request to (`core.endpoints`: pinned by a header, sticky by one, else by weight), and the
   answer names the variant;
2. shedding: a model whose queue is full refuses the request before its body is decoded (a
   compressed body is not even inflated), counted as the refusal after decoding would be;
3. the request context: the request id (the transport's, else the body's, else a new one; the
   log's from then on), the deadline (Inferd-Timeout-Ms over HTTP, the call's deadline over gRPC),
   the door, the timing;
4. decoding, timed (with the model's signature first for codecs that read bodies by it);
5. the dispatcher (`core.dispatcher.Dispatcher.infer`, with the server's limits): the request's
   limits and classification, its handle, its scheduling, its count;
6. encoding, timed and reported to the statistics;
7. the answer: Server-Timing (HTTP header, gRPC trailer) when asked, the request id, and for a
   model that caches `Inferd-Cache` (hit or miss; the request's `Cache-Control: no-cache`, read at
   step 3, bypasses the cache); errors are answered by the transport from the one status table
   (`HttpApp` for HTTP, `grpc_calls.abort`).

When the server traces, the call's span begins before step 1 (continuing the client's W3C
traceparent: HTTP headers, gRPC metadata, a stream's for each of its requests) and ends with the
answer's status; the trace travels on the requests' `RequestTiming`, where core's hooks find it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol, TypeVar

import grpc

from inferd.config.parameters import VERSION_LABELS
from inferd.core.dispatcher import Dispatcher
from inferd.core.endpoints import Endpoint, Endpoints
from inferd.core.metrics import Metrics
from inferd.core.scheduler import Admission
from inferd.core.service import InferenceService
from inferd.errors import InferdError, InvalidRequestError, StreamOnlyModelError
from inferd.limits import RequestLimits
from inferd.protocol import http_compression, server_timing
from inferd.protocol.cache_headers import CACHE_CONTROL_HEADER, CACHE_HEADER, asks_fresh
from inferd.protocol.codecs.base import (
    Codec,
    GrpcCodec,
    HttpAnswer,
    HttpBody,
    HttpCodec,
    InflatedBody,
    Signature,
    StreamCodec,
    Target,
)
from inferd.protocol.endpoint_headers import (
    SAGEMAKER_INVOKED_VARIANT_HEADER,
    SAGEMAKER_TARGET_VARIANT_HEADER,
    TARGET_VARIANT_HEADER,
    VARIANT_HEADER,
)
from inferd.protocol.request_id import REQUEST_ID_HEADER, header_value
from inferd.protocol.status import http_status
from inferd.server.decoded_bytes import DecodedBytesBudget
from inferd.server.grpc_calls import abort, abort_unexpected
from inferd.server.http import TIMEOUT_HEADER, deadline
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.logging import current_request_id
from inferd.types import Door, InferRequest, InferResponse, RequestContext, RequestTiming, new_request_id

StateT = TypeVar("StateT")
AnswerT = TypeVar("AnswerT")

# The model config parameter that names versions, as TF Serving's `version_labels` does.

_REQUEST_ID = REQUEST_ID_HEADER.encode()
_SERVER_TIMING_REQUEST = server_timing.REQUEST_HEADER.encode()
_SERVER_TIMING_RESPONSE = server_timing.RESPONSE_HEADER.encode()
_CONTENT_ENCODING = b"content-encoding"
_VARIANT = VARIANT_HEADER.encode()
_TARGET_VARIANT = TARGET_VARIANT_HEADER.encode()
_CACHE_CONTROL = CACHE_CONTROL_HEADER.encode()
_CACHE = CACHE_HEADER.encode()
_SAGEMAKER_TARGET_VARIANT = SAGEMAKER_TARGET_VARIANT_HEADER.encode()
_SAGEMAKER_INVOKED_VARIANT = SAGEMAKER_INVOKED_VARIANT_HEADER.encode()
# An enum member read from its class costs a lookup through the metaclass (~60 ns on 3.11) on
# every request to an endpoint; a module global does not.
_SAGEMAKER_DOOR = Door.SAGEMAKER
# A request's header (HTTP) or metadata entry (gRPC) by its lower-case name, None when absent.
Header = Callable[[str], bytes | str | None]
_TIMEOUT = TIMEOUT_HEADER

# How an HTTP door names its target: the route's (a Target), or a function of the body (OpenAI's).
HttpTarget = Target | Callable[[HttpBody], Target]

_TRACEPARENT, _TRACESTATE = "traceparent", "tracestate"
_KSERVE_SERVICE = "inference.GRPCInferenceService"
# `trace` left out: the call decides whether to trace (a traced call passes its trace, or None).
_UNDECIDED = object()


class CallTracing(Protocol):
    """Where a traced call's span begins and ends (`server.tracing.Tracing`, when the server traces:
    this module imports no tracing library)."""

    def begin(self, traceparent: str | None, tracestate: str | None, model: str, attributes: Mapping[str, Any]) -> Any:
        """The trace of a call arriving now, continuing the client's; None when it is not sampled."""
        ...

    def end(self, trace: Any, attributes: Mapping[str, Any], error_code: str = "", message: str = "") -> None: ...


class InferenceCall:
    def __init__(
        self,
        service: InferenceService,
        *,
        max_request_bytes: int,
        decoded: DecodedBytesBudget,
        tracing: CallTracing | None = None,
        admission: Admission = Admission.REAL_TIME,
    ) -> None:
        """`max_request_bytes`: what a compressed body may inflate to (the limit uncompressed ones
        are held to); `decoded`: the server's budget for inflated bodies; `tracing`: when the server
        traces (a call that is not traced pays one test of this); `admission`: BACKGROUND for the
        call async jobs are run through (core.scheduler: only in the room real-time requests leave,
        refused by the background queue's own bound, never shed for the real-time one's)."""
        self._service = service
        self._max_request_bytes = max_request_bytes
        self._decoded = decoded
        self._tracing = tracing
        self._admission = admission
        self._sheds = admission is Admission.REAL_TIME

    # A client's request goes down to the dispatcher with the server's limits (core.dispatcher);
    # read from the service at the first request (the route tables are built before any).
    @cached_property
    def _dispatcher(self) -> Dispatcher:
        return self._service.dispatcher

    @cached_property
    def _limits(self) -> RequestLimits:
        return self._service.limits

    @cached_property
    def _metrics(self) -> Metrics:
        return self._service.metrics

    @cached_property
    def _endpoints(self) -> Endpoints:
        return self._service.endpoints.endpoints

    # -- HTTP ------------------------------------------------------------------------------------

    async def http(
        self, codec: HttpCodec[StateT], request: HttpRequest, target: HttpTarget, trace: object = _UNDECIDED
    ) -> HttpResponse:
        """An HTTP door's inference request, answered 200 with the codec's body; errors are raised
        for `HttpApp` to answer in the door's shape. `trace`: given by the traced call around this
        one (None when it did not sample the request); left out, the call is first traced when the
        server traces."""
        if trace is _UNDECIDED:
            if self._tracing is not None:
                return await self._traced_http(self._tracing, codec, request, target)
            trace = None
        headers = request.headers
        # `deadline` and `is_compressed` asked only when their header came (most requests send neither).
        deadline_s = deadline(headers) if _TIMEOUT in headers else None
        context = RequestContext(current_request_id.get(), deadline_s, codec.door, RequestTiming(), trace)
        if _CACHE_CONTROL in headers:
            context.cache_bypass = asks_fresh(headers[_CACHE_CONTROL])
        encoding = headers.get(_CONTENT_ENCODING)
        try:  # costs nothing unless something is raised (no frame of its own)
            if isinstance(target, Target) and (encoding is None or not http_compression.is_compressed(encoding)):
                if target.label:
                    await self._admit(target, codec.door, context, _http_header(headers))
                else:  # no coroutine where no label needs resolving (most requests)
                    endpoint = self._endpoints.get(target.model)
                    if endpoint is not None:
                        if (target.version or endpoint.sticky_header or _TARGET_VARIANT in headers
                                or _SAGEMAKER_TARGET_VARIANT in headers):  # fmt: skip
                            pinned = headers.get(_TARGET_VARIANT) or headers.get(_SAGEMAKER_TARGET_VARIANT)
                            key = headers.get(endpoint.sticky_header) if endpoint.sticky_header else None
                            self._route(endpoint, target, context, pinned, key)
                        else:  # most requests: by weight, the cycle's next (a C call: no frame)
                            chosen = context.route = endpoint.next_route()
                            target.model, target.version = chosen.model, chosen.version
                    if self._sheds:
                        self._dispatcher.shed(target.model, target.version, codec.door, context.route)
                try:
                    answer = await self._serve(codec, request, target, context)
                except StreamOnlyModelError as exc:
                    raise exc.unary_call("HTTP end point") from None
            else:
                answer = await self._serve_inflated(codec, request, target, context, encoding)
        except InferdError as exc:
            if context.route is not None:  # the error answer names the variant too
                exc.variant = context.route.variant
            raise
        answered = answer.headers
        answered.append((_REQUEST_ID, header_value(context.request_id).encode("ascii")))
        route = context.route
        if route is not None:
            answered.append((_VARIANT, route.variant_header))
            if codec.door is _SAGEMAKER_DOOR:
                answered.append((_SAGEMAKER_INVOKED_VARIANT, route.variant_header))
        if context.cache:
            answered.append((_CACHE, context.cache.encode()))
        timing_asked = headers.get(_SERVER_TIMING_REQUEST)
        if timing_asked is not None and server_timing.wanted(timing_asked):
            answered.append((_SERVER_TIMING_RESPONSE, server_timing.encode(context.timing).encode()))
        return HttpResponse(200, answer.body, answered)

    async def _traced_http(
        self, tracing: CallTracing, codec: HttpCodec[StateT], request: HttpRequest, target: HttpTarget
    ) -> HttpResponse:
        headers = request.headers
        attributes = {
            "inferd.protocol": codec.door.value,
            "http.request.method": request.method,
            "url.path": request.path,
        }
        model = target.model if isinstance(target, Target) else ""
        trace = tracing.begin(_text(headers.get(b"traceparent")), _text(headers.get(b"tracestate")), model, attributes)
        if trace is None:  # not sampled: this is all it costs
            return await self.http(codec, request, target, None)
        try:
            response = await self.http(codec, request, target, trace)
        except InferdError as exc:
            status = http_status(codec.door, exc.code)
            tracing.end(trace, {"http.response.status_code": status}, exc.code.value, exc.message)
            raise
        except asyncio.CancelledError:  # the client left
            tracing.end(trace, {}, "CANCELLED", "the client closed the connection")
            raise
        except Exception as exc:  # answered 500 by HttpApp
            tracing.end(trace, {"http.response.status_code": 500}, "INTERNAL", type(exc).__name__)
            raise
        tracing.end(trace, {"http.response.status_code": response.status})
        return response

    async def _serve_inflated(
        self,
        codec: HttpCodec[StateT],
        request: HttpRequest,
        target: HttpTarget,
        context: RequestContext,
        encoding: bytes | None,
    ) -> HttpAnswer:
        """`_serve` for a body that is compressed, or that names its target (read once inflated)."""
        if isinstance(target, Target):  # shed before inflating
            await self._admit(target, codec.door, context, _http_header(request.headers))
        # Held from before inflating until the answer is made: the body, and what it decodes to.
        reserved = 0
        try:
            raw: HttpBody = request
            if http_compression.is_compressed(encoding):
                reserved = self._decoded.reserve(self._decoded.bound(len(request.body), self._max_request_bytes))
                body = await self._decoded.inflate(request.body, encoding, self._max_request_bytes)
                self._decoded.release(reserved - len(body))
                reserved = len(body)
                raw = InflatedBody(body, request.headers)
            if not isinstance(target, Target):
                target = target(raw)
                await self._admit(target, codec.door, context, _http_header(request.headers))
            return await self._serve(codec, raw, target, context)
        except StreamOnlyModelError as exc:
            raise exc.unary_call("HTTP end point") from None
        finally:
            self._decoded.release(reserved)

    # -- gRPC ------------------------------------------------------------------------------------

    async def unary(
        self,
        codec: GrpcCodec[StateT],
        message: Any,
        context: grpc.aio.ServicerContext,
        service: str,
        method: str,
        trace: object = _UNDECIDED,
    ) -> Any:
        """A unary gRPC inference call (`service`'s `method`), answered with the codec's message; an
        error aborts the call with its status, message and inferd's trailers. `trace`: as `http`'s."""
        metadata = dict(context.invocation_metadata() or ())
        if trace is _UNDECIDED:
            if self._tracing is not None:
                return await self._traced_unary(self._tracing, codec, message, context, service, method, metadata)
            trace = None
        request_id = str(metadata.get(REQUEST_ID_HEADER, ""))
        token = current_request_id.set(request_id)
        remaining_s = context.time_remaining()
        call = RequestContext(
            request_id,
            time.monotonic() + remaining_s if remaining_s is not None else None,
            codec.door,
            RequestTiming(),
            trace,
        )
        call.cache_bypass = asks_fresh(metadata.get(CACHE_CONTROL_HEADER))
        try:
            target = codec.target(message)
            await self._admit(target, codec.door, call, metadata.get)
            answer = await self._serve(codec, message, target, call)
            trailers = [(REQUEST_ID_HEADER, header_value(call.request_id))]
            if call.route is not None:
                trailers.append((VARIANT_HEADER, call.route.variant))
            if call.cache:
                trailers.append((CACHE_HEADER, call.cache))
            if server_timing.wanted(metadata.get(server_timing.REQUEST_HEADER)):
                trailers.append((server_timing.RESPONSE_HEADER, server_timing.encode(call.timing)))
            context.set_trailing_metadata(tuple(trailers))
            return answer
        except InferdError as exc:
            if isinstance(exc, StreamOnlyModelError):
                exc = exc.unary_call(f"{method} RPC")
            if call.route is not None:  # the error names the variant too
                exc.variant = call.route.variant
            await abort(context, method, exc, exc.request_id or call.request_id or new_request_id())
        except Exception:
            await abort_unexpected(context, method, call.request_id)
        finally:
            current_request_id.reset(token)
        raise AssertionError("unreachable: abort raises")

    async def _traced_unary(
        self,
        tracing: CallTracing,
        codec: GrpcCodec[StateT],
        message: Any,
        context: grpc.aio.ServicerContext,
        service: str,
        method: str,
        metadata: Mapping[str, Any],
    ) -> Any:
        attributes = {"inferd.protocol": codec.door.value, "rpc.system": "grpc", "rpc.service": service,
                      "rpc.method": method}  # fmt: skip
        model = codec.target(message).model
        trace = tracing.begin(_text(metadata.get(_TRACEPARENT)), _text(metadata.get(_TRACESTATE)), model, attributes)
        if trace is None:  # not sampled
            return await self.unary(codec, message, context, service, method, None)
        try:
            answer = await self.unary(codec, message, context, service, method, trace)
        except BaseException:
            # The call was answered an error by aborting: its status and inferd's code are on the context.
            _end_aborted(tracing, trace, context)
            raise
        tracing.end(trace, {"rpc.grpc.status_code": grpc.StatusCode.OK.value[0]})
        return answer

    async def stream(self, codec: StreamCodec[StateT], message: Any, metadata: Mapping[str, Any]) -> AsyncIterator[Any]:
        """One request of a gRPC stream: its answers as the model makes them (a decoupled model's
        several, any other's one), then whatever closes it; errors are raised for the stream to send.
        Traced, each request is a span of its own, continuing the trace in the stream's metadata."""
        tracing = self._tracing
        trace = None
        if tracing is not None:
            trace = tracing.begin(
                _text(metadata.get(_TRACEPARENT)), _text(metadata.get(_TRACESTATE)), codec.target(message).model,
                {"inferd.protocol": codec.door.value, "rpc.system": "grpc", "rpc.service": _KSERVE_SERVICE,
                 "rpc.method": "ModelStreamInfer"},
            )  # fmt: skip
        if tracing is None or trace is None:
            async for answer in self._stream(codec, message, metadata, None):
                yield answer
            return
        failure = ("", "")
        try:
            async for answer in self._stream(codec, message, metadata, trace):
                yield answer
        except InferdError as exc:
            failure = (exc.code.value, exc.message)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            failure = ("CANCELLED", "the stream was closed")
            raise
        except Exception as exc:
            failure = ("INTERNAL", type(exc).__name__)
            raise
        finally:
            tracing.end(trace, {}, *failure)

    async def _stream(
        self, codec: StreamCodec[StateT], message: Any, metadata: Mapping[str, Any], trace: object
    ) -> AsyncIterator[Any]:
        call = RequestContext("", None, codec.door, RequestTiming(), trace)
        call.cache_bypass = asks_fresh(metadata.get(CACHE_CONTROL_HEADER))
        target = codec.target(message)
        await self._admit(target, codec.door, call, metadata.get)
        signature = await self._signature(target) if codec.reads_signature else None
        decode_started = time.perf_counter()
        decoded = codec.decode(message, target, call, signature)
        request = decoded.requests[0]
        call.timing.decode_s = time.perf_counter() - decode_started
        async for response in self._dispatcher.infer_stream(request, self._limits):
            encode_started = time.perf_counter()
            answer = codec.encode_streamed(response, decoded)
            encode_s = time.perf_counter() - encode_started
            call.timing.encode_s += encode_s
            self._metrics.response_encoded(response.model_name, response.model_version, call.door, encode_s)
            yield answer
        for answer in codec.stream_ended(decoded):
            yield answer

    # -- every transport -------------------------------------------------------------------------

    async def _admit(self, target: Target, door: Door, context: RequestContext, header: Header) -> None:
        """Resolve the target (in place): an endpoint's variant (the route kept on the `context`),
        a version label; then refuse it when its model's queue is full. `header`: the request's
        header (HTTP) or metadata (gRPC) of a lower-case name."""
        endpoint = self._endpoints.get(target.model)
        if endpoint is not None:
            pinned = header(TARGET_VARIANT_HEADER) or header(SAGEMAKER_TARGET_VARIANT_HEADER)
            sticky = endpoint.spec.sticky
            self._route(endpoint, target, context, pinned, header(sticky.lower()) if sticky else None)
        if target.label:
            target.version, target.label = await self.label_version(target.model, target.label), ""
        if self._sheds:
            self._dispatcher.shed(target.model, target.version, door, context.route)

    @staticmethod
    def _route(
        endpoint: Endpoint, target: Target, context: RequestContext, pinned: bytes | str | None, key: bytes | str | None
    ) -> None:
        """The endpoint's variant for this request (core.endpoints), `pinned` by the client or
        kept by its sticky `key` (header values): the target becomes the variant's model and
        version (in place), and the context keeps the route."""
        if target.version or target.label:
            raise InvalidRequestError(
                f"'{target.model}' is an endpoint: it has variants, not versions "
                f"(pin one with the {TARGET_VARIANT_HEADER} header)"
            )
        route = context.route = endpoint.route(_text(pinned) if pinned else None, _text(key))
        target.model, target.version = route.model, route.version

    async def _serve(
        self, codec: Codec[Any, StateT, AnswerT], raw: Any, target: Target, context: RequestContext
    ) -> AnswerT:
        signature = await self._signature(target) if codec.reads_signature else None
        decode_started = time.perf_counter()
        decoded = codec.decode(raw, target, context, signature)
        requests = decoded.requests
        current_request_id.set(context.request_id)
        context.timing.decode_s = time.perf_counter() - decode_started
        # NOTE: if the client disconnects meanwhile, the transport cancels this task; a request
        # still queued in a batcher is then dropped unrun.
        if len(requests) == 1:
            responses: Sequence[InferResponse] = (
                await self._dispatcher.infer(requests[0], self._limits, self._admission),
            )
        else:
            responses = await asyncio.gather(
                *(self._dispatcher.infer(request, self._limits, self._admission) for request in requests)
            )
            # A codec may give each request a context of its own (OpenAI's chunks): the call's answer
            # says a miss if any missed.
            said = {request.context.cache for request in requests}
            context.cache = "miss" if "miss" in said else "hit" if "hit" in said else context.cache
        encode_started = time.perf_counter()
        answer = codec.encode(responses, decoded)
        context.timing.encode_s = encode_s = time.perf_counter() - encode_started
        response = responses[0]
        self._metrics.response_encoded(response.model_name, response.model_version, context.door, encode_s)
        if context.route is not None and context.route.shadowed:
            self._shadow(context.route.endpoint, requests, responses)
        return answer

    def _shadow(self, name: str, requests: Sequence[InferRequest], responses: Sequence[InferResponse]) -> None:
        """Copy an endpoint's answered requests to its shadows (core.shadow): their tasks run once
        this call has handed its answer to the transport."""
        endpoint = self._endpoints.get(name)
        if endpoint is not None:
            for request, response in zip(requests, responses, strict=True):
                self._service.endpoints.shadows.offer(endpoint.shadows, request, response)

    async def _signature(self, target: Target) -> Signature:
        config = await self._service.serving_config(target.model, target.version)
        return Signature(config, lambda: self._service.model_metadata(target.model, target.version))

    async def label_version(self, model: str, label: str) -> str:
        """The version `label` names in the model's `version_labels` parameter ("stable:1,canary:2")."""
        config = await self._service.serving_config(model)
        labels = parse_version_labels(config.parameters.get(VERSION_LABELS.name, ""))
        if label not in labels:
            known = ", ".join(sorted(labels)) or f"none (set the '{VERSION_LABELS.name}' parameter)"
            raise InvalidRequestError(f"Unrecognized servable version label: {label} (model '{model}' labels: {known})")
        return labels[label]


def parse_version_labels(text: str) -> dict[str, str]:
    """ "stable:1,canary:2" -> {"stable": "1", "canary": "2"}; malformed entries are skipped."""
    labels: dict[str, str] = {}
    for entry in text.split(","):
        label, _, version = entry.strip().partition(":")
        if label and version.strip().isascii() and version.strip().isdigit():
            labels[label.strip()] = version.strip()
    return labels


def _end_aborted(tracing: CallTracing, trace: Any, context: grpc.aio.ServicerContext) -> None:
    code = context.code()
    status = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.CANCELLED
    trailers = dict(context.trailing_metadata() or ())
    error_code = str(trailers.get("inferd-code") or status.name)
    tracing.end(trace, {"rpc.grpc.status_code": status.value[0]}, error_code, str(context.details() or ""))


def _http_header(headers: Mapping[bytes, bytes]) -> Header:
    return lambda name: headers.get(name.encode("latin-1"))


def _text(value: bytes | str | None) -> str | None:
    return value.decode("latin-1") if isinstance(value, bytes) else value

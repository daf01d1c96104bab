"""`InferenceCall`: the one place every door's inference goes through, over HTTP and gRPC alike.

A door is a route (or gRPC method) plus a codec pair (`protocol.codecs`); the call does the rest,
in this order, the same for all of them:

1. the target: the model and version the route names (a TF Serving label resolved through the
   model's config), or the one the body names (OpenAI's, read before anything else of the body);
2. shedding: a model whose queue is full refuses the request before its body is decoded (a
   compressed body is not even inflated), counted as the refusal after decoding would be;
3. the request context: the request id (the transport's, else the body's, else a new one; the
   log's from then on), the deadline (Inferd-Timeout-Ms over HTTP, the call's deadline over gRPC),
   the door, the timing;
4. decoding, timed (with the model's signature first for codecs that read bodies by it);
5. the service (`core.service.InferenceService.infer`): limits, lookup, scheduling, statistics;
6. encoding, timed and reported to the statistics;
7. the answer: Server-Timing (HTTP header, gRPC trailer) when asked, the request id; errors are
   answered by the transport from the one status table (`HttpApp` for HTTP, `grpc_calls.abort`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc

from inferd.core.service import InferenceService
from inferd.errors import InferdError, InvalidRequestError, StreamOnlyModelError
from inferd.protocol import http_compression, server_timing
from inferd.protocol.codecs.base import (
    Codec,
    GrpcCodec,
    HttpAnswer,
    HttpBody,
    HttpCodec,
    InflatedBody,
    RequestContext,
    Signature,
    StreamCodec,
    Target,
)
from inferd.protocol.request_id import REQUEST_ID_HEADER, header_value
from inferd.server.decoded_bytes import DecodedBytesBudget
from inferd.server.grpc_calls import abort, abort_unexpected
from inferd.server.http import deadline
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.logging import current_request_id
from inferd.types import Door, InferResponse, new_request_id

StateT = TypeVar("StateT")
AnswerT = TypeVar("AnswerT")

# The model config parameter that names versions, as TF Serving's `version_labels` does.
VERSION_LABELS_PARAMETER = "version_labels"

_REQUEST_ID = REQUEST_ID_HEADER.encode()
_SERVER_TIMING_REQUEST = server_timing.REQUEST_HEADER.encode()
_SERVER_TIMING_RESPONSE = server_timing.RESPONSE_HEADER.encode()
_CONTENT_ENCODING = b"content-encoding"

# How an HTTP door names its target: the route's (a Target), or a function of the body (OpenAI's).
HttpTarget = Target | Callable[[HttpBody], Target]


class InferenceCall:
    def __init__(self, service: InferenceService, *, max_request_bytes: int, decoded: DecodedBytesBudget) -> None:
        """`max_request_bytes`: what a compressed body may inflate to (the limit uncompressed ones
        are held to); `decoded`: the server's budget for inflated bodies."""
        self._service = service
        self._max_request_bytes = max_request_bytes
        self._decoded = decoded

    # -- HTTP ------------------------------------------------------------------------------------

    async def http(self, codec: HttpCodec[StateT], request: HttpRequest, target: HttpTarget) -> HttpResponse:
        """An HTTP door's inference request, answered 200 with the codec's body; errors are raised
        for `HttpApp` to answer in the door's shape."""
        context = RequestContext(current_request_id.get(), deadline(request.headers), codec.door)
        encoding = request.headers.get(_CONTENT_ENCODING)
        if isinstance(target, Target) and not http_compression.is_compressed(encoding):
            if not self._admit_named(target, codec.door):
                await self._admit(target, codec.door)
            try:
                answer = await self._serve(codec, request, target, context)
            except StreamOnlyModelError as exc:
                raise exc.unary_call("HTTP end point") from None
        else:
            answer = await self._serve_inflated(codec, request, target, context, encoding)
        headers = answer.headers
        headers.append((_REQUEST_ID, header_value(context.request_id).encode("ascii")))
        if server_timing.wanted(request.headers.get(_SERVER_TIMING_REQUEST)):
            headers.append((_SERVER_TIMING_RESPONSE, server_timing.encode(context.timing).encode()))
        return HttpResponse(200, answer.body, headers)

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
            await self._admit(target, codec.door)
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
                await self._admit(target, codec.door)
            return await self._serve(codec, raw, target, context)
        except StreamOnlyModelError as exc:
            raise exc.unary_call("HTTP end point") from None
        finally:
            self._decoded.release(reserved)

    # -- gRPC ------------------------------------------------------------------------------------

    async def grpc(self, codec: GrpcCodec[StateT], message: Any, context: grpc.aio.ServicerContext, method: str) -> Any:
        """A unary gRPC inference call, answered with the codec's message; an error aborts the call
        with its status, message and inferd's trailers."""
        metadata = dict(context.invocation_metadata() or ())
        request_id = str(metadata.get(REQUEST_ID_HEADER, ""))
        token = current_request_id.set(request_id)
        remaining_s = context.time_remaining()
        call = RequestContext(
            request_id, time.monotonic() + remaining_s if remaining_s is not None else None, codec.door
        )
        try:
            target = codec.target(message)
            if not self._admit_named(target, codec.door):
                await self._admit(target, codec.door)
            answer = await self._serve(codec, message, target, call)
            trailers = [(REQUEST_ID_HEADER, header_value(call.request_id))]
            if server_timing.wanted(metadata.get(server_timing.REQUEST_HEADER)):
                trailers.append((server_timing.RESPONSE_HEADER, server_timing.encode(call.timing)))
            context.set_trailing_metadata(tuple(trailers))
            return answer
        except InferdError as exc:
            if isinstance(exc, StreamOnlyModelError):
                exc = exc.unary_call(f"{method} RPC")
            await abort(context, method, exc, exc.request_id or call.request_id or new_request_id())
        except Exception:
            await abort_unexpected(context, method, call.request_id)
        finally:
            current_request_id.reset(token)
        raise AssertionError("unreachable: abort raises")

    async def stream(self, codec: StreamCodec[StateT], message: Any) -> AsyncIterator[Any]:
        """One request of a gRPC stream: its answers as the model makes them (a decoupled model's
        several, any other's one), then whatever closes it; errors are raised for the stream to send."""
        call = RequestContext("", None, codec.door)
        target = codec.target(message)
        await self._admit(target, codec.door)
        signature = await self._signature(target) if codec.needs_signature(message) else None
        decode_started = time.perf_counter()
        decoded = codec.decode(message, target, call, signature)
        request = decoded.requests[0]
        call.request_id = request.request_id
        call.timing.decode_s = time.perf_counter() - decode_started
        async for response in self._service.infer_stream(request):
            encode_started = time.perf_counter()
            answer = codec.encode_streamed(response, decoded)
            encode_s = time.perf_counter() - encode_started
            call.timing.encode_s += encode_s
            self._service.response_encoded(response, encode_s)
            yield answer
        for answer in codec.stream_ended(decoded):
            yield answer

    # -- every transport -------------------------------------------------------------------------

    async def _admit(self, target: Target, door: Door) -> None:
        """Resolve the target's version label (in place), then refuse it when its model's queue is full."""
        if target.label:
            target.version, target.label = await self.label_version(target.model, target.label), ""
        self._service.shed(target.model, target.version, door)

    def _admit_named(self, target: Target, door: Door) -> bool:
        """`_admit` without a coroutine where no label needs resolving (most requests): False when
        the target has a label, which `_admit` must resolve."""
        if target.label:
            return False
        self._service.shed(target.model, target.version, door)
        return True

    async def _serve(
        self, codec: Codec[Any, StateT, AnswerT], raw: Any, target: Target, context: RequestContext
    ) -> AnswerT:
        signature = await self._signature(target) if codec.needs_signature(raw) else None
        decode_started = time.perf_counter()
        decoded = codec.decode(raw, target, context, signature)
        requests = decoded.requests
        context.request_id = requests[0].request_id
        current_request_id.set(context.request_id)
        context.timing.decode_s = time.perf_counter() - decode_started
        # NOTE: if the client disconnects meanwhile, the transport cancels this task; a request
        # still queued in a batcher is then dropped unrun.
        if len(requests) == 1:
            responses: Sequence[InferResponse] = (await self._service.infer(requests[0]),)
        else:
            responses = await asyncio.gather(*(self._service.infer(request) for request in requests))
        encode_started = time.perf_counter()
        answer = codec.encode(responses, decoded)
        context.timing.encode_s = encode_s = time.perf_counter() - encode_started
        self._service.response_encoded(responses[0], encode_s)
        return answer

    async def _signature(self, target: Target) -> Signature:
        config = await self._service.serving_config(target.model, target.version)
        return Signature(config, self._service.model_metadata(target.model, target.version))

    async def label_version(self, model: str, label: str) -> str:
        """The version `label` names in the model's `version_labels` parameter ("stable:1,canary:2")."""
        config = await self._service.serving_config(model)
        labels = parse_version_labels(config.parameters.get(VERSION_LABELS_PARAMETER, ""))
        if label not in labels:
            known = ", ".join(sorted(labels)) or f"none (set the '{VERSION_LABELS_PARAMETER}' parameter)"
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

"""KServe v2's codec pairs: JSON (with the binary tensor extension) over HTTP, protobuf over gRPC.

The HTTP pair serves every door that takes v2 bodies: KServe's own route, SageMaker's
/invocations (JSON v2 bodies and Triton's SageMaker binary+json) and TorchServe's /predictions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inferd.errors import MalformedRequestError
from inferd.limits import RequestLimits
from inferd.protocol import grpc_v2, http_compression, json_v2
from inferd.protocol.codecs.base import (
    Decoded,
    HttpAnswer,
    HttpBody,
    Signature,
    Target,
)
from inferd.protocol.shared_memory import RegionAccess
from inferd.types import Door, InferRequest, InferResponse, RequestContext

_HEADER_LENGTH = json_v2.HEADER_LENGTH_HEADER.encode()
_ACCEPT_ENCODING = b"accept-encoding"


def header_length_header(raw: HttpBody) -> int | None:
    """The JSON header's length as Inference-Header-Content-Length gives it (None: the whole body)."""
    value = raw.headers.get(_HEADER_LENGTH)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise MalformedRequestError(
            f"Inference-Header-Content-Length {value.decode('latin-1')!r} is not an integer"
        ) from None


@dataclass(frozen=True, slots=True)
class KServeHttpCodec:
    """v2 JSON bodies, binary tensors after a JSON header, tensors in shared memory; answers
    compressed when the client accepts it (as Triton does)."""

    # The server's: what one request may hold, checked as the body is decoded (before allocating).
    limits: RequestLimits
    door: Door = Door.KSERVE_HTTP
    regions: RegionAccess | None = None
    # Where the door carries the JSON header's length (SageMaker: in the content type).
    header_length: Callable[[HttpBody], int | None] = header_length_header

    reads_signature = False

    def decode(
        self, raw: HttpBody, target: Target, context: RequestContext, signature: Signature | None
    ) -> Decoded[bytes | None]:
        request = json_v2.decode_request(
            raw.body,
            limits=self.limits,
            model_name=target.model,
            model_version=target.version,
            header_length=self.header_length(raw),
            context=context,
            regions=self.regions,
        )
        return Decoded((request,), raw.headers.get(_ACCEPT_ENCODING))

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[bytes | None]) -> HttpAnswer:
        payload, json_length = json_v2.encode_response(responses[0], decoded.requests[0], self.regions)
        if json_length is None:
            headers = [(b"content-type", json_v2.JSON_CONTENT_TYPE)]
        else:
            headers = [(b"content-type", json_v2.BINARY_CONTENT_TYPE), (_HEADER_LENGTH, str(json_length).encode())]
        encoding = http_compression.response_encoding(decoded.state)
        if encoding is not None:
            payload = http_compression.encode_body(payload, encoding)
            headers.append((b"content-encoding", encoding.encode()))
        return HttpAnswer(payload, headers)


def message_target(message: Any) -> Target:
    """The model a `ModelInferRequest` names: the unary call's and each of a stream's."""
    return Target(message.model_name, message.model_version)


@dataclass(frozen=True, slots=True)
class KServeGrpcCodec:
    """`ModelInferRequest` / `ModelInferResponse`, for the unary call and each request of a stream."""

    # The server's: what one request may hold, checked as the body is decoded (before allocating).
    limits: RequestLimits
    regions: RegionAccess | None = None
    door: Door = Door.KSERVE_GRPC

    @staticmethod
    def target(message: Any) -> Target:
        return message_target(message)

    reads_signature = False

    def decode(self, raw: Any, target: Target, context: RequestContext, signature: Signature | None) -> Decoded[None]:
        request = grpc_v2.decode_request(
            raw, limits=self.limits, context=context, regions=self.regions, target=(target.model, target.version)
        )
        return Decoded((request,), None)

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[None]) -> Any:
        return self.encode_one(responses[0], decoded.requests[0])

    def encode_one(self, response: InferResponse, request: InferRequest) -> Any:
        return grpc_v2.encode_response(response, request, self.regions)


@dataclass(frozen=True, slots=True)
class KServeStreamCodec:
    """Each request of a `ModelStreamInfer` stream: a decoupled model's responses marked final only
    by the empty response the request may ask for; any other model's one response marked final."""

    # The server's: what one request may hold, checked as the body is decoded (before allocating).
    limits: RequestLimits
    regions: RegionAccess | None = None
    door: Door = Door.KSERVE_GRPC

    @staticmethod
    def target(message: Any) -> Target:
        return message_target(message)

    reads_signature = True  # whether the model is decoupled

    def decode(self, raw: Any, target: Target, context: RequestContext, signature: Signature | None) -> Decoded[bool]:
        assert signature is not None, "reads_signature"
        request = grpc_v2.decode_request(
            raw, limits=self.limits, context=context, regions=self.regions, target=(target.model, target.version)
        )
        return Decoded((request,), signature.config.decoupled)

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[bool]) -> Any:
        return self.encode_streamed(responses[0], decoded)

    def encode_streamed(self, response: InferResponse, decoded: Decoded[bool]) -> Any:
        return grpc_v2.encode_stream_response(response, decoded.requests[0], not decoded.state, self.regions)

    def stream_ended(self, decoded: Decoded[bool]) -> Sequence[Any]:
        request = decoded.requests[0]
        if decoded.state and request.parameters.get(grpc_v2.EMPTY_FINAL_RESPONSE):
            return (grpc_v2.empty_final_response(request),)
        return ()

"""TF Serving's codec pairs: a `:predict` JSON body (row or columnar) over REST, and a
`PredictRequest` over gRPC. The REST pair also reads SageMaker's TF Serving-shaped JSON bodies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferd.limits import RequestLimits
from inferd.protocol import json_v2, tfserving_grpc, tfserving_json
from inferd.protocol.codecs.base import Decoded, HttpAnswer, HttpBody, Signature, Target
from inferd.types import Door, InferResponse, RequestContext

_JSON = b"application/json"


@dataclass(frozen=True, slots=True)
class TfServingRestCodec:
    """`{"instances": ...}` answered with `{"predictions": ...}`; `{"inputs": ...}` with `{"outputs": ...}`."""

    door: Door = Door.TFSERVING_REST

    reads_signature = True

    def decode(
        self, raw: HttpBody, target: Target, context: RequestContext, signature: Signature | None
    ) -> Decoded[bool]:
        decoded = self.decode_document(json_v2.load_json(raw.body), target, context, signature)
        tfserving_json.refuse_bfloat16(decoded.requests[0].inputs, answering=False)
        return decoded

    @staticmethod
    def decode_document(
        document: Any, target: Target, context: RequestContext, signature: Signature | None
    ) -> Decoded[bool]:
        """A body parsed already (SageMaker's door parses it to tell v2 bodies from TF Serving's)."""
        assert signature is not None, "reads_signature"
        body = tfserving_json.decode_predict(document, signature.metadata)
        return Decoded((context.request(target.model, target.version, body.inputs),), body.row_format)

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[bool]) -> HttpAnswer:
        tfserving_json.refuse_bfloat16(responses[0].outputs, answering=True)
        return HttpAnswer(
            tfserving_json.encode_predict(responses[0].outputs, row_format=decoded.state), [(b"content-type", _JSON)]
        )


@dataclass(frozen=True, slots=True)
class TfServingGrpcCodec:
    """`PredictRequest` (its `output_filter` the outputs asked for) answered with a `PredictResponse`."""

    # The server's: what one request may hold, checked as the body is decoded (before allocating).
    limits: RequestLimits
    door: Door = Door.TFSERVING_GRPC

    @staticmethod
    def target(message: Any) -> Target:
        version, label = tfserving_grpc.model_spec_version(message.model_spec)
        return Target(message.model_spec.name, version, label)

    reads_signature = False

    def decode(self, raw: Any, target: Target, context: RequestContext, signature: Signature | None) -> Decoded[None]:
        inputs, outputs = tfserving_grpc.decode_predict(raw, self.limits)
        return Decoded((context.request(target.model, target.version, inputs, outputs),), None)

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[None]) -> Any:
        response = responses[0]
        return tfserving_grpc.encode_predict(response.outputs, response.model_name, response.model_version)

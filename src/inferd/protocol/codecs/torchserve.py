"""TorchServe's /predictions codec: a JSON body (a v2 request, or TF Serving's columnar `inputs`
value naming the model's inputs), or a raw body handed unread to the model's BYTES input, as
TorchServe hands a body to its handler; answered as TorchServe's handlers answer (see
`protocol.torchserve`), or in v2's shape for a v2 body."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig, TensorConfig
from inferd.config.parameters import TORCHSERVE_BODY_INPUT
from inferd.errors import InvalidRequestError
from inferd.protocol import json_v2, sagemaker, tfserving_json, torchserve
from inferd.protocol.codecs.base import Decoded, HttpAnswer, HttpBody, Signature, Target
from inferd.protocol.codecs.kserve import KServeHttpCodec
from inferd.types import DataType, Door, InferResponse, RequestContext, Tensor

_JSON = b"application/json"


@dataclass(frozen=True, slots=True)
class TorchServeCodec:
    # v2 bodies' codec (KServeHttpCodec(limits, Door.TORCHSERVE, regions)).
    v2: KServeHttpCodec
    door: Door = Door.TORCHSERVE

    # The model first: an unknown one is a 404 whatever its body holds (a body curl -T sends
    # was a 400 "not valid JSON" for a model that does not exist).
    reads_signature = True

    def decode(
        self, raw: HttpBody, target: Target, context: RequestContext, signature: Signature | None
    ) -> Decoded[tuple[bool, Any]]:
        assert signature is not None, "reads_signature"
        body_input = _body_input(signature.config)
        content_type = raw.headers.get(b"content-type")
        # TorchServe's documented `curl -T file` (a PUT) and `requests.post(url, data=...)` send no
        # Content-Type, and TorchServe hands such a body to the handler as bytes: so does inferd,
        # to the model's body input; only a model without one reads it as JSON.
        as_json = sagemaker.media_type(content_type)[0] == sagemaker.JSON if content_type else body_input is None
        if not as_json:
            inputs: tuple[Tensor, ...] = (_raw_body(raw.body, signature.config, body_input),)
        else:
            document = json_v2.load_json(raw.body)
            if sagemaker.is_v2_body(document):  # the v2 codec reads the raw body (binary parts, large data)
                decoded = self.v2.decode(raw, target, context, signature)
                return Decoded(decoded.requests, (True, decoded.state))
            inputs = tfserving_json.decode_columns(document, signature.metadata)
        return Decoded((context.request(target.model, target.version, inputs),), (False, None))

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[tuple[bool, Any]]) -> HttpAnswer:
        is_v2, state = decoded.state
        if is_v2:
            return self.v2.encode(responses, Decoded(decoded.requests, state))
        return HttpAnswer(torchserve.encode_outputs(responses[0].outputs), [(b"content-type", _JSON)])


def _body_input(config: ModelConfig) -> TensorConfig | None:
    """The BYTES input a raw body goes to: the one the model has, or the one its
    `torchserve_body_input` parameter names; None when that names no single input."""
    named = config.parameters.get(TORCHSERVE_BODY_INPUT.name, "")
    candidates = [t for t in config.inputs if t.datatype is DataType.BYTES and (not named or t.name == named)]
    return candidates[0] if len(candidates) == 1 else None


def _raw_body(body: bytes, config: ModelConfig, tensor: TensorConfig | None) -> Tensor:
    """The body, unread, as one element of the model's body input (one row when it batches)."""
    if tensor is None:
        raise InvalidRequestError(
            f"model '{config.name}' takes no raw body: send application/json, or give the model one BYTES "
            f"input (or name it in the '{TORCHSERVE_BODY_INPUT.name}' parameter)"
        )
    shape = (*((1,) if config.max_batch_size > 0 else ()), *(1 for _ in tensor.dims))
    data = np.empty(1, dtype=object)
    data[0] = body
    return Tensor(tensor.name, DataType.BYTES, shape, data.reshape(shape))

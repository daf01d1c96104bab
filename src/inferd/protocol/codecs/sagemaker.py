"""SageMaker's /invocations codecs, one per content type (the door picks by Content-Type):
JSON bodies (v2's or TF Serving's, told apart by their shape), Triton's SageMaker binary+json, and
one array in NumPy's .npy or CSV (the model's single input; answered by its single output, or JSON).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.errors import InvalidRequestError, NotAcceptableError, TensorDataError
from inferd.limits import RequestLimits
from inferd.protocol import json_v2, sagemaker, tfserving_json
from inferd.protocol.codecs.base import Decoded, HttpAnswer, HttpBody, Signature, Target
from inferd.protocol.codecs.kserve import KServeHttpCodec
from inferd.protocol.codecs.tfserving import TfServingRestCodec
from inferd.protocol.shared_memory import RegionAccess
from inferd.types import DataType, Door, InferResponse, RequestContext, Tensor

_CONTENT_TYPE = b"content-type"
_ACCEPT = b"accept"


def binary_header_length(raw: HttpBody) -> int:
    """The JSON header's length of a binary+json body: its content type's `json-header-size`."""
    _, parameters = sagemaker.media_type(raw.headers.get(_CONTENT_TYPE))
    value = parameters.get(sagemaker.HEADER_SIZE_PARAMETER, "")
    if not (value.isascii() and value.isdigit()) or int(value) > len(raw.body):
        raise InvalidRequestError(
            f"{sagemaker.TRITON_BINARY} needs {sagemaker.HEADER_SIZE_PARAMETER}=N, "
            f"N at most the body's {len(raw.body)} bytes; got {value!r}"
        )
    return int(value)


@dataclass(frozen=True, slots=True)
class SageMakerJsonCodec:
    """A JSON body: a v2 request (`inputs` a list of named tensors) by the v2 codec, which reads
    the raw body (binary parts, large data); anything else as a TF Serving `:predict` body."""

    v2: KServeHttpCodec
    tfserving: TfServingRestCodec = field(default_factory=lambda: TfServingRestCodec(Door.SAGEMAKER))
    door: Door = Door.SAGEMAKER

    # A TF Serving body is read by the model's inputs; which a body is shows only once parsed.
    reads_signature = True

    def decode(
        self, raw: HttpBody, target: Target, context: RequestContext, signature: Signature | None
    ) -> Decoded[tuple[bool, Any]]:
        document = json_v2.load_json(raw.body)
        if sagemaker.is_v2_body(document):
            decoded_v2 = self.v2.decode(raw, target, context, signature)
            return Decoded(decoded_v2.requests, (True, decoded_v2.state))
        decoded_tf = self.tfserving.decode_document(document, target, context, signature)
        return Decoded(decoded_tf.requests, (False, decoded_tf.state))

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[tuple[bool, Any]]) -> HttpAnswer:
        is_v2, state = decoded.state
        if is_v2:
            return self.v2.encode(responses, Decoded(decoded.requests, state))
        return self.tfserving.encode(responses, Decoded(decoded.requests, state))


def json_codecs(limits: RequestLimits, regions: RegionAccess | None) -> tuple[SageMakerJsonCodec, KServeHttpCodec]:
    """The codecs of JSON bodies and of Triton's binary+json bodies, holding requests to `limits`."""
    v2 = KServeHttpCodec(limits, Door.SAGEMAKER, regions)
    return SageMakerJsonCodec(v2), KServeHttpCodec(limits, Door.SAGEMAKER, regions, binary_header_length)


@dataclass(frozen=True, slots=True)
class SageMakerArrayCodec:
    """One array (.npy or CSV) as the model's single input, NumPy's default types converted to the
    model's where nothing is lost in kind; answered as the Accept header asks (the single output as
    .npy or CSV, or every output as JSON rows)."""

    kind: str  # sagemaker.NPY or sagemaker.CSV
    door: Door = Door.SAGEMAKER

    reads_signature = True

    def decode(
        self, raw: HttpBody, target: Target, context: RequestContext, signature: Signature | None
    ) -> Decoded[str]:
        assert signature is not None, "reads_signature"
        answer = sagemaker.answer_type(raw.headers.get(_ACCEPT), sagemaker.JSON)
        inputs = signature.metadata.inputs
        if len(inputs) != 1:
            raise InvalidRequestError(
                f"model '{target.model}' has {len(inputs)} inputs; a {self.kind} body holds one array: "
                "send JSON naming each input"
            )
        spec = inputs[0]
        datatype = DataType.from_wire(spec.datatype)
        array = (
            sagemaker.decode_npy(raw.body) if self.kind == sagemaker.NPY else sagemaker.decode_csv(raw.body, datatype)
        )
        array = _as_datatype(array, datatype)
        try:
            sent = DataType.from_numpy(array.dtype)
        except ValueError:
            raise TensorDataError(
                f"the array's dtype {array.dtype} is not one inferd serves", tensor=spec.name
            ) from None
        tensor = Tensor(spec.name, sent, array.shape, array)
        return Decoded((context.request(target.model, target.version, (tensor,)),), answer)

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[str]) -> HttpAnswer:
        answer, response = decoded.state, responses[0]
        return HttpAnswer(_encode(response, answer), [(_CONTENT_TYPE, answer.encode())])


def _encode(response: InferResponse, answer: str) -> bytes:
    if answer == sagemaker.JSON:
        return tfserving_json.encode_predict(response.outputs, row_format=True)
    if len(response.outputs) != 1:
        raise NotAcceptableError(
            f"model '{response.model_name}' has {len(response.outputs)} outputs; {answer} holds one array: "
            "accept application/json"
        )
    data = response.outputs[0].data
    return sagemaker.encode_npy(data) if answer == sagemaker.NPY else sagemaker.encode_csv(data)


def _as_datatype(array: np.ndarray[Any, Any], datatype: DataType) -> np.ndarray[Any, Any]:
    """NumPy's default types (float64, int64, fixed-width strings) as the model's, where nothing is lost
    in kind; anything else is left for the model's checks to name."""
    if datatype is DataType.BYTES and array.dtype.kind in "SU":
        converted = np.empty(array.shape, dtype=object)
        flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1).tolist()]
        converted.reshape(-1)[:] = flat
        return converted
    target = datatype.numpy_dtype
    if datatype is DataType.BF16 and array.dtype.kind in "fiu":  # numbers, rounded to bfloat16 as a cast does
        return array.astype(target)
    if datatype is not DataType.BYTES and array.dtype != target and np.can_cast(array.dtype, target, "same_kind"):
        return array.astype(target)
    return array

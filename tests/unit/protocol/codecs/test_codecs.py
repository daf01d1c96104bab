"""Each door's codec pair alone: what `decode` makes of a body (requests with the call's context)
and what `encode` makes of responses. The transports (`server.inference_call`) are the e2e tests'."""

from __future__ import annotations

import base64
import gzip
import io
from typing import Any

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from inferd.config.model import ModelConfig, TensorConfig
from inferd.errors import InvalidRequestError, MalformedRequestError, NotAcceptableError, RequestTooLargeError
from inferd.limits import UNLIMITED, RequestLimits
from inferd.protocol import grpc_v2, sagemaker, tfserving_grpc
from inferd.protocol.codecs.base import Decoded, HttpBody, InflatedBody, Signature, Target
from inferd.protocol.codecs.kserve import KServeGrpcCodec, KServeHttpCodec, KServeStreamCodec
from inferd.protocol.codecs.openai import OpenAiEmbeddingsCodec
from inferd.protocol.codecs.sagemaker import SageMakerArrayCodec, json_codecs
from inferd.protocol.codecs.tfserving import TfServingGrpcCodec, TfServingRestCodec
from inferd.protocol.codecs.torchserve import TorchServeCodec
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as tfs
from inferd.types import DataType, Door, InferResponse, ModelMetadata, RequestContext, Tensor, TensorMetadata

# A server's limits, as its codecs are given them (the defaults: these bodies are far below).
LIMITS = RequestLimits()


def fp32(name: str, rows: list[list[float]]) -> Tensor:
    data = np.array(rows, dtype=np.float32)
    return Tensor(name, DataType.FP32, data.shape, data)


def signature(config: ModelConfig) -> Signature:
    def described(tensor: TensorConfig) -> TensorMetadata:
        shape = ((-1,) if config.max_batch_size else ()) + tensor.dims
        return TensorMetadata(tensor.name, tensor.datatype.value, shape)

    metadata = ModelMetadata(
        config.name, ("1",), "", tuple(map(described, config.inputs)), tuple(map(described, config.outputs))
    )
    return Signature(config, lambda: metadata)


MLP = ModelConfig(
    name="mlp",
    max_batch_size=8,
    inputs=(TensorConfig("x", DataType.FP32, (2,)),),
    outputs=(TensorConfig("y", DataType.FP32, (2,)),),
)
TEXT = ModelConfig(
    name="text",
    max_batch_size=2,
    inputs=(TensorConfig("TEXT", DataType.BYTES, (1,)),),
    outputs=(TensorConfig("EMBEDDING", DataType.FP32, (3,)), TensorConfig("TOKENS", DataType.INT64, (1,))),
    parameters={"embedding_input": "TEXT", "embedding_output": "EMBEDDING", "embedding_token_count": "TOKENS"},
)


def context(door: Door, request_id: str = "", deadline_s: float | None = None) -> RequestContext:
    return RequestContext(request_id, deadline_s, door)


def answer(model: str, *outputs: Tensor) -> InferResponse:
    return InferResponse(model_name=model, model_version="1", request_id="r", outputs=outputs)


def http(body: bytes, **headers: str) -> HttpBody:
    return InflatedBody(body, {k.replace("_", "-").encode(): v.encode() for k, v in headers.items()})


# -- KServe v2 -------------------------------------------------------------------------------------


def test_v2_http_decodes_with_the_call_context_and_the_body_id_when_the_transport_sent_none() -> None:
    body = orjson.dumps({"id": "abc", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
    call = context(Door.KSERVE_HTTP, deadline_s=12.5)
    decoded = KServeHttpCodec(LIMITS).decode(http(body), Target("mlp", "1"), call, None)
    (request,) = decoded.requests
    assert (request.model_name, request.model_version, request.context.request_id) == ("mlp", "1", "abc")
    assert request.context.deadline_s == 12.5 and request.context.door is Door.KSERVE_HTTP
    assert request.context is call  # decode and encode times land where Server-Timing reads them
    transport = KServeHttpCodec(LIMITS).decode(
        http(body), Target("mlp"), context(Door.KSERVE_HTTP, "from-header"), None
    )
    assert transport.requests[0].context.request_id == "from-header"


def test_v2_http_encodes_binary_outputs_with_their_header_length_and_compresses_when_accepted() -> None:
    body = orjson.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    )
    codec = KServeHttpCodec(LIMITS)
    decoded = codec.decode(http(body, accept_encoding="gzip"), Target("mlp"), context(Door.KSERVE_HTTP), None)
    encoded = codec.encode([answer("mlp", fp32("y", [[3, 4]]))], decoded)
    headers = dict(encoded.headers)
    assert headers[b"content-encoding"] == b"gzip"
    plain = gzip.decompress(encoded.body)
    length = int(headers[b"inference-header-content-length"])
    assert orjson.loads(plain[:length])["outputs"][0]["parameters"]["binary_data_size"] == 8
    assert np.frombuffer(plain[length:], dtype=np.float32).tolist() == [3, 4]


def test_v2_http_refuses_a_header_length_that_is_not_a_number() -> None:
    with pytest.raises(MalformedRequestError, match="Inference-Header-Content-Length"):
        KServeHttpCodec(LIMITS).decode(
            http(b"{}", inference_header_content_length="x"), Target("mlp"), context(Door.KSERVE_HTTP), None
        )


def grpc_request(**fields: Any) -> Any:
    message = pb.ModelInferRequest(model_name="mlp", model_version="1", **fields)
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    del tensor
    message.raw_input_contents.append(np.array([1, 2], dtype=np.float32).tobytes())
    return message


def test_v2_grpc_targets_the_message_model_and_encodes_raw_outputs() -> None:
    codec = KServeGrpcCodec(LIMITS)
    message = grpc_request(id="m-1")
    assert codec.target(message) == Target("mlp", "1")
    decoded = codec.decode(message, codec.target(message), context(Door.KSERVE_GRPC), None)
    assert decoded.requests[0].context.request_id == "m-1" and decoded.requests[0].context.door is Door.KSERVE_GRPC
    encoded = codec.encode([answer("mlp", fp32("y", [[5, 6]]))], decoded)
    assert np.frombuffer(encoded.raw_output_contents[0], dtype=np.float32).tolist() == [5, 6]


@pytest.mark.parametrize("decoupled", [False, True])
def test_the_stream_marks_final_responses_as_triton_does(decoupled: bool) -> None:
    codec = KServeStreamCodec(LIMITS)
    message = grpc_request()
    message.parameters[grpc_v2.EMPTY_FINAL_RESPONSE].bool_param = True
    config = ModelConfig(name="mlp", max_batch_size=8, inputs=MLP.inputs, outputs=MLP.outputs, decoupled=decoupled)
    decoded = codec.decode(message, codec.target(message), context(Door.KSERVE_GRPC), signature(config))
    streamed = codec.encode_streamed(answer("mlp", fp32("y", [[1, 1]])), decoded)
    assert streamed.infer_response.parameters[grpc_v2.FINAL_RESPONSE].bool_param is not decoupled
    ended = codec.stream_ended(decoded)
    assert len(ended) == decoupled
    if decoupled:
        assert ended[0].infer_response.parameters[grpc_v2.FINAL_RESPONSE].bool_param
        assert not ended[0].infer_response.outputs


# -- TF Serving ------------------------------------------------------------------------------------


def test_tfserving_rest_answers_rows_with_predictions_and_columns_with_outputs() -> None:
    codec = TfServingRestCodec()
    for body, key in ((b'{"instances": [[1, 2]]}', "predictions"), (b'{"inputs": [[1, 2]]}', "outputs")):
        decoded = codec.decode(http(body), Target("mlp"), context(Door.TFSERVING_REST), signature(MLP))
        assert decoded.requests[0].inputs[0].data.tolist() == [[1, 2]]
        assert decoded.requests[0].context.request_id  # none sent: one made
        encoded = codec.encode([answer("mlp", fp32("y", [[1.5, 2.5]]))], decoded)
        assert orjson.loads(encoded.body) == {key: [[1.5, 2.5]]}


def test_tfserving_grpc_targets_a_label_for_the_call_to_resolve_and_honours_the_output_filter() -> None:
    codec = TfServingGrpcCodec(LIMITS)
    message = tfs.PredictRequest()
    message.model_spec.name = "mlp"
    message.model_spec.version_label = "stable"
    message.output_filter.append("y")
    proto = message.inputs["x"]
    proto.dtype = 1  # DT_FLOAT
    proto.tensor_shape.dim.add(size=1)
    proto.tensor_shape.dim.add(size=2)
    proto.float_val.extend([1, 2])
    assert codec.target(message) == Target("mlp", "", "stable")
    decoded = codec.decode(message, Target("mlp", "2"), context(Door.TFSERVING_GRPC, "r"), None)
    (request,) = decoded.requests
    assert request.model_version == "2" and [o.name for o in request.outputs] == ["y"]
    encoded = codec.encode([answer("mlp", fp32("y", [[7, 8]]))], decoded)
    assert tfserving_grpc.tensor_from_proto("y", encoded.outputs["y"], UNLIMITED).data.tolist() == [[7, 8]]
    assert encoded.model_spec.name == "mlp"


# -- SageMaker -------------------------------------------------------------------------------------


def test_sagemaker_json_reads_v2_and_tfserving_bodies_and_answers_each_in_its_own_shape() -> None:
    codec, _ = json_codecs(LIMITS, None)
    v2 = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
    decoded = codec.decode(http(v2), Target("mlp"), context(Door.SAGEMAKER), signature(MLP))
    assert decoded.requests[0].context.door is Door.SAGEMAKER
    assert "outputs" in orjson.loads(codec.encode([answer("mlp", fp32("y", [[1, 2]]))], decoded).body)
    decoded = codec.decode(http(b'{"instances": [[1, 2]]}'), Target("mlp"), context(Door.SAGEMAKER), signature(MLP))
    assert orjson.loads(codec.encode([answer("mlp", fp32("y", [[1, 2]]))], decoded).body) == {"predictions": [[1, 2]]}


def test_sagemaker_binary_json_takes_the_header_size_from_its_content_type() -> None:
    _, codec = json_codecs(LIMITS, None)
    header = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}]}
    )
    body = header + np.array([3, 4], dtype=np.float32).tobytes()
    raw = http(body, content_type=f"{sagemaker.TRITON_BINARY};json-header-size={len(header)}")
    decoded = codec.decode(raw, Target("mlp"), context(Door.SAGEMAKER), None)
    assert decoded.requests[0].inputs[0].data.tolist() == [[3, 4]]
    with pytest.raises(InvalidRequestError, match="json-header-size"):
        codec.decode(http(body, content_type=sagemaker.TRITON_BINARY), Target("mlp"), context(Door.SAGEMAKER), None)


def test_sagemaker_arrays_convert_numpy_defaults_and_answer_as_accepted() -> None:
    codec = SageMakerArrayCodec(sagemaker.NPY)
    buffer = io.BytesIO()
    np.save(buffer, np.array([[1.0, 2.0]]))  # float64, NumPy's default
    decoded = codec.decode(
        http(buffer.getvalue(), accept=sagemaker.CSV), Target("mlp"), context(Door.SAGEMAKER), signature(MLP)
    )
    assert decoded.requests[0].inputs[0].data.dtype == np.float32
    encoded = codec.encode([answer("mlp", fp32("y", [[1.5, 2.5]]))], decoded)
    assert encoded.body.decode().strip() == "1.5,2.5" and dict(encoded.headers)[b"content-type"] == b"text/csv"
    with pytest.raises(NotAcceptableError):
        codec.decode(
            http(buffer.getvalue(), accept="image/png"), Target("mlp"), context(Door.SAGEMAKER), signature(MLP)
        )


def test_sagemaker_arrays_round_numbers_to_a_bf16_model_and_answer_in_float32() -> None:
    """.npy and CSV have no bfloat16: numbers are rounded to it on the way in, and the answer is
    float32, which holds each bfloat16 value exactly."""
    model = ModelConfig(
        name="bf",
        max_batch_size=4,
        inputs=(TensorConfig("x", DataType.BF16, (2,)),),
        outputs=(TensorConfig("y", DataType.BF16, (2,)),),
    )
    codec = SageMakerArrayCodec(sagemaker.CSV)
    npy = sagemaker.encode_npy(np.array([[1.00390625, 2.0]]))
    for body, kind in ((b"1.00390625,2\n", sagemaker.CSV), (npy, sagemaker.NPY)):
        decoded = SageMakerArrayCodec(kind).decode(
            http(body, accept=sagemaker.NPY), Target("bf"), context(Door.SAGEMAKER), signature(model)
        )
        (tensor,) = decoded.requests[0].inputs
        assert tensor.data.dtype == DataType.BF16.numpy_dtype
        assert tensor.data.astype(np.float32).tolist() == [[1.0, 2.0]]
    values = np.array([[1.5, -3.0e38]], dtype=DataType.BF16.numpy_dtype)
    encoded = codec.encode([answer("bf", Tensor("y", DataType.BF16, values.shape, values))], decoded)
    back = np.load(io.BytesIO(encoded.body))
    assert back.dtype == np.float32 and back.tolist() == values.astype(np.float32).tolist()
    as_json = SageMakerArrayCodec(sagemaker.CSV).decode(  # no Accept: JSON, as SageMaker's toolkit answers
        http(b"1,2\n"), Target("bf"), context(Door.SAGEMAKER), signature(model)
    )
    encoded = codec.encode([answer("bf", Tensor("y", DataType.BF16, values.shape, values))], as_json)
    predictions = np.array(orjson.loads(encoded.body)["predictions"], dtype=np.float32)  # float32's shortest form
    assert predictions.tolist() == values.astype(np.float32).tolist()


# -- TorchServe ------------------------------------------------------------------------------------


def test_torchserve_hands_a_raw_body_to_the_bytes_input_and_answers_as_torchserve_does() -> None:
    codec = TorchServeCodec(KServeHttpCodec(LIMITS, Door.TORCHSERVE))
    decoded = codec.decode(http(b"\x00raw bytes"), Target("text"), context(Door.TORCHSERVE), signature(TEXT))
    (tensor,) = decoded.requests[0].inputs
    assert tensor.shape == (1, 1) and tensor.data[0, 0] == b"\x00raw bytes"
    encoded = codec.encode([answer("text", fp32("EMBEDDING", [[1, 2, 3]]))], decoded)
    assert orjson.loads(encoded.body) == [1.0, 2.0, 3.0] or orjson.loads(encoded.body) == [[1.0, 2.0, 3.0]]


def test_torchserve_reads_json_columns_by_the_signature_and_v2_bodies_as_v2() -> None:
    codec = TorchServeCodec(KServeHttpCodec(LIMITS, Door.TORCHSERVE))
    raw = http(b'{"x": [[1, 2]]}', content_type="application/json")
    decoded = codec.decode(raw, Target("mlp"), context(Door.TORCHSERVE), signature(MLP))
    assert decoded.requests[0].inputs[0].data.tolist() == [[1, 2]]
    v2 = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
    decoded = codec.decode(
        http(v2, content_type="application/json"), Target("mlp"), context(Door.TORCHSERVE), signature(MLP)
    )
    assert orjson.loads(codec.encode([answer("mlp", fp32("y", [[1, 2]]))], decoded).body)["model_name"] == "mlp"


# -- OpenAI ----------------------------------------------------------------------------------------


def test_openai_reads_only_the_model_first() -> None:
    codec = OpenAiEmbeddingsCodec(LIMITS)
    target = codec.target(http(b'{"model": "text", "input": 42}'))  # input not read yet
    assert target.model == "text"
    with pytest.raises(MalformedRequestError):
        codec.decode(http(b""), target, context(Door.OPENAI), signature(TEXT))


def test_openai_splits_texts_in_chunks_of_the_batch_size_sharing_one_id() -> None:
    codec = OpenAiEmbeddingsCodec(LIMITS)
    raw = http(b'{"model": "text", "input": ["a", "b c", "d"], "encoding_format": "base64"}')
    call = context(Door.OPENAI)
    decoded = codec.decode(raw, codec.target(raw), call, signature(TEXT))
    assert [r.inputs[0].shape for r in decoded.requests] == [(2, 1), (1, 1)]
    assert len({r.context.request_id for r in decoded.requests}) == 1 and decoded.requests[0].context is call
    responses = [
        answer(
            "text",
            fp32("EMBEDDING", [[1, 0, 0], [0, 1, 0]]),
            Tensor("TOKENS", DataType.INT64, (2, 1), np.array([[1], [2]])),
        ),
        answer("text", fp32("EMBEDDING", [[0, 0, 1]]), Tensor("TOKENS", DataType.INT64, (1, 1), np.array([[1]]))),
    ]
    document = orjson.loads(codec.encode(responses, decoded).body)
    assert document["usage"]["prompt_tokens"] == 4
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist() for d in document["data"]]
    assert vectors == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]


def test_a_model_without_embedding_parameters_is_refused_by_name() -> None:
    codec = OpenAiEmbeddingsCodec(LIMITS)
    raw = http(b'{"model": "mlp", "input": "hi"}')
    with pytest.raises(InvalidRequestError, match="does not serve embeddings"):
        codec.decode(raw, codec.target(raw), context(Door.OPENAI), signature(MLP))


def test_decoded_carries_what_encode_needs_and_nothing_of_the_transport() -> None:
    decoded: Decoded[bool] = TfServingRestCodec().decode(
        http(b'{"instances": [[1, 2]]}'), Target("mlp"), context(Door.TFSERVING_REST), signature(MLP)
    )
    assert decoded.state is True


# -- Limits ----------------------------------------------------------------------------------------

V2_PAIR = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})


def tfserving_predict() -> Any:
    message = tfs.PredictRequest()
    message.model_spec.name = "mlp"
    proto = message.inputs["x"]
    proto.dtype = 1  # DT_FLOAT
    proto.tensor_shape.dim.add(size=1)
    proto.tensor_shape.dim.add(size=2)
    proto.float_val.extend([1, 2])
    return message


def binary_json() -> HttpBody:
    header = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}]}
    )
    body = header + np.array([3, 4], dtype=np.float32).tobytes()
    return http(body, content_type=f"{sagemaker.TRITON_BINARY};json-header-size={len(header)}")


# Each door's codec given `limits`, with a request of 2 elements (OpenAI's: of 9 text bytes, 4 counted
# for the text): (codec, raw request, target, door, signature).
DOOR_CODECS: dict[str, Any] = {
    "kserve_http": lambda limits: (KServeHttpCodec(limits), http(V2_PAIR), Target("mlp"), Door.KSERVE_HTTP, None),
    "kserve_grpc": lambda limits: (KServeGrpcCodec(limits), grpc_request(), Target("mlp"), Door.KSERVE_GRPC, None),
    "kserve_stream": lambda limits: (
        KServeStreamCodec(limits),
        grpc_request(),
        Target("mlp"),
        Door.KSERVE_GRPC,
        signature(MLP),
    ),
    "tfserving_grpc": lambda limits: (
        TfServingGrpcCodec(limits),
        tfserving_predict(),
        Target("mlp"),
        Door.TFSERVING_GRPC,
        None,
    ),
    "sagemaker_json": lambda limits: (
        json_codecs(limits, None)[0],
        http(V2_PAIR),
        Target("mlp"),
        Door.SAGEMAKER,
        signature(MLP),
    ),
    "sagemaker_binary_json": lambda limits: (
        json_codecs(limits, None)[1],
        binary_json(),
        Target("mlp"),
        Door.SAGEMAKER,
        None,
    ),
    "torchserve_v2": lambda limits: (
        TorchServeCodec(KServeHttpCodec(limits, Door.TORCHSERVE)),
        http(V2_PAIR, content_type="application/json"),
        Target("mlp"),
        Door.TORCHSERVE,
        signature(MLP),
    ),
    "openai": lambda limits: (
        OpenAiEmbeddingsCodec(limits),
        http(b'{"model": "text", "input": "hello"}'),
        Target("text"),
        Door.OPENAI,
        signature(TEXT),
    ),
}


@pytest.mark.parametrize("door", sorted(DOOR_CODECS))
def test_each_door_codec_holds_requests_to_the_limits_it_was_given(door: str) -> None:
    codec, raw, target, door_kind, model = DOOR_CODECS[door](RequestLimits(max_elements=1, max_text_bytes=8))
    with pytest.raises(RequestTooLargeError, match=r"more than the server's limit of (1|8) per request"):
        codec.decode(raw, target, context(door_kind), model)
    codec, raw, target, door_kind, model = DOOR_CODECS[door](RequestLimits(max_elements=2, max_text_bytes=9))
    assert codec.decode(raw, target, context(door_kind), model).requests  # at the limits: served


def test_two_codecs_in_one_process_each_apply_their_own_limits() -> None:
    # What a process-wide setting could not do: two servers (or a server and a test) in one process,
    # their codecs built with different limits, decoding in turn.
    tight, loose = RequestLimits(max_elements=1), RequestLimits(max_elements=2)
    codecs: list[tuple[Any, Any]] = [
        (KServeHttpCodec(tight), KServeHttpCodec(loose)),
        (KServeGrpcCodec(tight), KServeGrpcCodec(loose)),
    ]
    for (refusing, serving), raw in zip(codecs, (http(V2_PAIR), grpc_request()), strict=True):
        for _ in range(2):
            with pytest.raises(RequestTooLargeError, match=r"holds 2 elements, more than the server's limit of 1"):
                refusing.decode(raw, Target("mlp"), context(refusing.door), None)
            (request,) = serving.decode(raw, Target("mlp"), context(serving.door), None).requests
            assert request.inputs[0].shape == (1, 2)

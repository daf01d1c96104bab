from __future__ import annotations

import re

import numpy as np
import orjson
import pytest
import simdjson

from inferd.errors import MalformedRequestError, RequestTooLargeError, TensorDataError
from inferd.limits import UNLIMITED, RequestLimits
from inferd.protocol import json_v2, openai_embeddings
from inferd.types import DataType, InferRequest, InferResponse, RequestContext, RequestedOutput, Tensor


def decode(document: object, **kwargs: object) -> object:
    return json_v2.decode_request(orjson.dumps(document), limits=UNLIMITED, model_name="m", model_version="", **kwargs)  # type: ignore[arg-type]


def test_binary_inputs_are_views_of_the_body() -> None:
    header = orjson.dumps(
        {
            "id": "abc",
            "inputs": [
                {"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
                {"name": "b", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 11}},
            ],
        }
    )
    body = header + np.array([1.5, 2.5], dtype="<f4").tobytes() + b"\x02\x00\x00\x00hi\x01\x00\x00\x00!"
    request = json_v2.decode_request(
        body, limits=UNLIMITED, model_name="m", model_version="1", header_length=len(header)
    )
    assert request.id == "abc"
    assert request.context.request_id == "abc"
    assert request.inputs[0].data.tolist() == [1.5, 2.5]
    assert not request.inputs[0].data.flags.owndata  # no copy
    assert request.inputs[1].data.tolist() == [b"hi", b"!"]


def test_header_request_id_wins_over_v2_id() -> None:
    request = decode(
        {"id": "v2", "inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [1]}]},
        context=RequestContext("hdr"),
    )
    assert (request.context.request_id, request.id) == ("hdr", "v2")  # type: ignore[attr-defined]


def test_trailing_binary_bytes_are_an_error() -> None:
    header = orjson.dumps(
        {"inputs": [{"name": "a", "datatype": "UINT8", "shape": [1], "parameters": {"binary_data_size": 1}}]}
    )
    with pytest.raises(MalformedRequestError, match="2 bytes of binary data follow"):
        json_v2.decode_request(
            header + b"\x01\x02\x03", limits=UNLIMITED, model_name="m", model_version="", header_length=len(header)
        )


def test_bool_data_must_be_booleans() -> None:
    with pytest.raises(TensorDataError, match="integers"):
        decode({"inputs": [{"name": "a", "datatype": "BOOL", "shape": [2], "data": [1, 0]}]})


def test_uint64_extremes_stay_exact() -> None:
    request = decode({"inputs": [{"name": "a", "datatype": "UINT64", "shape": [2], "data": [0, 2**64 - 1]}]})
    assert request.inputs[0].data.tolist() == [0, 2**64 - 1]  # type: ignore[attr-defined]


def test_error_carries_request_id() -> None:
    with pytest.raises(TensorDataError) as raised:
        decode({"id": "x1", "inputs": [{"name": "a", "datatype": "FP32", "shape": [3], "data": [1]}]})
    assert raised.value.request_id == "x1"


def test_encode_mixes_json_and_binary_outputs() -> None:
    request = decode(
        {
            "inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [1]}],
            "outputs": [{"name": "p", "parameters": {"binary_data": True}}, {"name": "q"}],
        }
    )
    response = InferResponse(
        model_name="m",
        model_version="1",
        request_id="r",
        outputs=(
            Tensor("p", DataType.FP16, (2,), np.array([1.0, 2.0], dtype=np.float16)),
            Tensor("q", DataType.BYTES, (1,), np.array([b"\xff\xfe"], dtype=object)),  # not UTF-8: sent binary
        ),
    )
    body, header_length = json_v2.encode_response(response, request)  # type: ignore[arg-type]
    assert header_length is not None
    header = orjson.loads(body[:header_length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 4
    assert header["outputs"][1]["parameters"]["binary_data_size"] == 6
    assert body[header_length:] == np.array([1.0, 2.0], dtype="<f2").tobytes() + b"\x02\x00\x00\x00\xff\xfe"


# Each case is decoded twice: as a small header (orjson) and padded past LARGE_HEADER_BYTES
# (simdjson, data read straight into a buffer). Both paths must give the same array or error.
DATA_CASES = [
    ("FP32", [2], [1, 2.5], [1.0, 2.5]),
    ("FP32", [2, 2], [[1, 2], [3, 4]], [[1.0, 2.0], [3.0, 4.0]]),
    ("FP32", [3], [[1, 2], [3]], [1.0, 2.0, 3.0]),  # nested lists are read row-major, as Triton does
    ("FP16", [1], [0.1], [np.float16(0.1).item()]),
    ("INT64", [2], [-(2**63), 2**63 - 1], [-(2**63), 2**63 - 1]),
    ("UINT64", [2], [0, 2**64 - 1], [0, 2**64 - 1]),
    ("BOOL", [2], [True, False], [True, False]),
    ("BYTES", [2], ["a", ["é"]], [b"a", "é".encode()]),
    ("FP32", [0], [], []),
    ("FP32", [2], [True, 1.0], "mixes booleans with numbers"),
    ("FP32", [2], ["a", "b"], "holds strings"),
    ("FP32", [2], [[1], [2, 3]], "holds 2 elements but 'data' has 3"),
    ("INT32", [2], [1, 2.5], "holds floats"),
    ("INT64", [1], [None], "mixed values"),
    ("UINT8", [1], [300], "outside UINT8's range"),
    ("UINT8", [1], [-1], "outside UINT8's range"),
    ("UINT64", [2], [2**64 - 1, -1], "outside UINT64's range"),
    ("INT8", [2], [1, 128], "outside INT8's range"),
    ("INT32", [1], [-(2**31) - 1], "outside INT32's range"),
    ("BOOL", [1], [1], "holds integers"),
    ("BYTES", [1], [1], "BYTES data must be strings"),
    ("FP32", [1], "x", "'data' must be a list"),
]


@pytest.mark.parametrize("large", [False, True], ids=["orjson", "simdjson"])
@pytest.mark.parametrize(("datatype", "shape", "data", "expected"), DATA_CASES)
def test_json_data_decodes_alike_in_small_and_large_bodies(
    large: bool, datatype: str, shape: list[int], data: object, expected: object
) -> None:
    document = {
        "id": "x" * json_v2.LARGE_HEADER_BYTES if large else "",
        "inputs": [{"name": "a", "datatype": datatype, "shape": shape, "data": data, "parameters": {"note": [1]}}],
    }
    if isinstance(expected, str):
        with pytest.raises(TensorDataError, match=expected):
            decode(document)
        return
    tensor = decode(document).inputs[0]  # type: ignore[attr-defined]
    assert tensor.data.dtype == DataType(datatype).numpy_dtype
    assert tensor.data.shape == tuple(shape)
    assert tensor.data.tolist() == expected


def test_large_body_reads_float_data_exactly() -> None:
    image = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
    document = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 64, 64], "data": image.ravel().tolist()}]}
    body = orjson.dumps(document)
    assert len(body) > json_v2.LARGE_HEADER_BYTES
    assert isinstance(json_v2._load_header(body)["inputs"][0]["data"], simdjson.Array)  # the fast path
    request = json_v2.decode_request(body, limits=UNLIMITED, model_name="m", model_version="")
    np.testing.assert_array_equal(request.inputs[0].data, image)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2" + b" " * json_v2.LARGE_HEADER_BYTES])
def test_invalid_json_is_malformed_in_either_parser(body: bytes) -> None:
    with pytest.raises(MalformedRequestError, match="not valid JSON"):
        json_v2.decode_request(body, limits=UNLIMITED, model_name="m", model_version="")


def test_a_request_the_client_encodes_is_the_request_the_server_decodes() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    text = np.array([[b"caf\xc3\xa9"], [b"\xff\xfe not UTF-8"]], dtype=object)
    request = InferRequest(
        "m",
        "",
        (Tensor("ids", DataType.INT64, ids.shape, ids), Tensor("text", DataType.BYTES, text.shape, text)),
        outputs=(RequestedOutput("y"),),
        parameters={"priority": 2},
        id="client-id",
    )
    body, header_length = json_v2.encode_request(request)
    decoded = json_v2.decode_request(
        body, limits=UNLIMITED, model_name="m", model_version="", header_length=header_length
    )
    assert decoded.id == "client-id" and decoded.parameters["priority"] == 2
    assert [o.name for o in decoded.outputs] == ["y"] and decoded.outputs[0].parameters["binary_data"] is True
    got = {t.name: t for t in decoded.inputs}
    assert np.array_equal(got["ids"].data, ids) and got["ids"].shape == (2, 3)
    assert got["text"].data.tolist() == text.tolist()  # the bytes as sent, UTF-8 or not


def test_a_response_the_server_encodes_is_the_response_the_client_decodes() -> None:
    hidden = np.linspace(0, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    labels = np.array([[b"a"], [b"\xff"]], dtype=object)
    response = InferResponse(
        "m",
        "1",
        "r1",
        (Tensor("hidden", DataType.FP32, hidden.shape, hidden), Tensor("label", DataType.BYTES, (2, 1), labels)),
    )
    asked = InferRequest("m", "", (), outputs=(RequestedOutput("hidden", {"binary_data": True}),))
    body, header_length = json_v2.encode_response(response, asked)  # hidden binary, label JSON-less: binary too
    decoded = json_v2.decode_response(body, header_length=header_length, request_id="r1")
    assert (decoded.model_name, decoded.model_version, decoded.request_id) == ("m", "1", "r1")
    got = {t.name: t for t in decoded.outputs}
    assert np.array_equal(got["hidden"].data, hidden) and got["hidden"].shape == (2, 3, 4)
    assert got["label"].data.tolist() == labels.tolist()
    plain, plain_length = json_v2.encode_response(
        response, InferRequest("m", "", (), outputs=(RequestedOutput("hidden"), RequestedOutput("label")))
    )
    decoded = json_v2.decode_response(plain, header_length=plain_length)
    assert np.array_equal(decoded.outputs[0].data, hidden)  # JSON data decodes too


def test_error_and_metadata_bodies_decode() -> None:
    assert json_v2.decode_error(b'{"error": "model \'x\' is not ready", "code": "MODEL_NOT_READY"}') == (
        "model 'x' is not ready"
    )
    assert json_v2.decode_error(b"<html>bad gateway</html>") == "<html>bad gateway</html>"
    metadata = json_v2.decode_model_metadata(
        b'{"name": "m", "versions": ["1"], "platform": "onnxruntime_onnx",'
        b' "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []}'
    )
    assert metadata.inputs[0].shape == (-1, 4) and metadata.versions == ("1",)
    with pytest.raises(MalformedRequestError):
        json_v2.decode_model_metadata(b'{"name": "m", "inputs": 3}')


NON_FINITE = [np.nan, np.inf, -np.inf, 1.5]


@pytest.mark.parametrize("padding", [1, json_v2.LARGE_HEADER_BYTES], ids=["small", "large"])
@pytest.mark.parametrize("letter", ["x", "é", "😀"])  # orjson says where it stopped in characters, not bytes
def test_nan_and_infinities_are_read_as_triton_s_clients_write_them(padding: int, letter: str) -> None:
    # tritonclient sends a float input holding NaN or ±inf as rapidjson's tokens, which Triton reads.
    body = b'{"id": "' + letter.encode() * padding + b'", "inputs": [{"name": "x", "datatype": "FP32", "shape": [4], '
    body += b'"data": [NaN, Infinity, -Infinity, 1.5]}]}'
    request = json_v2.decode_request(body, limits=UNLIMITED, model_name="m", model_version="")
    np.testing.assert_array_equal(request.inputs[0].data, np.array(NON_FINITE, dtype=np.float32))
    with pytest.raises(MalformedRequestError, match="not valid JSON"):  # still no other token
        json_v2.decode_request(body.replace(b"NaN", b"nan"), limits=UNLIMITED, model_name="m", model_version="")
    deep = b'{"inputs": ' + b"[" * 100_000 + b"NaN" + b"]" * 100_000 + b"}"
    with pytest.raises(MalformedRequestError, match="not valid JSON"):
        json_v2.decode_request(deep, limits=UNLIMITED, model_name="m", model_version="")


@pytest.mark.parametrize(
    "body",
    [
        b'{"id": "\\ud800", "inputs": [], "x": NaN}',  # a lone surrogate orjson would refuse
        b'{"inputs": [], "x": NaN, "big": 123456789012345678901234567890}',  # past 64 bits
        b'{"inputs": [{"data": [NaN, 1,]}]}',  # not JSON after the token either
        b'{"inputs": nan, "x": NaN}',  # refused before any NaN token: not read again
    ],
)
def test_only_json_with_non_finite_tokens_is_read_again(body: bytes) -> None:
    with pytest.raises(MalformedRequestError, match="not valid JSON"):
        json_v2.decode_request(body, limits=UNLIMITED, model_name="m", model_version="")


def test_other_doors_read_non_finite_tokens_after_any_text_and_openai_s_does_not() -> None:
    body = '{"instances": [{"text": "café 😀", "x": [NaN, -Infinity]}]}'.encode()
    np.testing.assert_array_equal(json_v2.load_json(body)["instances"][0]["x"], [np.nan, -np.inf])
    with pytest.raises(MalformedRequestError, match="not valid JSON"):
        json_v2.load_json(body, non_finite=False)
    with pytest.raises(MalformedRequestError, match="not valid JSON"):  # OpenAI's API reads strict JSON
        openai_embeddings.decode_request(b'{"model": "m", "input": "hi", "temperature": NaN}', UNLIMITED)


def test_non_finite_tokens_in_a_body_past_the_limit_ask_for_binary() -> None:
    data = b"1.5," * (json_v2.NON_FINITE_JSON_LIMIT // 4)
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [NaN,' + data + b"1]}]}"
    with pytest.raises(MalformedRequestError, match="binary tensor data extension"):
        json_v2.decode_request(body, limits=UNLIMITED, model_name="m", model_version="")


def test_nan_and_infinities_are_written_as_triton_writes_them() -> None:
    values = np.array(NON_FINITE, dtype=np.float32)
    response = InferResponse("m", "1", "r", (Tensor("y", DataType.FP32, (4,), values),))
    body, _ = json_v2.encode_response(response, InferRequest("m", "", ()))
    assert b"[NaN,Infinity,-Infinity,1.5]" in body  # not orjson's null, which reads back as NaN for all three
    tenth = InferResponse("m", "1", "r", (Tensor("y", DataType.FP32, (2,), np.array([np.nan, 0.1], np.float32)),))
    assert b"[NaN,0.1]" in json_v2.encode_response(tenth, InferRequest("m", "", ()))[0]  # float32's own form
    np.testing.assert_array_equal(json_v2.decode_response(body).outputs[0].data, values)
    # Finite data whose document holds "null" elsewhere keeps orjson's bytes.
    finite = InferResponse("nullable", "1", "r", (Tensor("y", DataType.FP32, (1,), np.ones(1, np.float32)),))
    body, _ = json_v2.encode_response(finite, InferRequest("nullable", "", ()))
    expected = b'{"model_name":"nullable","model_version":"1",'
    expected += b'"outputs":[{"name":"y","datatype":"FP32","shape":[1],"data":[1.0]}]}'
    assert body == expected


def test_shapes_with_more_dimensions_than_numpy_s_are_refused_before_any_product() -> None:
    for dimensions in (65, 20_000):  # 20,000 dimensions of 2**62: a product of seconds, never computed
        entry = {"name": "x", "datatype": "FP32", "shape": [2**62] * dimensions, "data": []}
        with pytest.raises(TensorDataError, match=f"{dimensions} dimensions, more than a tensor can have"):
            decode({"inputs": [entry]})


def test_the_limits_given_hold_json_and_binary_inputs() -> None:
    tight = RequestLimits(max_elements=3, max_text_bytes=10)

    def decode_with(limits: RequestLimits, *inputs: object, binary: bytes = b"") -> InferRequest:
        header = orjson.dumps({"inputs": list(inputs)})
        body = header + binary
        return json_v2.decode_request(
            body, limits=limits, model_name="m", model_version="", header_length=len(header) if binary else None
        )

    json_four = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    binary_four = {"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}
    message = (
        "input 'x': the request holds 4 elements, more than the server's limit of 3 per request "
        "(--max-request-elements)"
    )
    for entry, binary in ((json_four, b""), (binary_four, bytes(16))):
        with pytest.raises(RequestTooLargeError, match=re.escape(message)):
            decode_with(tight, entry, binary=binary)
        assert decode_with(RequestLimits(max_elements=4), entry, binary=binary).inputs[0].shape == (1, 4)
    texts = {"name": "t", "datatype": "BYTES", "shape": [2], "data": ["hello", "world!"]}  # 11 bytes and 2 x 4
    with pytest.raises(RequestTooLargeError, match=r"hold 19 bytes .* limit of 10 per request \(--max-request-text"):
        decode_with(tight, texts)
    assert decode_with(RequestLimits(max_text_bytes=19), texts).inputs[0].data.tolist() == [b"hello", b"world!"]


BF16 = DataType.BF16.numpy_dtype


def test_bf16_travels_binary_both_ways_and_is_refused_as_json() -> None:
    values = np.array([1.5, -2.0, 3.0e38], dtype=BF16)
    header = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "BF16", "shape": [3], "parameters": {"binary_data_size": 6}}]}
    )
    request = json_v2.decode_request(
        header + values.tobytes(), limits=UNLIMITED, model_name="m", model_version="", header_length=len(header)
    )
    assert request.inputs[0].data.dtype == BF16
    assert request.inputs[0].data.view(np.uint16).tolist() == values.view(np.uint16).tolist()
    with pytest.raises(TensorDataError, match="BF16 data cannot be sent as JSON; send it binary"):
        decode({"inputs": [{"name": "x", "datatype": "BF16", "shape": [1], "data": [1.5]}]})
    # An answer asked for as JSON comes binary: a JSON number would say nothing of the bits.
    response = InferResponse("m", "1", "r", outputs=(Tensor("y", DataType.BF16, (3,), values),))
    body, header_length = json_v2.encode_response(response, request)
    assert header_length is not None
    assert orjson.loads(body[:header_length])["outputs"][0]["parameters"]["binary_data_size"] == 6
    assert body[header_length:] == values.tobytes()


def test_json_numbers_for_bf16_elsewhere_are_rounded_to_it() -> None:
    """The readers other doors use (CSV-like rows, batch records) round numbers to bfloat16, as a cast does."""
    flat = json_v2.numbers_from_json("x", DataType.BF16, [1.0, 1.00390625, 1e39])
    assert flat.dtype == BF16 and flat.astype(np.float32).tolist() == [1.0, 1.0, float("inf")]
    nested = json_v2.nested_numbers([[1, 2.5], [3, 4]], DataType.BF16)
    assert nested is not None and nested.dtype == BF16 and nested.astype(np.float32).tolist() == [[1, 2.5], [3, 4]]
    assert json_v2.nested_numbers([[1, "a"]], DataType.BF16) is None


def test_bf16_numbers_are_written_as_the_floats_they_are() -> None:
    document = {"a": np.array([1.5, float("nan"), float("-inf"), 3.0e38], dtype=BF16)}
    assert json_v2.encode_tensor_json(document) == b'{"a":[1.5,NaN,-Infinity,3.0040553e+38]}'

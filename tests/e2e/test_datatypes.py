"""Every v2 datatype round-trips through an identity model: HTTP JSON, HTTP binary, gRPC."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from inferd.testing.server import ServerProcess
from inferd.types import DataType
from tests.e2e.conftest import Clients, http_request

pytestmark = pytest.mark.e2e


def sample(datatype: DataType) -> np.ndarray:
    rng = np.random.default_rng(7)
    if datatype is DataType.BYTES:
        return np.array([[b"hello", b"", "wörld".encode()], [b"a" * 40, b"x y", b"0"]], dtype=object)
    if datatype is DataType.BOOL:
        return np.array([[True, False, True], [False, False, True]])
    dtype = datatype.numpy_dtype
    if dtype.kind == "f" or datatype is DataType.BF16:
        return rng.standard_normal((2, 3)).astype(dtype)
    info = np.iinfo(dtype)
    # The extremes of each integer type, to catch any narrowing on the way.
    return np.array([[info.min, info.max, 0], [1, info.max - 1, info.min + 1]], dtype=dtype)


JSON_DATATYPES = [datatype for datatype in DataType if datatype is not DataType.BF16]  # BF16 is binary only


@pytest.mark.parametrize(
    ("datatype", "binary"),
    [*((datatype, False) for datatype in JSON_DATATYPES), *((datatype, True) for datatype in DataType)],
    ids=lambda v: v.value if isinstance(v, DataType) else ("binary" if v else "json"),
)
def test_http_round_trip(clients: Clients, server: ServerProcess, datatype: DataType, binary: bool) -> None:
    data = sample(datatype)
    client = clients.http(server.http_url)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype.value)
    tensor.set_data_from_numpy(data, binary_data=binary)
    requested = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(f"identity_{datatype.value.lower()}", [tensor], outputs=[requested])
    output = result.as_numpy("OUTPUT0")
    assert output.shape == data.shape
    if datatype is DataType.BYTES:
        assert [bytes(x) if isinstance(x, bytes) else str(x).encode() for x in output.reshape(-1)] == list(
            data.reshape(-1)
        )
    elif datatype is DataType.FP16 and not binary:
        np.testing.assert_allclose(output.astype(np.float32), data.astype(np.float32), rtol=1e-3)
    else:
        np.testing.assert_array_equal(output, data)
        assert output.dtype == data.dtype


@pytest.mark.parametrize("datatype", list(DataType), ids=lambda d: d.value)
def test_grpc_round_trip(clients: Clients, server: ServerProcess, datatype: DataType) -> None:
    data = sample(datatype)
    client = clients.grpc(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype.value)
    tensor.set_data_from_numpy(data)
    result = client.infer(f"identity_{datatype.value.lower()}", [tensor])
    output = result.as_numpy("OUTPUT0")
    assert output.shape == data.shape
    if datatype is DataType.BYTES:
        assert list(output.reshape(-1)) == list(data.reshape(-1))
    else:
        np.testing.assert_array_equal(output, data)
        assert output.dtype == data.dtype


@pytest.mark.parametrize(
    ("datatype", "field"),
    [
        (DataType.BOOL, "bool_contents"),
        (DataType.INT8, "int_contents"),
        (DataType.INT32, "int_contents"),
        (DataType.INT64, "int64_contents"),
        (DataType.UINT16, "uint_contents"),
        (DataType.UINT64, "uint64_contents"),
        (DataType.FP32, "fp32_contents"),
        (DataType.FP64, "fp64_contents"),
        (DataType.BYTES, "bytes_contents"),
    ],
    ids=lambda v: v.value if isinstance(v, DataType) else v,
)
def test_grpc_typed_contents(server: ServerProcess, datatype: DataType, field: str) -> None:
    """Clients other than tritonclient send typed `contents` instead of raw bytes."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    data = sample(datatype)
    request = service_pb2.ModelInferRequest(model_name=f"identity_{datatype.value.lower()}", id="typed-1")
    item = request.inputs.add(name="INPUT0", datatype=datatype.value, shape=list(data.shape))
    getattr(item.contents, field).extend(data.reshape(-1).tolist())
    with grpc.insecure_channel(server.grpc_url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert response.id == "typed-1"
    assert list(response.outputs[0].shape) == list(data.shape)
    if datatype is DataType.BYTES:
        assert response.raw_output_contents[0].startswith(len(b"hello").to_bytes(4, "little") + b"hello")
    else:
        output = np.frombuffer(response.raw_output_contents[0], dtype=datatype.numpy_dtype).reshape(data.shape)
        np.testing.assert_array_equal(output, data)


# Bytes that are not UTF-8 (a PNG signature, a protobuf with a 0xff varint, a lone continuation
# byte, trailing NULs) and characters inside the range inferd escapes them into: all must come back
# exactly as sent, as Triton passes BYTES through.
BLOBS = np.array(
    [
        [b"\x89PNG\r\n\x1a\n\x00\x00", b"\x08\xff\xff\xff\xff\x0f", b"\x80"],
        ["\U0010ffff\U0010ff80".encode(), b"\xff", b""],
    ],
    dtype=object,
)


def test_bytes_that_are_not_utf8_pass_through_binary_http(clients: Clients, server: ServerProcess) -> None:
    client = clients.http(server.http_url)
    tensor = httpclient.InferInput("INPUT0", list(BLOBS.shape), "BYTES")
    tensor.set_data_from_numpy(BLOBS, binary_data=True)
    for binary_output in (True, False):  # output as JSON cannot hold them: inferd sends them binary
        requested = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output)
        output = client.infer("identity_bytes", [tensor], outputs=[requested]).as_numpy("OUTPUT0")
        assert output.shape == BLOBS.shape
        assert list(output.reshape(-1)) == list(BLOBS.reshape(-1))


def test_bytes_that_are_not_utf8_pass_through_grpc(clients: Clients, server: ServerProcess) -> None:
    client = clients.grpc(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", list(BLOBS.shape), "BYTES")
    tensor.set_data_from_numpy(BLOBS)
    output = client.infer("identity_bytes", [tensor]).as_numpy("OUTPUT0")
    assert list(output.reshape(-1)) == list(BLOBS.reshape(-1))


@pytest.mark.parametrize("datatype", ["FP16", "FP32"])
def test_json_numbers_past_a_float_types_range_are_infinite(server: ServerProcess, datatype: str) -> None:
    # ±inf, as a C cast makes them (and Triton). numpy's overflow warning went to the server's log and
    # failed the decoder under -W error (found by tests/unit/protocol/test_codec_fuzz.py).
    entry = {"name": "INPUT0", "datatype": datatype, "shape": [1, 3], "data": [1e39, -1e39, 1.5]}
    document = {"inputs": [entry], "parameters": {"binary_data_output": True}}
    reply = http_request(server, "POST", f"/v2/models/identity_{datatype.lower()}/infer", orjson.dumps(document))
    assert reply.status == 200, reply.body
    data = reply.body[int(reply.headers["inference-header-content-length"]) :]
    assert np.frombuffer(data, dtype=DataType(datatype).numpy_dtype).tolist() == [np.inf, -np.inf, 1.5]
    assert "overflow encountered" not in server.log()


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_nan_and_infinities_round_trip_as_json(clients: Clients, server: ServerProcess, datatype: str) -> None:
    # tritonclient writes them as NaN / Infinity / -Infinity, and reads them so (as Triton writes them).
    data = np.array([[np.nan, np.inf, -np.inf], [0.0, -1.5, 2.0]], dtype=DataType(datatype).numpy_dtype)
    client = clients.http(server.http_url)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=False)
    requested = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    output = client.infer(f"identity_{datatype.lower()}", [tensor], outputs=[requested]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(output, data)  # NaN where NaN, each infinity with its sign


def test_bf16_as_json_is_refused_with_what_to_send_instead(server: ServerProcess) -> None:
    """As Triton: JSON numbers would be rounded on the way to bfloat16, so BF16 travels binary only."""
    entry = {"name": "INPUT0", "datatype": "BF16", "shape": [1, 2], "data": [1.5, 2.0]}
    reply = http_request(server, "POST", "/v2/models/identity_bf16/infer", orjson.dumps({"inputs": [entry]}))
    assert reply.status == 400
    error = orjson.loads(reply.body)
    assert "BF16 data cannot be sent as JSON; send it binary" in error["error"]
    assert error["tensor"] == "INPUT0"


def test_a_bf16_output_asked_for_as_json_comes_binary(clients: Clients, server: ServerProcess) -> None:
    """A JSON answer cannot hold it (tritonclient reads BF16 only binary): it comes binary, as
    BYTES that are not UTF-8 do, and tritonclient reads it back bit for bit."""
    data = sample(DataType.BF16)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "BF16")
    tensor.set_data_from_numpy(data, binary_data=True)
    requested = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    output = clients.http(server.http_url).infer("identity_bf16", [tensor], outputs=[requested]).as_numpy("OUTPUT0")
    assert output.dtype == data.dtype
    assert output.view(np.uint16).tolist() == data.view(np.uint16).tolist()


def test_a_bf16_answer_to_a_json_request_comes_binary(server: ServerProcess) -> None:
    entry = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1.0, 1.00390625, -3.5]}
    reply = http_request(server, "POST", "/v2/models/to_bf16/infer", orjson.dumps({"inputs": [entry]}))
    assert reply.status == 200, reply.body
    header_length = int(reply.headers["inference-header-content-length"])
    header = orjson.loads(reply.body[:header_length])
    assert header["outputs"][0]["datatype"] == "BF16"
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 6
    values = np.frombuffer(reply.body[header_length:], dtype=DataType.BF16.numpy_dtype)
    assert values.astype(np.float32).tolist() == [1.0, 1.0, -3.5]  # 1.00390625 rounds to even


def test_tf_serving_rest_refuses_bf16_as_tf_serving_does(server: ServerProcess) -> None:
    """TF Serving's REST API converts no JSON value to bfloat16 and writes none."""
    sent = http_request(server, "POST", "/v1/models/identity_bf16:predict", orjson.dumps({"instances": [[1.5, 2.0]]}))
    assert sent.status == 400
    assert orjson.loads(sent.body)["error"].startswith("Conversion of JSON Value: 1.5 to type: bfloat16")
    answered = http_request(server, "POST", "/v1/models/to_bf16:predict", orjson.dumps({"instances": [[1.0, 2, 3]]}))
    assert answered.status == 400
    assert orjson.loads(answered.body)["error"].startswith("Failed to write JSON value for tensor type: bfloat16")

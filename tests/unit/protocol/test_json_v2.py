from __future__ import annotations

import numpy as np
import orjson
import pytest

from inferd.errors import MalformedRequestError, TensorDataError
from inferd.protocol import json_v2
from inferd.types import DataType, InferResponse, Tensor


def decode(document: object, **kwargs: object) -> object:
    return json_v2.decode_request(orjson.dumps(document), model_name="m", model_version="", **kwargs)  # type: ignore[arg-type]


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
    request = json_v2.decode_request(body, model_name="m", model_version="1", header_length=len(header))
    assert request.id == "abc"
    assert request.request_id == "abc"
    assert request.inputs[0].data.tolist() == [1.5, 2.5]
    assert not request.inputs[0].data.flags.owndata  # no copy
    assert request.inputs[1].data.tolist() == [b"hi", b"!"]


def test_header_request_id_wins_over_v2_id() -> None:
    request = decode(
        {"id": "v2", "inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [1]}]}, request_id="hdr"
    )
    assert (request.request_id, request.id) == ("hdr", "v2")  # type: ignore[attr-defined]


def test_trailing_binary_bytes_are_an_error() -> None:
    header = orjson.dumps(
        {"inputs": [{"name": "a", "datatype": "UINT8", "shape": [1], "parameters": {"binary_data_size": 1}}]}
    )
    with pytest.raises(MalformedRequestError, match="2 bytes of binary data follow"):
        json_v2.decode_request(header + b"\x01\x02\x03", model_name="m", model_version="", header_length=len(header))


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

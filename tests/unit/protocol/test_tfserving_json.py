"""TF Serving's REST bodies: shapes from nesting, datatypes from the signature, strings both ways."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from inferd.errors import InvalidRequestError, TensorDataError
from inferd.limits import UNLIMITED
from inferd.protocol import json_v2, tfserving_json
from inferd.types import DataType, ModelMetadata, Tensor, TensorMetadata


def signature(*inputs: tuple[str, str]) -> ModelMetadata:
    return ModelMetadata("m", ("1",), "", tuple(TensorMetadata(n, d, (-1,)) for n, d in inputs), ())


def tensor(name: str, data: np.ndarray) -> Tensor:
    return Tensor(name, DataType.from_numpy(data.dtype), data.shape, data)


def test_rows_stack_into_the_batch_dimension_with_the_signature_datatype() -> None:
    body = orjson.dumps({"instances": [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]})
    (decoded,) = tfserving_json.decode_predict(json_v2.load_json(body), signature(("x", "FP16"))).inputs
    assert decoded.datatype is DataType.FP16 and decoded.shape == (2, 2, 2)
    assert decoded.data.dtype == np.float16 and decoded.data[1, 1, 0] == 7


def test_a_scalar_column_is_a_rank_zero_tensor() -> None:
    (decoded,) = tfserving_json.decode_predict({"inputs": 7}, signature(("x", "INT64"))).inputs
    assert decoded.shape == () and decoded.data.dtype == np.int64 and int(decoded.data) == 7


@pytest.mark.parametrize(
    "instances",
    [
        [[1, 2], [3], [4, 5, 6]],  # as many numbers as 3 rows of 2, yet ragged
        [[1, [2]], [3, 4]],
        [[[1]], [2]],
    ],
)
def test_ragged_lists_are_refused_even_when_the_count_fits(instances: list) -> None:
    with pytest.raises(TensorDataError):
        tfserving_json.decode_predict({"instances": instances}, signature(("x", "FP32")))


def test_b64_only_for_strings() -> None:
    encoded = base64.b64encode(b"\xff\x00").decode()
    (decoded,) = tfserving_json.decode_predict(
        {"instances": [{"b64": encoded}, "text"]}, signature(("s", "BYTES"))
    ).inputs
    assert decoded.data.tolist() == [b"\xff\x00", b"text"]
    with pytest.raises(InvalidRequestError):
        tfserving_json.decode_predict({"instances": [{"b64": encoded}]}, signature(("x", "FP32")))


def test_outputs_named_bytes_are_always_base64() -> None:
    strings = np.array([b"plain", b"\xfe"], dtype=object)
    body = tfserving_json.encode_predict(
        [tensor("label", strings.copy()), tensor("raw_bytes", strings.copy())], row_format=True
    )
    assert orjson.loads(body) == {
        "predictions": [
            {"label": "plain", "raw_bytes": {"b64": base64.b64encode(b"plain").decode()}},
            {"label": {"b64": base64.b64encode(b"\xfe").decode()}, "raw_bytes": {"b64": "/g=="}},
        ]
    }


def test_a_single_output_is_unnamed_in_both_formats() -> None:
    y = np.arange(6, dtype=np.int32).reshape(3, 2)
    assert orjson.loads(tfserving_json.encode_predict([tensor("y", y)], row_format=True)) == {
        "predictions": [[0, 1], [2, 3], [4, 5]]
    }
    assert orjson.loads(tfserving_json.encode_predict([tensor("y", y)], row_format=False)) == {
        "outputs": [[0, 1], [2, 3], [4, 5]]
    }


def test_rows_need_outputs_of_one_batch_size() -> None:
    with pytest.raises(InvalidRequestError, match="columnar"):
        tfserving_json.encode_predict(
            [tensor("a", np.zeros((2, 1), np.float32)), tensor("b", np.zeros((3,), np.float32))], row_format=True
        )


def test_grpc_values_repeat_to_fill_a_shape_but_never_beyond_a_bound() -> None:
    from inferd.protocol import tfserving_grpc
    from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb

    proto = tf_pb.TensorProto(dtype=tf_pb.DT_FLOAT, float_val=[1.0, 2.0])
    proto.tensor_shape.dim.extend([tf_pb.TensorShapeProto.Dim(size=2), tf_pb.TensorShapeProto.Dim(size=2)])
    filled = tfserving_grpc.tensor_from_proto("x", proto, UNLIMITED)
    assert filled.data.tolist() == [[1.0, 2.0], [2.0, 2.0]]  # as TensorFlow fills it
    del proto.tensor_shape.dim[:]
    proto.tensor_shape.dim.extend([tf_pb.TensorShapeProto.Dim(size=100_000), tf_pb.TensorShapeProto.Dim(size=100_000)])
    with pytest.raises(TensorDataError, match="MiB"):
        tfserving_grpc.tensor_from_proto("x", proto, UNLIMITED)


def test_nan_and_infinities_are_read_and_written_as_tf_serving_does() -> None:
    # TF Serving parses with rapidjson's kParseNanAndInfFlag and writes NaN, Infinity, -Infinity;
    # requests' json= and Python's json write and read them so.
    body = b'{"instances": [[NaN, Infinity], [-Infinity, 0.1]]}'
    (decoded,) = tfserving_json.decode_predict(json_v2.load_json(body), signature(("x", "FP32"))).inputs
    np.testing.assert_array_equal(decoded.data, np.array([[np.nan, np.inf], [-np.inf, 0.1]], np.float32))
    answer = tfserving_json.encode_predict([tensor("y", decoded.data)], row_format=True)
    assert answer == b'{"predictions":[[NaN,Infinity],[-Infinity,0.1]]}'  # float32's own 0.1
    columns = tfserving_json.encode_predict([tensor("y", decoded.data)], row_format=False)
    assert columns == b'{"outputs":[[NaN,Infinity],[-Infinity,0.1]]}'
    # Several outputs in rows: each row's values are numpy scalars, written in their own type too.
    pair = [tensor("a", np.array([np.nan, 0.1], np.float32)), tensor("b", np.array([1, 2], np.int64))]
    assert tfserving_json.encode_predict(pair, row_format=True) == (
        b'{"predictions":[{"a":NaN,"b":1},{"a":0.1,"b":2}]}'
    )
    finite = tfserving_json.encode_predict([tensor("y", np.array([0.1, 1.0], np.float32))], row_format=False)
    assert finite == b'{"outputs":[0.1,1.0]}'  # the usual path writes the same forms
    half = np.array([0.1, 6e-8], np.float16)
    with_nan = tfserving_json.encode_predict([tensor("y", np.append(half, np.float16("nan")))], row_format=False)
    without = tfserving_json.encode_predict([tensor("y", half)], row_format=False)
    assert with_nan.replace(b",NaN", b"") == without  # one form for each value, NaN or not beside it


def test_outputs_numpy_cannot_write_directly_still_encode() -> None:
    transposed = np.arange(6, dtype=np.float32).reshape(2, 3).T  # not C-contiguous
    assert orjson.loads(tfserving_json.encode_predict([tensor("y", transposed)], row_format=False)) == {
        "outputs": transposed.tolist()
    }
    scalar = np.array(np.float32(0.1))  # rank 0
    assert tfserving_json.encode_predict([tensor("y", scalar)], row_format=False) == b'{"outputs":0.1}'


def test_nan_in_an_integer_input_or_past_the_limit_is_a_400() -> None:
    with pytest.raises(TensorDataError, match="INT32"):
        tfserving_json.decode_predict(json_v2.load_json(b'{"inputs": [1, NaN]}'), signature(("x", "INT32")))
    huge = b'{"inputs": [NaN' + b", 1" * json_v2.NON_FINITE_JSON_LIMIT + b"]}"
    with pytest.raises(InvalidRequestError, match="gRPC"):
        json_v2.load_json(huge)
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        json_v2.load_json(b'{"inputs": [nan]}')  # only the tokens TF Serving reads

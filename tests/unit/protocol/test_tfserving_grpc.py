"""tfserving_grpc's PredictRequest inputs held to the limits they are given: the element limit
before a shape is filled with the last value repeated, the text limit counting each repeated string."""

from __future__ import annotations

import re
from typing import Any

import pytest

from inferd.errors import RequestTooLargeError
from inferd.limits import RequestLimits
from inferd.protocol import tfserving_grpc
from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb


def proto(shape: tuple[int, ...], **values: Any) -> tf_pb.TensorProto:
    dtype = tf_pb.DT_STRING if "string_val" in values else tf_pb.DT_FLOAT
    tensor = tf_pb.TensorProto(dtype=dtype, **values)
    tensor.tensor_shape.dim.extend(tf_pb.TensorShapeProto.Dim(size=size) for size in shape)
    return tensor


def test_a_shape_to_fill_is_held_to_the_element_limit_before_it_is_filled() -> None:
    one_value = proto((1, 1000), float_val=[1.5])
    message = (
        "input 'x': the request holds 1000 elements, more than the server's limit of 999 per request "
        "(--max-request-elements)"
    )
    with pytest.raises(RequestTooLargeError, match=re.escape(message)):
        tfserving_grpc.tensor_from_proto("x", one_value, RequestLimits(max_elements=999))
    filled = tfserving_grpc.tensor_from_proto("x", one_value, RequestLimits(max_elements=1000))
    assert filled.shape == (1, 1000) and float(filled.data.sum()) == 1500.0


def test_a_repeated_string_counts_at_its_length_each_time() -> None:
    repeated = proto((10,), string_val=[b"abc"])  # (3 + 4) bytes, 10 times
    with pytest.raises(RequestTooLargeError, match=r"hold 70 bytes .* limit of 69 per request"):
        tfserving_grpc.tensor_from_proto("s", repeated, RequestLimits(max_text_bytes=69))
    assert (
        tfserving_grpc.tensor_from_proto("s", repeated, RequestLimits(max_text_bytes=70)).data.tolist() == [b"abc"] * 10
    )


def test_a_predict_request_s_inputs_are_each_held_to_the_limits() -> None:
    message = serving_pb.PredictRequest()
    message.model_spec.name = "m"
    message.inputs["a"].CopyFrom(proto((2,), float_val=[1.0, 2.0]))
    message.inputs["b"].CopyFrom(proto((4,), float_val=[1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(RequestTooLargeError, match="input 'b': the request holds 4 elements"):
        tfserving_grpc.decode_predict(message, RequestLimits(max_elements=3))
    inputs, _ = tfserving_grpc.decode_predict(message, RequestLimits(max_elements=4))
    assert [tensor.shape for tensor in inputs] == [(2,), (4,)]


def test_bfloat16_comes_in_half_val_or_tensor_content_and_leaves_in_tensor_content() -> None:
    """TensorFlow's make_tensor_proto writes bfloat16 as each value's 16 bits in half_val."""
    import numpy as np

    from inferd.types import DataType

    values = np.array([1.5, -2.0, 0.0078125], dtype=DataType.BF16.numpy_dtype)
    bits = values.view(np.uint16).tolist()
    half = tf_pb.TensorProto(dtype=tf_pb.DT_BFLOAT16, half_val=bits)
    half.tensor_shape.dim.add(size=3)
    content = tf_pb.TensorProto(dtype=tf_pb.DT_BFLOAT16, tensor_content=values.tobytes())
    content.tensor_shape.dim.add(size=3)
    for proto in (half, content):
        tensor = tfserving_grpc.tensor_from_proto("x", proto, RequestLimits())
        assert tensor.datatype is DataType.BF16
        assert tensor.data.view(np.uint16).tolist() == bits
    answer = tfserving_grpc.tensor_to_proto(tensor)
    assert answer.dtype == tf_pb.DT_BFLOAT16 and answer.tensor_content == values.tobytes()

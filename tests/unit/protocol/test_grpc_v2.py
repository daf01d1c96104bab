"""grpc_v2.decode_request's inputs: where each input's data is (typed contents, raw_input_contents
in order, a shared memory region), and with several mistakes in one request, the error Triton
reaches first (it checks input by input), beginning with Triton's sentence."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from inferd.errors import MalformedRequestError, RequestTooLargeError, TensorDataError
from inferd.limits import UNLIMITED, RequestLimits
from inferd.protocol import grpc_v2

ONES = np.ones((1, 4), dtype=np.float32)


def request(*typed: bool, raw: int = 0) -> pb.ModelInferRequest:
    """INPUT0, INPUT1, ... FP32 [1, 4], each with typed contents where `typed` says; `raw` entries."""
    message = pb.ModelInferRequest(model_name="simple")
    for index, with_contents in enumerate(typed):
        tensor = message.inputs.add(name=f"INPUT{index}", datatype="FP32", shape=[1, 4])
        if with_contents:
            tensor.contents.fp32_contents.extend(ONES.ravel().tolist())
    message.raw_input_contents.extend([ONES.tobytes()] * raw)
    return message


def test_every_input_typed_or_every_input_raw_is_read() -> None:
    for message in (request(True, True), request(False, False, raw=2)):
        decoded = grpc_v2.decode_request(message, limits=UNLIMITED)
        assert [t.name for t in decoded.inputs] == ["INPUT0", "INPUT1"]
        assert all(np.array_equal(t.data, ONES) for t in decoded.inputs)


@pytest.mark.parametrize(
    ("message", "first_error"),
    [
        # Both typed, one raw entry: Triton stops at INPUT0 (not at the count of raw entries).
        (request(True, True, raw=1), "contents field must not be specified when using raw_input_contents for "
                                     "'INPUT0' for model 'simple': "),
        (request(False, True, raw=1), "contents field must not be specified when using raw_input_contents for "
                                      "'INPUT1' for model 'simple': "),
        (request(False, False, raw=1), "unable to find data for input tensor 'INPUT1' for model 'simple' in "
                                       "request: "),
        (request(False, raw=0), "unable to find data for input tensor 'INPUT0' for model 'simple' in request: "),
        (request(False, raw=2), "raw_input_contents has 2 entries for 1 inputs"),
    ],
    ids=["both-typed-one-raw", "second-typed-with-raw", "raw-short", "no-data", "raw-extra"],
)  # fmt: skip
def test_the_first_error_is_the_one_triton_gives_first(message: pb.ModelInferRequest, first_error: str) -> None:
    with pytest.raises(MalformedRequestError) as raised:
        grpc_v2.decode_request(message, limits=UNLIMITED)
    assert raised.value.message.startswith(first_error), raised.value.message


def test_typed_contents_with_the_wrong_count_say_so() -> None:
    message = request(True)
    del message.inputs[0].contents.fp32_contents[1:]
    with pytest.raises(TensorDataError, match=r"holds 4 elements but contents.fp32_contents has 1"):
        grpc_v2.decode_request(message, limits=UNLIMITED)


def test_an_empty_input_needs_no_data() -> None:
    message = pb.ModelInferRequest(model_name="simple")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[0, 4])
    assert grpc_v2.decode_request(message, limits=UNLIMITED).inputs[0].data.shape == (0, 4)


def test_the_limits_given_hold_raw_and_typed_inputs() -> None:
    message = (
        "input 'INPUT0': the request holds 4 elements, more than the server's limit of 3 per request "
        "(--max-request-elements)"
    )
    for typed in (request(True), request(False, raw=1)):
        with pytest.raises(RequestTooLargeError, match=re.escape(message)):
            grpc_v2.decode_request(typed, limits=RequestLimits(max_elements=3))
        assert grpc_v2.decode_request(typed, limits=RequestLimits(max_elements=4)).inputs[0].shape == (1, 4)
    texts = pb.ModelInferRequest(model_name="simple")
    texts.inputs.add(name="TEXT", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"hello", b"world!"])
    with pytest.raises(RequestTooLargeError, match=r"'TEXT'.* hold 19 bytes .* limit of 18 per request"):
        grpc_v2.decode_request(texts, limits=RequestLimits(max_text_bytes=18))
    assert grpc_v2.decode_request(texts, limits=RequestLimits(max_text_bytes=19)).inputs[0].data.tolist() == [
        b"hello",
        b"world!",
    ]

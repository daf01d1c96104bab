"""tensor_bytes.tensor_from_bytes: a request's input whose bytes do not fit its shape is refused
with Triton's sentence first (Triton's clients and tests match it), BYTES elements checked in
Triton's order; a response's output (no model) keeps inferd's message alone. The limits it is given
hold the input before anything is built."""

from __future__ import annotations

import re

import numpy as np
import pytest

from inferd.errors import RequestTooLargeError, TensorDataError
from inferd.limits import UNLIMITED, RequestLimits
from inferd.protocol.tensor_bytes import serialize_bytes_elements, tensor_from_bytes
from inferd.types import DataType


def refusal(datatype: DataType, shape: tuple[int, ...], data: bytes, model: str | None = "simple") -> str:
    with pytest.raises(TensorDataError) as raised:
        tensor_from_bytes("INPUT1", datatype, shape, data, UNLIMITED, model=model)
    return raised.value.message


def strings(*items: bytes) -> bytes:
    return serialize_bytes_elements(np.array(items, dtype=object))


def test_a_fixed_size_input_of_the_wrong_byte_size() -> None:
    message = refusal(DataType.FP32, (1, 16), bytes(128))
    assert message.startswith("input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128: ")
    assert "needs 64 bytes (16 elements x 4)" in message
    # A response's output, as a client decodes it: inferd's words only.
    assert refusal(DataType.FP32, (1, 16), bytes(128), model=None).startswith("input 'INPUT1': shape [1, 16]")


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        (strings(b"a"), "expected 3 string elements for inference input 'INPUT1' for model 'simple', got 1: "),
        (b"", "expected 3 string elements for inference input 'INPUT1' for model 'simple', got 0: "),
        (strings(b"a", b"b", b"c", b"d"),
         "unexpected number of string elements 4 for inference input 'INPUT1' for model 'simple', expecting 3: "),
        (strings(b"a", b"b", b"c") + b"\x01\x00",
         "incomplete string length indicator for inference input 'INPUT1' for model 'simple', expecting 4 bytes "
         "but only 2 bytes available: "),
        (strings(b"a") + b"\x09\x00\x00\x00abc", "input 'INPUT1': BYTES element 1 declares 9 bytes but only 3 remain"),
    ],
    ids=["too-few", "none", "too-many", "half-a-length", "element-cut-short"],
)  # fmt: skip
def test_bytes_elements_that_do_not_fit_the_shape(data: bytes, phrase: str) -> None:
    assert refusal(DataType.BYTES, (3,), data).startswith(phrase)


def test_bytes_elements_that_fit_are_read_whatever_their_count_claims() -> None:
    tensor = tensor_from_bytes("INPUT1", DataType.BYTES, (1, 3), strings(b"a", b"", b"\xff"), UNLIMITED, model="simple")
    assert tensor.data.tolist() == [[b"a", b"", b"\xff"]]
    # A shape claiming 2**40 elements over 8 bytes is refused from what was sent, with nothing allocated for it.
    assert refusal(DataType.BYTES, (2**40,), strings(b"a", b"b")).startswith("expected 1099511627776 string elements")


TIGHT = RequestLimits(max_elements=3, max_text_bytes=12)


def test_a_fixed_size_input_is_held_to_the_element_limit_given() -> None:
    message = (
        "input 'INPUT1': the request holds 4 elements, more than the server's limit of 3 per request "
        "(--max-request-elements)"
    )
    with pytest.raises(RequestTooLargeError, match=re.escape(message)):
        tensor_from_bytes("INPUT1", DataType.FP32, (1, 4), bytes(16), TIGHT, model="simple")
    assert tensor_from_bytes("INPUT1", DataType.FP32, (1, 3), bytes(12), TIGHT, model="simple").shape == (1, 3)


def test_bytes_elements_are_held_to_the_text_limit_given_before_any_is_read() -> None:
    message = (
        "input 'INPUT1': the request's BYTES elements hold 13 bytes (4 counted for each element), more than the "
        "server's limit of 12 per request (--max-request-text-bytes)"
    )
    # 13 bytes that are no elements at all: the limit is checked on the framing, before the loop reads any.
    with pytest.raises(RequestTooLargeError, match=re.escape(message)):
        tensor_from_bytes("INPUT1", DataType.BYTES, (2,), b"\xff" * 13, TIGHT, model="simple")
    fits = tensor_from_bytes("INPUT1", DataType.BYTES, (2,), strings(b"abcd", b""), TIGHT, model="simple")
    assert fits.data.tolist() == [b"abcd", b""]
    with pytest.raises(RequestTooLargeError, match="--max-request-elements"):  # 4 empty ones: 16 bytes, 4 elements
        tensor_from_bytes("INPUT1", DataType.BYTES, (4,), strings(*[b""] * 4), RequestLimits(max_elements=3))

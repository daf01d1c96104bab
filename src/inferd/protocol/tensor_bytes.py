"""Raw tensor bytes ⇄ numpy arrays, as the v2 binary extension and gRPC raw contents carry them.

Fixed-size datatypes are little-endian row-major; BYTES elements are each a 4-byte little-endian
length followed by that many bytes. Sizes are checked against the declared shape before any
allocation, so a request cannot make the server allocate more than it sent; and against the
`RequestLimits` each caller passes (a door's codec, the server's; a client decoding an answer,
`UNLIMITED`).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from inferd.errors import TensorDataError, with_triton_phrase
from inferd.limits import RequestLimits, text_bytes, too_many_elements, too_much_text
from inferd.types import DataType, Tensor, element_count

_LENGTH = struct.Struct("<I")
# numpy holds at most 2**63 - 1 bytes in an array, counting its zero-size dimensions as one; with
# elements of up to 8 bytes, the product of the dimensions that are not 0 must stay below this.
MAX_SHAPE_PRODUCT = 2**60
# numpy's most dimensions (NPY_MAXDIMS); counted before any product, which for thousands of huge
# dimensions is a big-integer multiplication of seconds.
MAX_DIMENSIONS = 64


def check_shape_size(name: str, shape: tuple[int, ...]) -> None:
    """TensorDataError for a shape no array can have: more than 64 dimensions, or [0, 2**62, 2**62],
    which holds no element, yet numpy refuses to make it (ValueError), so a decoder must refuse it
    first."""
    if len(shape) > MAX_DIMENSIONS:
        raise TensorDataError(
            f"input '{name}': shape has {len(shape)} dimensions, more than a tensor can have ({MAX_DIMENSIONS})",
            tensor=name,
        )
    # Every request's inputs pass here: without a 0 in the shape (nearly always) no generator.
    product = math.prod(shape) if 0 not in shape else math.prod(d for d in shape if d)
    if product >= MAX_SHAPE_PRODUCT:
        raise TensorDataError(f"input '{name}': shape {list(shape)} is larger than any tensor can be", tensor=name)


def check_element_count(name: str, count: int, limits: RequestLimits) -> None:
    """RequestTooLargeError for a tensor of more elements than a request may hold (the service
    checks the inputs' sum): checked by each decoder once the shape agrees with the data sent, before
    any element is read one by one or a shape is filled."""
    if count > limits.max_elements:
        raise too_many_elements(name, count, limits)


def check_text_size(name: str, size: int, limits: RequestLimits) -> None:
    """RequestTooLargeError for BYTES elements of more bytes than a request may hold, as
    `limits.text_bytes` counts them: checked by each decoder before it builds the array."""
    if size > limits.max_text_bytes:
        raise too_much_text(name, size, limits)


def bytes_array(name: str, items: Any, limits: RequestLimits) -> np.ndarray[Any, Any]:
    """A flat object array of BYTES elements (a list, or protobuf's repeated field), after the text limit."""
    check_text_size(name, text_bytes(items), limits)
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


def tensor_from_bytes(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    data: bytes | memoryview,
    limits: RequestLimits,
    *,
    model: str | None = None,
) -> Tensor:
    """A tensor viewing `data` (no copy for fixed-size types). `limits`: the server's for a request's
    input (`UNLIMITED` for a response's output); `model`: the model a request's input is for; its
    errors then begin with Triton's sentence for the condition (None: a response's output, which a
    client decodes)."""
    count = element_count(shape)
    if datatype is DataType.BYTES:
        array = _bytes_elements(name, data, count, model, limits).reshape(shape)
    else:
        needed = count * datatype.itemsize
        if len(data) != needed:
            message = (
                f"input '{name}': shape {list(shape)} of {datatype.value} needs {needed} bytes "
                f"({count} elements x {datatype.itemsize}), but {len(data)} bytes were sent"
            )
            raise TensorDataError(
                _tritons(
                    f"input byte size mismatch for input '{name}' for model '{model}'. Expected {needed}, got "
                    f"{len(data)}",
                    message,
                    model,
                ),
                tensor=name,
                expected=f"{needed} bytes",
                actual=f"{len(data)} bytes",
            )
        check_element_count(name, count, limits)
        array = np.frombuffer(data, dtype=datatype.numpy_dtype).reshape(shape)
    return Tensor(name=name, datatype=datatype, shape=shape, data=array)


def tensor_to_bytes(tensor: Tensor) -> bytes:
    if tensor.datatype is DataType.BYTES:
        return serialize_bytes_elements(tensor.data)
    array = tensor.data
    if array.dtype != tensor.datatype.numpy_dtype:
        array = array.astype(tensor.datatype.numpy_dtype)
    return np.ascontiguousarray(array).tobytes()


def serialize_bytes_elements(array: np.ndarray[Any, Any]) -> bytes:
    parts: list[bytes] = []
    for item in array.reshape(-1):
        element = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_LENGTH.pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def _bytes_elements(
    name: str, data: bytes | memoryview, count: int, model: str | None, limits: RequestLimits
) -> np.ndarray[Any, Any]:
    """The elements, checked in Triton's order (its core's ValidateBytesInputs): each length prefix
    whole, no element past `count`, then exactly `count` of them. Nothing is allocated by `count`
    (which the client declares): the elements found are at most one per 4 bytes sent."""
    # The text limit first, before any loop over elements: the framing is what it counts (4 bytes of
    # length and the element's), and it bounds the loop. The element limit once the data agrees
    # with the count (an impossible count is the data's 400, as in Triton).
    check_text_size(name, len(data), limits)
    view = memoryview(data)
    found: list[bytes] = []
    offset = 0
    while offset < len(view):
        if len(view) - offset < _LENGTH.size:
            raise TensorDataError(
                _tritons(
                    f"incomplete string length indicator for inference input '{name}' for model '{model}', "
                    f"expecting {_LENGTH.size} bytes but only {len(view) - offset} bytes available",
                    f"input '{name}': BYTES data ends inside element {len(found)}'s length",
                    model,
                ),
                tensor=name,
            )
        if len(found) == count:
            raise TensorDataError(
                _tritons(
                    f"unexpected number of string elements {count + 1} for inference input '{name}' for model "
                    f"'{model}', expecting {count}",
                    f"input '{name}': {len(view) - offset} bytes remain after the {count} BYTES elements that "
                    "its shape declares",
                    model,
                ),
                tensor=name,
                expected=f"{count} elements",
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        if offset + length > len(view):
            raise TensorDataError(
                f"input '{name}': BYTES element {len(found)} declares {length} bytes but only "
                f"{len(view) - offset} remain",
                tensor=name,
            )
        found.append(bytes(view[offset : offset + length]))
        offset += length
    if len(found) != count:
        raise TensorDataError(
            _tritons(
                f"expected {count} string elements for inference input '{name}' for model '{model}', got {len(found)}",
                f"input '{name}': its shape declares {count} BYTES elements, the data holds {len(found)}",
                model,
            ),
            tensor=name,
            expected=f"{count} elements",
            actual=f"{len(found)} elements",
        )
    check_element_count(name, count, limits)
    elements = np.empty(count, dtype=object)
    elements[:] = found
    return elements


def _tritons(phrase: str, message: str, model: str | None) -> str:
    """A request's error begins with Triton's phrase; a response's (no model) is inferd's message alone."""
    return with_triton_phrase(phrase, message) if model is not None else message

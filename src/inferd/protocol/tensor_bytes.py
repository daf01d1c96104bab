"""Raw tensor bytes ⇄ numpy arrays, as the v2 binary extension and gRPC raw contents carry them.

Fixed-size datatypes are little-endian row-major; BYTES elements are each a 4-byte little-endian
length followed by that many bytes. Sizes are checked against the declared shape before any
allocation, so a request cannot make the server allocate more than it sent.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from inferd.errors import TensorDataError
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


def tensor_from_bytes(name: str, datatype: DataType, shape: tuple[int, ...], data: bytes | memoryview) -> Tensor:
    """A tensor viewing `data` (no copy for fixed-size types)."""
    count = element_count(shape)
    if datatype is DataType.BYTES:
        array = _bytes_elements(name, data, count).reshape(shape)
    else:
        needed = count * datatype.itemsize
        if len(data) != needed:
            raise TensorDataError(
                f"input '{name}': shape {list(shape)} of {datatype.value} needs {needed} bytes "
                f"({count} elements x {datatype.itemsize}), but {len(data)} bytes were sent",
                tensor=name,
                expected=f"{needed} bytes",
                actual=f"{len(data)} bytes",
            )
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


def _bytes_elements(name: str, data: bytes | memoryview, count: int) -> np.ndarray[Any, Any]:
    # Each element costs at least its 4-byte length: reject impossible counts before looping.
    if count * _LENGTH.size > len(data):
        raise TensorDataError(
            f"input '{name}': {count} BYTES elements need at least {count * _LENGTH.size} bytes of "
            f"length prefixes, but {len(data)} bytes were sent",
            tensor=name,
        )
    view = memoryview(data)
    elements = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + _LENGTH.size > len(view):
            raise TensorDataError(f"input '{name}': BYTES data ends inside element {index}'s length", tensor=name)
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        if offset + length > len(view):
            raise TensorDataError(
                f"input '{name}': BYTES element {index} declares {length} bytes but only {len(view) - offset} remain",
                tensor=name,
            )
        elements[index] = bytes(view[offset : offset + length])
        offset += length
    if offset != len(view):
        raise TensorDataError(
            f"input '{name}': {len(view) - offset} bytes remain after the {count} BYTES elements that "
            "its shape declares",
            tensor=name,
            expected=f"{count} elements",
        )
    return elements

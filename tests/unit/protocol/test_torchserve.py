"""TorchServe's /predictions answers: a model's outputs as its Python handlers would write them."""

from __future__ import annotations

import json

import numpy as np

from inferd.protocol import torchserve
from inferd.types import DataType, Tensor


def tensor(name: str, data: np.ndarray) -> Tensor:
    return Tensor(name, DataType.from_numpy(data.dtype), data.shape, data)


def test_nan_and_infinities_are_written_as_python_s_json_writes_them() -> None:
    # TorchServe's handlers answer with json.dumps: NaN, Infinity, -Infinity; its clients read them so.
    values = np.array([[np.nan, np.inf], [-np.inf, 0.1]], np.float32)
    assert torchserve.encode_outputs([tensor("y", values)]) == b"[[NaN,Infinity],[-Infinity,0.1]]"
    named = torchserve.encode_outputs([tensor("a", values[0]), tensor("b", np.array([1, 2], np.int32))])
    assert named == b'{"a":[NaN,Infinity],"b":[1,2]}'
    np.testing.assert_array_equal(json.loads(named)["a"], values[0])


def test_outputs_in_any_layout_are_answered() -> None:
    # orjson writes only C-contiguous arrays of rank 1 or more: a model's transposed output or a
    # scalar must still be answered, not fail after the model ran.
    transposed = np.arange(6, dtype=np.float32).reshape(2, 3).T
    assert json.loads(torchserve.encode_outputs([tensor("y", transposed)])) == transposed.tolist()
    assert torchserve.encode_outputs([tensor("y", np.array(np.float32(0.1)))]) == b"0.1"

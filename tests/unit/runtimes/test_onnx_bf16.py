"""ONNX models with bfloat16 tensors, whose arrays ONNX Runtime's Python API neither takes nor gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from inferd.config.model import InstanceGroup, ModelConfig
from inferd.errors import ModelLoadError
from inferd.runtimes.base import RuntimeOptions
from inferd.runtimes.onnx import OnnxRuntime
from inferd.types import DataType

BF16 = DataType.BF16.numpy_dtype


def model(path: Path, nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list[object]]],
          outputs: list[tuple[str, int, list[object]]]) -> OnnxRuntime:  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    path.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_model, str(path / "model.onnx"))
    return OnnxRuntime(ModelConfig(name="m"), path, RuntimeOptions(InstanceGroup(), intra_op_threads=None))


def test_a_bf16_scalar_keeps_its_shape_and_bits(tmp_path: Path) -> None:
    runtime = model(
        tmp_path, [helper.make_node("Identity", ["x"], ["y"])], [("x", TensorProto.BFLOAT16, [])],
        [("y", TensorProto.BFLOAT16, [])],
    )  # fmt: skip
    answer = runtime.execute({"x": np.array(1.5, dtype=BF16)}, ["y"])["y"]
    assert answer.shape == () and answer.dtype == BF16 and float(answer) == 1.5


def test_strings_beside_bf16_inputs_run(tmp_path: Path) -> None:
    runtime = model(
        tmp_path,
        [
            helper.make_node("Identity", ["text"], ["same"]),
            helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT),
        ],
        [("text", TensorProto.STRING, [2]), ("x", TensorProto.BFLOAT16, [2])],
        [("same", TensorProto.STRING, [2]), ("y", TensorProto.FLOAT, [2])],
    )
    x = np.array([1.5, -2.0], dtype=BF16)[::-1]  # strided: not C-contiguous
    answer = runtime.execute({"text": np.array([b"a", "ö".encode()], dtype=object), "x": x}, ["same", "y"])
    assert answer["same"].tolist() == [b"a", "ö".encode()]
    assert answer["y"].tolist() == [-2.0, 1.5]


def test_strings_in_and_bf16_out_is_a_load_error_that_says_why(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"takes strings .* and answers bfloat16"):
        model(
            tmp_path,
            [helper.make_node("Identity", ["text"], ["same"]), helper.make_node("Identity", ["x"], ["y"])],
            [("text", TensorProto.STRING, [2]), ("x", TensorProto.BFLOAT16, [2])],
            [("same", TensorProto.STRING, [2]), ("y", TensorProto.BFLOAT16, [2])],
        )

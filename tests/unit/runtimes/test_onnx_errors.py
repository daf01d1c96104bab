"""ONNX Runtime's execution errors as inferd's, on real sessions of models built by code: a kernel
that fails on the inputs' shapes is the request's fault (400, the model's limit named where ORT's
words give it), never with ORT's source paths; the log's message keeps them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferd.config.model import InstanceGroup, InstanceKind, ModelConfig
from inferd.errors import InferdError, InternalError, InvalidRequestError
from inferd.runtimes import RuntimeOptions, load_runtime
from inferd.runtimes.onnx_errors import execution_error, without_source_locations
from inferd.testing.models import positions_model

OPTIONS = RuntimeOptions(instance_group=InstanceGroup(kind=InstanceKind.CPU), intra_op_threads=None)


def failure(tmp_path: Path, length: int) -> InferdError:
    positions_model(tmp_path / "1" / "model.onnx", max_positions=8)
    runtime = load_runtime(ModelConfig(name="positions"), tmp_path / "1", OPTIONS)
    try:
        assert runtime.execute({"input_ids": np.zeros((1, 8), dtype=np.int64)}, ["y"])["y"].shape == (1, 8, 4)
        with pytest.raises(InferdError) as raised:
            runtime.execute({"input_ids": np.zeros((1, length), dtype=np.int64)}, ["y"])
    finally:
        runtime.close()
    return raised.value


def test_a_sequence_longer_than_the_graph_takes_is_the_requests_fault_naming_the_limit(tmp_path: Path) -> None:
    error = failure(tmp_path, 9)
    assert isinstance(error, InvalidRequestError)
    assert error.message.startswith("model 'positions' cannot run on these inputs ('input_ids' [1, 9]): its Add node")
    assert "the model takes at most 8 there" in error.message
    assert "onnxruntime/" not in error.message and "was false" not in error.message
    # The server's log keeps what ONNX Runtime said, where in its sources included.
    assert "onnxruntime/core/providers/cpu/math/element_wise_ops.h" in error.logged


def test_source_locations_leave_the_message_and_what_it_says_stays() -> None:
    said = (
        "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. Name:'r' "
        "Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/reshape_helper.h:91 "
        "onnxruntime::ReshapeHelper::ReshapeHelper(const onnxruntime::TensorShape&, onnxruntime::TensorShapeVector&, "
        "bool) input_shape_size == requested_shape_size was false. The input tensor cannot be reshaped to the "
        "requested shape. Input shape:{9}, requested shape:{2,4}\n"
    )
    error = execution_error("m", RuntimeError(said), {"x": np.zeros(9)}, invalid_argument=False)
    assert isinstance(error, InvalidRequestError)
    assert error.message == (
        "model 'm' cannot run on these inputs ('x' [9]): its Reshape node 'r' failed: The input tensor cannot be "
        "reshaped to the requested shape. Input shape:{9}, requested shape:{2,4}"
    )
    # A failure that is not about the inputs' shapes stays the server's, its source path gone.
    location = "D:\\a\\_work\\1\\s\\onnxruntime\\core\\framework\\bfc_arena.cc:376"
    alloc = f"[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : {location} Failed"
    error = execution_error("m", RuntimeError(alloc), {"x": np.zeros(9)}, invalid_argument=False)
    assert (
        isinstance(error, InternalError)
        and error.message == "onnxruntime failed: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed"
    )
    assert without_source_locations("no location here") == "no location here"

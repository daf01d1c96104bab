"""The PyTorch runtime: device choice (a pure function, so the GPU path is tested without one),
TorchScript and torch.export files, Triton's tensor naming, and errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from inferd.config.loader import parse_model_config
from inferd.config.model import InstanceGroup, InstanceKind, ModelConfig
from inferd.core.loading import load_version
from inferd.core.metrics import NoMetrics
from inferd.errors import InvalidRequestError, ModelConfigError, ModelLoadError
from inferd.runtimes import load_runtime
from inferd.runtimes.base import RuntimeOptions
from inferd.runtimes.pytorch import select_device
from inferd.testing.models import exported_model, torch_module, torchscript_model
from inferd.types import DataType

OPTIONS = RuntimeOptions(instance_group=InstanceGroup(kind=InstanceKind.CPU), intra_op_threads=None)
TRITON_NAMES = """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 1 ] },
        { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def expected(seed: int, x: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        y, total = torch_module(seed)(torch.tensor(x), torch.tensor(scale))
    return y.numpy(), total.numpy()


@pytest.mark.parametrize(
    ("kind", "cuda_count", "gpus", "device"),
    [
        (InstanceKind.CPU, 2, (), "cpu"),
        (InstanceKind.AUTO, 0, (), "cpu"),
        (InstanceKind.AUTO, 1, (), "cuda:0"),
        (InstanceKind.MODEL, 0, (), "cpu"),
        (InstanceKind.GPU, 2, (1,), "cuda:1"),
    ],
)
def test_device_follows_the_instance_kind(
    kind: InstanceKind, cuda_count: int, gpus: tuple[int, ...], device: str
) -> None:
    assert select_device(kind, cuda_count=cuda_count, gpus=gpus) == device


def test_a_gpu_asked_for_and_missing_is_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match="torch sees none"):
        select_device(InstanceKind.GPU, cuda_count=0)
    with pytest.raises(ModelLoadError, match="asks for GPU 3, but torch sees 1"):
        select_device(InstanceKind.GPU, cuda_count=1, gpus=(3,))


def test_torchscript_with_tritons_names_maps_inputs_and_outputs_by_index(tmp_path: Path) -> None:
    torchscript_model(tmp_path / "1" / "model.pt", seed=3)
    runtime = load_runtime(parse_model_config(TRITON_NAMES, model_name="m"), tmp_path / "1", OPTIONS)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    scale = np.array([[1.0], [2.0]], dtype=np.float32)
    out = runtime.execute({"INPUT__0": x, "INPUT__1": scale}, ["OUTPUT__0", "OUTPUT__1"])
    y, total = expected(3, x, scale)
    np.testing.assert_allclose(out["OUTPUT__0"], y, rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT__1"], total, rtol=1e-6)


def test_torchscript_inputs_named_as_the_forward_arguments(tmp_path: Path) -> None:
    torchscript_model(tmp_path / "1" / "model.pt", seed=3)
    config = """
    max_batch_size: 8
    input [ { name: "scale" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
    """
    runtime = load_runtime(parse_model_config(config, model_name="m"), tmp_path / "1", OPTIONS)
    x, scale = np.ones((1, 4), np.float32), np.full((1, 1), 3.0, np.float32)
    np.testing.assert_allclose(runtime.execute({"x": x, "scale": scale}, ["y"])["y"], expected(3, x, scale)[0])


def test_torchscript_needs_its_tensors_in_the_config(tmp_path: Path) -> None:
    torchscript_model(tmp_path / "1" / "model.pt")
    with pytest.raises(ModelLoadError, match=r"declares its tensors in config\.pbtxt"):
        load_runtime(ModelConfig(name="m"), tmp_path / "1", OPTIONS)


def test_exported_program_completes_its_own_config(tmp_path: Path) -> None:
    exported_model(tmp_path / "m" / "1" / "model.pt2", seed=5)
    handle, _ = load_version(ModelConfig(name="m"), 1, tmp_path / "m" / "1", tmp_path / "m", NoMetrics())
    try:
        config = handle.config
        assert (config.platform, config.backend, config.max_batch_size) == ("pytorch_libtorch", "pytorch", 4)
        assert [(t.name, t.datatype, t.dims) for t in config.inputs] == [
            ("x", DataType.FP32, (4,)),
            ("scale", DataType.FP32, (1,)),
        ]
        assert [(t.name, t.dims) for t in config.outputs] == [("OUTPUT__0", (3,)), ("OUTPUT__1", (1,))]
        x = np.ones((3, 4), np.float32)
        x.flags.writeable = False  # as a binary request's tensors are: copied for torch
        scale = np.ones((3, 1), np.float32)
        out = handle.pool.run_blocking({"x": x, "scale": scale}, ["OUTPUT__0"])
        np.testing.assert_allclose(out["OUTPUT__0"], expected(5, x, scale)[0], rtol=1e-6)
    finally:
        handle.pool.close()


def test_inputs_the_module_rejects_are_the_requests_fault(tmp_path: Path) -> None:
    exported_model(tmp_path / "1" / "model.pt2")
    runtime = load_runtime(ModelConfig(name="m"), tmp_path / "1", OPTIONS)
    with pytest.raises(InvalidRequestError, match="the model rejected the inputs"):
        runtime.execute({"x": np.ones((2, 4), np.float32), "scale": np.ones((3, 1), np.float32)}, ["OUTPUT__0"])


def test_an_unreadable_file_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.pt").write_bytes(b"not a torch file")
    with pytest.raises(ModelLoadError, match="torch cannot load"):
        load_runtime(parse_model_config(TRITON_NAMES, model_name="m"), tmp_path / "1", OPTIONS)


def autocast_expected(seed: int, x: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        y, total = torch_module(seed)(torch.tensor(x), torch.tensor(scale))
    return y.float().numpy(), total.float().numpy()


@pytest.mark.parametrize("file", ["model.pt2", "model.pt"])
def test_mixed_precision_bfloat16_runs_under_autocast_and_answers_in_the_declared_float32(
    tmp_path: Path, file: str
) -> None:
    (exported_model if file == "model.pt2" else torchscript_model)(tmp_path / "1" / file, seed=6)
    text = TRITON_NAMES.replace("INPUT__1", "scale").replace("INPUT__0", "x") if file == "model.pt" else ""
    plain = parse_model_config(text, model_name="m")
    mixed = parse_model_config(text + 'parameters { key: "MIXED_PRECISION" value { string_value: "bfloat16" } }',
                               model_name="m")  # fmt: skip
    x = np.random.default_rng(6).standard_normal((5, 4)).astype(np.float32)
    scale = np.full((5, 1), 1.7, np.float32)
    names = ["OUTPUT__0", "OUTPUT__1"] if file == "model.pt2" else ["OUTPUT__1", "OUTPUT__0"]  # Triton's order
    float32 = load_runtime(plain, tmp_path / "1", OPTIONS).execute({"x": x, "scale": scale}, names)
    bfloat16 = load_runtime(mixed, tmp_path / "1", OPTIONS).execute({"x": x, "scale": scale}, names)
    y_name = "OUTPUT__0"
    assert bfloat16[y_name].dtype == np.float32
    np.testing.assert_array_equal(float32[y_name], expected(6, x, scale)[0])
    np.testing.assert_array_equal(bfloat16[y_name], autocast_expected(6, x, scale)[0])
    assert not np.array_equal(bfloat16[y_name], float32[y_name])  # computed in bfloat16: rounded
    np.testing.assert_allclose(bfloat16[y_name], float32[y_name], atol=0.05, rtol=0.02)


def test_mixed_precision_takes_only_bfloat16(tmp_path: Path) -> None:
    exported_model(tmp_path / "1" / "model.pt2")
    config = parse_model_config('parameters { key: "MIXED_PRECISION" value { string_value: "float16" } }',
                                model_name="m")  # fmt: skip
    with pytest.raises(ModelConfigError, match=r"MIXED_PRECISION is 'float16'; the one it takes is \"bfloat16\""):
        load_runtime(config, tmp_path / "1", OPTIONS)

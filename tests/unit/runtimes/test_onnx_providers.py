"""Provider selection for every instance kind, with and without a GPU (none is present here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferd.config.model import InstanceKind
from inferd.errors import ModelLoadError
from inferd.runtimes.onnx import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    TENSORRT_PROVIDER,
    check_started_providers,
    cuda_options_of,
    select_providers,
)

GPU_BUILD = [TENSORRT_PROVIDER, CUDA_PROVIDER, CPU_PROVIDER]
CPU_BUILD = [CPU_PROVIDER]


def test_cpu_kind_uses_cpu_even_with_a_gpu() -> None:
    assert select_providers(InstanceKind.CPU, available=GPU_BUILD, gpu_count=2) == [CPU_PROVIDER]


def test_gpu_kind_uses_cuda_on_the_asked_device_with_cpu_fallback() -> None:
    providers = select_providers(InstanceKind.GPU, available=GPU_BUILD, gpu_count=2, gpus=[1])
    assert providers == [(CUDA_PROVIDER, {"device_id": 1}), CPU_PROVIDER]


def test_tensorrt_only_when_asked() -> None:
    providers = select_providers(InstanceKind.GPU, available=GPU_BUILD, gpu_count=1, use_tensorrt=True)
    assert providers[0] == (TENSORRT_PROVIDER, {"device_id": 0})


def test_gpu_kind_without_a_gpu_fails_with_a_clear_reason() -> None:
    with pytest.raises(ModelLoadError, match="no GPU was found"):
        select_providers(InstanceKind.GPU, available=GPU_BUILD, gpu_count=0)
    with pytest.raises(ModelLoadError, match="lacks CUDAExecutionProvider"):
        select_providers(InstanceKind.GPU, available=CPU_BUILD, gpu_count=1)
    with pytest.raises(ModelLoadError, match="GPU 3"):
        select_providers(InstanceKind.GPU, available=GPU_BUILD, gpu_count=2, gpus=[3])


@pytest.mark.parametrize("kind", [InstanceKind.AUTO, InstanceKind.MODEL])
def test_auto_falls_back_to_cpu_and_prefers_a_gpu(kind: InstanceKind) -> None:
    assert select_providers(kind, available=GPU_BUILD, gpu_count=0) == [CPU_PROVIDER]
    assert select_providers(kind, available=CPU_BUILD, gpu_count=1) == [CPU_PROVIDER]
    assert select_providers(kind, available=GPU_BUILD, gpu_count=1)[0] == (CUDA_PROVIDER, {"device_id": 0})


# What onnxruntime-gpu 1.31 did on a machine without CUDA's libraries (reproduced on this CPU
# machine): it printed an error, retried with the next providers and started on CPU, no exception.
ON_CPU = [CPU_PROVIDER]


def test_a_gpu_instance_that_started_on_cpu_is_a_load_error() -> None:
    asked = select_providers(InstanceKind.GPU, available=GPU_BUILD, gpu_count=1)
    with pytest.raises(ModelLoadError, match=r"could not start CUDAExecutionProvider.*run on CPUExecutionProvider"):
        check_started_providers(InstanceKind.GPU, asked=asked, started=ON_CPU)


@pytest.mark.parametrize("kind", [InstanceKind.AUTO, InstanceKind.MODEL])
def test_an_auto_instance_that_fell_to_cpu_says_so(kind: InstanceKind) -> None:
    asked = select_providers(kind, available=GPU_BUILD, gpu_count=1)
    said = check_started_providers(kind, asked=asked, started=ON_CPU)
    assert said is not None and "CUDAExecutionProvider" in said and "runs on CPUExecutionProvider" in said


def test_tensorrt_that_could_not_start_leaves_a_gpu_instance_on_cuda_with_a_word() -> None:
    asked = select_providers(InstanceKind.GPU, available=GPU_BUILD, gpu_count=1, use_tensorrt=True)
    said = check_started_providers(InstanceKind.GPU, asked=asked, started=[CUDA_PROVIDER, CPU_PROVIDER])
    assert said is not None and TENSORRT_PROVIDER in said and CUDA_PROVIDER not in said.split("runs on")[0]


def test_sessions_that_started_as_asked_say_nothing() -> None:
    assert check_started_providers(InstanceKind.CPU, asked=ON_CPU, started=ON_CPU) is None
    asked = select_providers(InstanceKind.GPU, available=GPU_BUILD, gpu_count=1, use_tensorrt=True)
    started = [TENSORRT_PROVIDER, CUDA_PROVIDER, CPU_PROVIDER]
    assert check_started_providers(InstanceKind.GPU, asked=asked, started=started) is None


@pytest.mark.parametrize(("asked", "option"), [("1", "HEURISTIC"), ("0", "EXHAUSTIVE"), ("heuristic", "HEURISTIC")])
def test_a_conv_algo_search_reaches_the_cuda_provider(asked: str, option: str) -> None:
    options = cuda_options_of({"cudnn_conv_algo_search": asked})
    providers = select_providers(InstanceKind.GPU, available=GPU_BUILD, gpu_count=1, cuda_options=options)
    assert providers[0] == (CUDA_PROVIDER, {"device_id": 0, "cudnn_conv_algo_search": option})
    assert cuda_options_of({}) == {}


def test_an_unknown_conv_algo_search_is_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match="cudnn_conv_algo_search is '3'"):
        cuda_options_of({"cudnn_conv_algo_search": "3"})


def test_a_session_that_fell_to_cpu_fails_a_gpu_instance_and_warns_for_auto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What onnxruntime-gpu does without CUDA's libraries, played on this CPU machine: the build
    lists CUDA, the session asked for it starts on CPU, without an exception."""
    import onnxruntime

    from inferd.config.loader import parse_model_config
    from inferd.config.model import InstanceGroup
    from inferd.runtimes import onnx as onnx_runtime
    from inferd.runtimes.base import RuntimeOptions
    from inferd.testing.models import mlp_model

    mlp_model(tmp_path / "1" / "model.onnx")
    real_session = onnxruntime.InferenceSession
    asked: list[Any] = []

    def session_on_cpu(path: str, sess_options: Any = None, providers: Any = None) -> Any:
        asked.append(providers)
        return real_session(path, sess_options=sess_options, providers=[CPU_PROVIDER])

    monkeypatch.setattr(onnx_runtime, "detect_gpu_count", lambda: 1)
    monkeypatch.setattr(onnx_runtime.ort, "get_available_providers", lambda: GPU_BUILD)
    monkeypatch.setattr(onnx_runtime.ort, "InferenceSession", session_on_cpu)
    config = parse_model_config('platform: "onnxruntime_onnx"\nmax_batch_size: 4', model_name="m")
    with pytest.raises(ModelLoadError, match="could not start CUDAExecutionProvider"):
        onnx_runtime.OnnxRuntime(config, tmp_path / "1", RuntimeOptions(InstanceGroup(kind=InstanceKind.GPU), None))
    runtime = onnx_runtime.OnnxRuntime(
        config, tmp_path / "1", RuntimeOptions(InstanceGroup(kind=InstanceKind.AUTO), None)
    )
    assert "this instance runs on CPUExecutionProvider" in caplog.text
    assert [entry[0] if isinstance(entry, tuple) else entry for entry in asked[1]] == [CUDA_PROVIDER, CPU_PROVIDER]
    runtime.close()

"""Provider selection for every instance kind, with and without a GPU (none is present here)."""

from __future__ import annotations

import pytest

from inferd.config.model import InstanceKind
from inferd.errors import ModelLoadError
from inferd.runtimes.onnx import CPU_PROVIDER, CUDA_PROVIDER, TENSORRT_PROVIDER, select_providers

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

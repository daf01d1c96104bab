"""Runtimes, chosen by a model's platform/backend name and imported only when a model needs one."""

from __future__ import annotations

import importlib
from pathlib import Path

from inferd.config.model import ModelConfig
from inferd.errors import ModelLoadError
from inferd.runtimes.base import Runtime, RuntimeFactory, RuntimeOptions

# platform or backend name (Triton's spelling) → "module:attribute" of its factory.
_FACTORIES = {
    "onnxruntime_onnx": "inferd.runtimes.onnx:OnnxRuntime",
    "onnxruntime": "inferd.runtimes.onnx:OnnxRuntime",
}


def supported_platforms() -> list[str]:
    return sorted(_FACTORIES)


# File suffix → platform, for models that come without a config.pbtxt naming one.
_PLATFORMS_BY_SUFFIX = {".onnx": "onnxruntime_onnx"}


def detect_platform(version_dir: Path) -> str:
    """The platform of the model file in `version_dir`, or "" when nothing there is recognised."""
    if version_dir.is_dir():
        for child in sorted(version_dir.iterdir()):
            platform = _PLATFORMS_BY_SUFFIX.get(child.suffix)
            if platform:
                return platform
    return ""


# platform → "module:attribute" of its `estimate_memory_bytes(model_bytes) -> int` per instance.
_MEMORY_ESTIMATES = {
    "onnxruntime_onnx": "inferd.runtimes.onnx:estimate_memory_bytes",
    "onnxruntime": "inferd.runtimes.onnx:estimate_memory_bytes",
}


def estimate_memory_bytes(config: ModelConfig, version_dir: Path, model_bytes: int) -> int:
    """What a version whose files hold `model_bytes` keeps resident once loaded, all its instances
    together, by its runtime's own rule (before loading: to decide what must make room)."""
    name = config.platform or config.backend or detect_platform(version_dir)
    target = _MEMORY_ESTIMATES.get(name, _MEMORY_ESTIMATES["onnxruntime"])
    module_name, attribute = target.split(":")
    per_instance = getattr(importlib.import_module(module_name), attribute)
    instances = sum(group.count for group in config.instance_groups) or 1
    return int(per_instance(model_bytes)) * instances


def load_runtime(config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> Runtime:
    """Load one instance of the model version in `version_dir` with the runtime its config names."""
    name = config.platform or config.backend or detect_platform(version_dir)
    target = _FACTORIES.get(name)
    if target is None:
        raise ModelLoadError(
            f"model '{config.name}': platform/backend '{name}' is not supported "
            f"(supported: {', '.join(supported_platforms())})"
        )
    module_name, attribute = target.split(":")
    factory: RuntimeFactory = getattr(importlib.import_module(module_name), attribute)
    return factory(config, version_dir, options)


__all__ = [
    "Runtime",
    "RuntimeOptions",
    "detect_platform",
    "estimate_memory_bytes",
    "load_runtime",
    "supported_platforms",
]

"""Runtimes, chosen by a model's platform/backend name (or its model file) and imported only when a
model needs one: `import inferd` never imports torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.config.model import ModelConfig
from inferd.errors import ModelLoadError
from inferd.runtimes.base import Runtime, RuntimeFactory, RuntimeOptions
from inferd.runtimes.padded import PaddedBatches, allowed_batch_sizes


@dataclass(frozen=True, slots=True)
class RuntimeKind:
    """What inferd knows of one runtime before importing it."""

    platform: str
    """Triton's platform name, which completed configs report ("" where Triton names only a backend)."""
    backend: str
    factory: str
    """"module:attribute" of its RuntimeFactory."""
    memory_estimate: str
    """"module:attribute" of its `estimate_memory_bytes(model_bytes) -> int`, per instance."""
    model_files: tuple[str, ...]
    """Default model file names, in the order they are looked for; the first names a new model's."""
    extra: str = ""
    """The optional dependency it needs, for the load error when it is missing."""


ONNX = RuntimeKind(
    platform="onnxruntime_onnx",
    backend="onnxruntime",
    factory="inferd.runtimes.onnx:OnnxRuntime",
    memory_estimate="inferd.runtimes.onnx:estimate_memory_bytes",
    model_files=("model.onnx",),
)
PYTORCH = RuntimeKind(
    platform="pytorch_libtorch",
    backend="pytorch",
    factory="inferd.runtimes.pytorch:PyTorchRuntime",
    memory_estimate="inferd.runtimes.pytorch:estimate_memory_bytes",
    model_files=("model.pt", "model.pt2"),
    extra="pip install 'inferd[pytorch]' torch==2.13.0",
)
PYTHON = RuntimeKind(
    platform="",
    backend="python",
    factory="inferd.runtimes.python:PythonRuntime",
    memory_estimate="inferd.runtimes.python:estimate_memory_bytes",
    model_files=("model.py",),
)
TOKENIZER = RuntimeKind(
    platform="",
    backend="tokenizer",
    factory="inferd.runtimes.tokenizer:TokenizerRuntime",
    memory_estimate="inferd.runtimes.tokenizer:estimate_memory_bytes",
    model_files=("tokenizer.json",),
)
REMOTE = RuntimeKind(
    platform="",
    backend="remote",
    factory="inferd.runtimes.remote:RemoteRuntime",
    memory_estimate="inferd.runtimes.remote:estimate_memory_bytes",
    model_files=(),  # nothing on disk: the model is another server's
)
TENSORFLOW = RuntimeKind(
    platform="tensorflow_savedmodel",
    backend="tensorflow",
    factory="inferd.runtimes.tensorflow:SavedModelRuntime",
    memory_estimate="inferd.runtimes.tensorflow:estimate_memory_bytes",
    # Triton's layout (a model.savedmodel/ folder in the version folder), then TF Serving's (the
    # SavedModel's own files in the version folder).
    model_files=("model.savedmodel", "saved_model.pb"),
    extra="pip install 'inferd[tensorflow]'",
)
KINDS = (ONNX, PYTORCH, PYTHON, TOKENIZER, REMOTE, TENSORFLOW)
# Kinds whose model file may have any name with their suffix (a .json or .py beside is not a model).
_ANY_NAME = (ONNX, PYTORCH)

# Every spelling Triton accepts in `platform` or `backend`.
_KINDS_BY_NAME = {name: kind for kind in KINDS for name in (kind.platform, kind.backend) if name}
_KINDS_BY_FILE = {file: kind for kind in KINDS for file in kind.model_files}
_KINDS_BY_SUFFIX = {Path(file).suffix: kind for kind in KINDS for file in kind.model_files}


def supported_platforms() -> list[str]:
    return sorted(_KINDS_BY_NAME)


def runtime_kind(config: ModelConfig, version_dir: Path) -> RuntimeKind:
    """The runtime of a model version: named by its config, else told by its model file."""
    name = config.platform or config.backend
    if name:
        kind = _KINDS_BY_NAME.get(name)
        if kind is None:
            raise ModelLoadError(
                f"model '{config.name}': platform/backend '{name}' is not supported "
                f"(supported: {', '.join(supported_platforms())})"
            )
        return kind
    detected = detect_runtime(version_dir, config.default_model_filename)
    if detected is None:
        files = sorted(p.name for p in version_dir.iterdir()) if version_dir.is_dir() else []
        raise ModelLoadError(
            f"model '{config.name}': no platform or backend in its config, and no model file in "
            f"{version_dir}/ tells one ({', '.join(sorted(_KINDS_BY_FILE))} do; found: {', '.join(files) or 'nothing'})"
        )
    return detected


def detect_runtime(version_dir: Path, model_filename: str = "") -> RuntimeKind | None:
    """The runtime whose model file is in `version_dir`, or None when nothing there is recognised."""
    if not version_dir.is_dir():
        return None
    if model_filename:
        return _KINDS_BY_SUFFIX.get(Path(model_filename).suffix)
    names = sorted(child.name for child in version_dir.iterdir())
    for name in names:  # a default model file name first: a helper.py beside model.onnx is not the model
        if name in _KINDS_BY_FILE:
            return _KINDS_BY_FILE[name]
    for name in names:
        kind = _KINDS_BY_SUFFIX.get(Path(name).suffix)
        if kind in _ANY_NAME:  # any .onnx or .pt file; only model.py or tokenizer.json is a model
            return kind
    return None


def needs_files(config: ModelConfig) -> bool:
    """Whether the model's versions need files (a remote model's, named by its config, do not)."""
    name = config.platform or config.backend
    kind = _KINDS_BY_NAME.get(name) if name else None
    return kind is None or bool(kind.model_files)


def estimate_memory_bytes(config: ModelConfig, version_dir: Path, model_bytes: int) -> int:
    """What a version whose files hold `model_bytes` keeps resident once loaded, all its instances
    together, by its runtime's own rule (before loading: to decide what must make room)."""
    try:
        kind = runtime_kind(config, version_dir)
    except ModelLoadError:  # it will fail to load, with this reason; until then, count it as ONNX
        kind = ONNX
    per_instance: Callable[[int], int] = _attribute(kind.memory_estimate, kind, config)
    instances = sum(group.count for group in config.instance_groups) or 1
    return int(per_instance(model_bytes)) * instances


def load_runtime(config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> Runtime:
    """Load one instance of the model version in `version_dir` with the runtime its config names."""
    kind = runtime_kind(config, version_dir)
    factory: RuntimeFactory = _attribute(kind.factory, kind, config)
    sizes = allowed_batch_sizes(config)  # a bad list fails before a session is made
    runtime = factory(config, version_dir, options)
    return PaddedBatches(runtime, sizes, config.name) if sizes else runtime


def _attribute(target: str, kind: RuntimeKind, config: ModelConfig) -> Any:
    module_name, attribute = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; install it with: {kind.extra}" if kind.extra else ""
        raise ModelLoadError(
            f"model '{config.name}' needs the {kind.backend} runtime, which cannot be imported ({exc}){hint}"
        ) from exc
    return getattr(module, attribute)


__all__ = [
    "KINDS",
    "ONNX",
    "PYTHON",
    "PYTORCH",
    "REMOTE",
    "TENSORFLOW",
    "TOKENIZER",
    "Runtime",
    "RuntimeKind",
    "RuntimeOptions",
    "detect_runtime",
    "estimate_memory_bytes",
    "load_runtime",
    "needs_files",
    "runtime_kind",
    "supported_platforms",
]

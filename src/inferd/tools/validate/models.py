"""The two sides `inferd validate` compares: a model file or folder run in-process by inferd's own
runtimes (what the server would load), or a model on a running server (through inferd.client).
Both answer `run(inputs) -> outputs` for one sample at a time and describe their tensors as the
server's metadata does."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from inferd.client import Client, parse_url
from inferd.config.loader import read_model_config
from inferd.config.model import InstanceGroup, ModelConfig
from inferd.runtimes import Runtime, RuntimeOptions, detect_runtime, load_runtime
from inferd.types import ModelMetadata, TensorMetadata

Arrays = dict[str, np.ndarray[Any, Any]]


class ModelUnderTest(Protocol):
    name: str
    metadata: ModelMetadata
    max_batch_size: int

    def run(self, inputs: Arrays, outputs: list[str]) -> Arrays: ...

    def close(self) -> None: ...


class LocalModel:
    """A model file (model.onnx, model.pt, model.pt2, model.py, any name with a known suffix), a
    version folder, or a model folder (its newest version, with its config.pbtxt)."""

    def __init__(self, path: Path) -> None:
        config, version_dir = _locate(path)
        self.name = str(path)
        self._runtime: Runtime = load_runtime(
            config, version_dir, RuntimeOptions(InstanceGroup(), intra_op_threads=None)
        )
        signature = self._runtime.signature
        # A model batches when every tensor's first dimension is variable (as auto-complete judges).
        tensors = (*signature.inputs, *signature.outputs)
        self.max_batch_size = config.max_batch_size or (1 << 16 if all(t.shape[:1] == (-1,) for t in tensors) else 0)

        def described(specs: Any) -> tuple[TensorMetadata, ...]:
            return tuple(TensorMetadata(t.name, t.datatype.value, t.shape) for t in specs)

        self.metadata = ModelMetadata(
            config.name, ("1",), "", described(signature.inputs), described(signature.outputs)
        )

    def run(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        return self._runtime.execute(inputs, outputs)

    def close(self) -> None:
        self._runtime.close()


class ServerModel:
    """`http://host:port/MODEL` or `grpc://host:port/MODEL` (optionally `/MODEL/VERSION`)."""

    def __init__(self, spec: str) -> None:
        scheme, _, rest = spec.partition("://")
        address, _, model_path = rest.partition("/")
        model, _, version = model_path.partition("/")
        if not model:
            raise ValueError(f"{spec!r}: name the model after the server, as http://localhost:8000/minilm")
        parse_url(f"{scheme}://{address}")  # a usage error now, naming the spec, rather than later
        self.name = spec
        self._model, self._version = model, version
        self._client = Client(f"{scheme}://{address}", timeout_s=120)
        self.metadata = self._client.model_metadata(model, version)
        self.max_batch_size = int(self._client.model_config(model, version).get("max_batch_size", 0))

    def run(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        response = self._client.infer(self._model, inputs, outputs=outputs, version=self._version)
        return {name: response.as_numpy(name) for name in outputs}

    def close(self) -> None:
        self._client.close()


def open_model(spec: str) -> ModelUnderTest:
    """A server model for an http:// or grpc:// spec, else a local path."""
    if spec.startswith(("http://", "grpc://")):
        return ServerModel(spec)
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"'{spec}' is neither a model file or folder nor a server model (http://host:port/MODEL)")
    return LocalModel(path)


def _locate(path: Path) -> tuple[ModelConfig, Path]:
    """The config and version folder of a model file, version folder or model folder."""
    if path.is_file():
        return ModelConfig(name=path.stem, default_model_filename=path.name), path.parent
    if detect_runtime(path) is not None:  # a version folder
        return ModelConfig(name=path.parent.name), path
    versions = sorted((int(p.name), p) for p in path.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise ValueError(f"'{path}' holds no model file and no version folder")
    return read_model_config(path), versions[-1][1]

"""PyTorch: TorchScript (`model.pt`, Triton's `pytorch_libtorch`) and `torch.export` programs
(`model.pt2`), one module per instance, run under `torch.inference_mode`.

Tensors are matched as Triton's PyTorch backend matches them: a config name `<anything>__<i>` is the
i-th argument or output; other input names are the forward's argument names; other outputs go in
config order. A torch.export program declares its own signature (names, datatypes, dynamic
dimensions), so its config may be left out; a TorchScript file does not, so its config lists the
tensors. Device choice is a pure function of the asked kind and the GPUs torch sees, testable
without one. torch keeps one intra-op pool per process: it is sized to the cores once, whatever the
instances (as the shared ONNX Runtime pool is).

The MIXED_PRECISION parameter ("bfloat16") runs the model under `torch.autocast` on its device:
matrix products and convolutions in bfloat16, what autocast keeps in float32 (reductions,
normalisation) in float32. An output the signature declares float32 is returned as float32, so
clients see the model they had.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inferd.config.model import InstanceKind, ModelConfig, ModelSignature, TensorSpec
from inferd.config.parameters import INTER_OP_THREAD_COUNT, INTRA_OP_THREAD_COUNT
from inferd.errors import InferdError, InternalError, InvalidRequestError, ModelLoadError, ModelOutputError
from inferd.runtimes.base import (
    RuntimeOptions,
    computes_in_bfloat16,
    cores_available,
    signature_from_config,
    warn_if_bfloat16_is_slow,
)
from inferd.types import DataType

logger = logging.getLogger("inferd.pytorch")

TORCHSCRIPT_FILENAME = "model.pt"
EXPORTED_FILENAME = "model.pt2"

_DTYPES: dict[DataType, torch.dtype] = {
    DataType.BOOL: torch.bool,
    DataType.UINT8: torch.uint8,
    DataType.UINT16: torch.uint16,
    DataType.UINT32: torch.uint32,
    DataType.UINT64: torch.uint64,
    DataType.INT8: torch.int8,
    DataType.INT16: torch.int16,
    DataType.INT32: torch.int32,
    DataType.INT64: torch.int64,
    DataType.FP16: torch.float16,
    DataType.BF16: torch.bfloat16,
    DataType.FP32: torch.float32,
    DataType.FP64: torch.float64,
}
_DATATYPES = {dtype: datatype for datatype, dtype in _DTYPES.items()}
_BFLOAT16 = DataType.BF16.numpy_dtype
_INDEXED_NAME = re.compile(r"^.+__(\d+)$")

# Not measured per model: a module keeps its weights (about its file's size) and some buffers.
MEMORY_PER_FILE_BYTE = 1.2
MEMORY_PER_MODULE_BYTES = 1 << 20


def estimate_memory_bytes(model_bytes: int) -> int:
    """What one instance of a PyTorch model whose files hold `model_bytes` keeps resident."""
    return int(MEMORY_PER_FILE_BYTE * model_bytes) + MEMORY_PER_MODULE_BYTES


def select_device(kind: InstanceKind, *, cuda_count: int, gpus: Sequence[int] = ()) -> str:
    """The torch device of an instance of `kind`: KIND_GPU without a GPU is an error (as in Triton);
    KIND_AUTO and KIND_MODEL use the GPU when there is one, else the CPU."""
    if kind is InstanceKind.CPU or (kind in (InstanceKind.AUTO, InstanceKind.MODEL) and cuda_count == 0):
        return "cpu"
    if cuda_count == 0:
        raise ModelLoadError(
            "instance_group kind KIND_GPU asks for a GPU, but torch sees none "
            "(a CPU build of torch, or no CUDA device); use KIND_CPU or KIND_AUTO"
        )
    device_id = gpus[0] if gpus else 0
    if device_id >= cuda_count:
        raise ModelLoadError(
            f"instance_group asks for GPU {device_id}, but torch sees {cuda_count} GPU(s), numbered from 0"
        )
    return f"cuda:{device_id}"


_threads_lock = threading.Lock()
_threads_set = False
# torch.export.load keeps one deserializer per process (a module global it asserts is unset): two
# programs loaded at once on worker threads, as models load, failed with "_CURRENT_DESERIALIZER is
# already set". One at a time, then.
_export_load_lock = threading.Lock()


def _size_thread_pools() -> None:
    """torch's pools are per process: intra-op sized to the cores, inter-op one thread (executions
    run one per instance, on the server's threads). Set once, before the first module runs."""
    global _threads_set
    with _threads_lock:
        if _threads_set:
            return
        torch.set_num_threads(cores_available())
        # Raises once torch ran parallel work in this process: it then keeps the pool it made.
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(1)
        _threads_set = True


class PyTorchRuntime:
    # Modules only compute (torch's kernels release the GIL): a fast one may run on the loop.
    may_run_inline = True

    def __init__(self, config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> None:
        self._name = config.name
        path = _model_path(config, version_dir)
        self._autocast = computes_in_bfloat16(config)  # (checked before the module loads)
        _size_thread_pools()
        for key in (INTRA_OP_THREAD_COUNT.name, INTER_OP_THREAD_COUNT.name):
            if key in config.parameters:
                logger.warning(
                    "model %s: parameter %s is ignored: torch keeps one thread pool per process",
                    config.name,
                    key,
                    extra={"model": config.name},
                )
        group = options.instance_group
        self._device = torch.device(select_device(group.kind, cuda_count=torch.cuda.device_count(), gpus=group.gpus))
        try:
            if path.suffix == ".pt2":
                with _export_load_lock:
                    program = torch.export.load(str(path))
                self._module: Any = program.module()
                argument_names = list(program.graph_signature.user_inputs)
                declared = _exported_signature(program)
            else:
                self._module = torch.jit.load(str(path), map_location=self._device)  # type: ignore[no-untyped-call]
                argument_names = [a.name for a in self._module.forward.schema.arguments[1:]]
                declared = None
        except Exception as exc:  # torch raises its own error types for unreadable files
            raise ModelLoadError(f"torch cannot load {path}: {exc}") from exc
        if path.suffix == ".pt2" and self._device.type != "cpu":
            self._module = self._module.to(self._device)
        if path.suffix == ".pt":
            self._module.eval()
        input_positions = _input_positions(config, argument_names, path)
        output_positions = _output_positions(config)
        if declared is None:
            self._signature = _config_signature(config, path)
        else:  # the program's datatypes and shapes, under the names the config gives them
            self._signature = ModelSignature(
                inputs=_renamed(declared.inputs, input_positions, path, "inputs"),
                outputs=_renamed(declared.outputs, output_positions, path, "outputs"),
            )
        for spec in (*self._signature.inputs, *self._signature.outputs):
            if spec.datatype not in _DTYPES:
                raise ModelLoadError(f"{path}: tensor '{spec.name}' is {spec.datatype.value}, which torch cannot hold")
        names = [spec.name for spec in self._signature.inputs]
        positions = input_positions or {name: argument_names.index(name) for name in names}
        self._argument_order = sorted(names, key=lambda name: positions[name])
        self._output_positions = output_positions or {s.name: i for i, s in enumerate(self._signature.outputs)}
        if self._autocast and self._device.type == "cpu":
            warn_if_bfloat16_is_slow(config, logger)

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        arguments = [_tensor(inputs[name], self._device) for name in self._argument_order]
        try:
            with torch.inference_mode(), self._precision():
                returned = self._module(*arguments)
        except InferdError:
            raise
        except (
            RuntimeError,
            ValueError,
            TypeError,
            IndexError,
            AssertionError,
        ) as exc:  # (guards of torch.export assert)
            raise InvalidRequestError(f"the model rejected the inputs: {exc}") from exc
        except Exception as exc:
            raise InternalError(f"torch failed: {exc}") from exc
        outputs = _as_list(returned, self._signature.outputs, self._name)
        results = {}
        for name in output_names:
            position = self._output_positions.get(name)
            if position is None or position >= len(outputs):
                raise ModelOutputError(f"model '{self._name}' returned {len(outputs)} outputs, none for '{name}'")
            results[name] = _array(outputs[position])
            if self._autocast:
                results[name] = _declared_type(results[name], self._signature.outputs, name)
        return results

    def _precision(self) -> contextlib.AbstractContextManager[Any]:
        if not self._autocast:
            return contextlib.nullcontext()
        return torch.autocast(self._device.type, dtype=torch.bfloat16)

    def close(self) -> None:
        del self._module


def _model_path(config: ModelConfig, version_dir: Path) -> Path:
    names = [config.default_model_filename] if config.default_model_filename else []
    names += [TORCHSCRIPT_FILENAME, EXPORTED_FILENAME]
    for name in names:
        if (version_dir / name).is_file():
            return version_dir / name
    raise ModelLoadError(f"no {' or '.join(names)} in {version_dir}/")


def _tensor(array: np.ndarray[Any, Any], device: torch.device) -> torch.Tensor:
    # The request's own buffer when it may be written (torch cannot hold read-only memory: a
    # binary request's tensors are views of the received bytes, and are copied).
    if not array.flags.writeable:
        array = array.copy()
    if array.dtype == _BFLOAT16:  # torch takes no ml_dtypes array: the same 16 bits, seen as bfloat16
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device)


def _array(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: ml_dtypes' over the same bits
        return tensor.contiguous().view(torch.int16).numpy().view(_BFLOAT16)
    return tensor.numpy()


_FLOATS = (DataType.BF16, DataType.FP16, DataType.FP32, DataType.FP64)


def _declared_type(array: np.ndarray[Any, Any], specs: Sequence[TensorSpec], name: str) -> np.ndarray[Any, Any]:
    """A floating output of a model under autocast in the type the signature declares for it (autocast
    picks each op's type: bfloat16 for a matrix product, float32 for a reduction)."""
    declared = next((spec.datatype for spec in specs if spec.name == name), None)
    if declared not in _FLOATS or array.dtype == declared.numpy_dtype or array.dtype.kind not in "fV":
        return array
    return array.astype(declared.numpy_dtype)


def _as_list(returned: Any, specs: Sequence[TensorSpec], name: str) -> list[torch.Tensor]:
    if isinstance(returned, torch.Tensor):
        return [returned]
    if isinstance(returned, Mapping):
        return [returned[spec.name] for spec in specs if spec.name in returned]
    if isinstance(returned, (tuple, list)) and all(isinstance(item, torch.Tensor) for item in returned):
        return list(returned)
    raise ModelOutputError(f"model '{name}' returned {type(returned).__name__}, not tensors")


def _input_positions(config: ModelConfig, argument_names: list[str], path: Path) -> dict[str, int]:
    """Each config input's position among the forward's arguments: by `<name>__<index>`, else by
    the argument's name, else by config order. Empty when the config lists no inputs."""
    positions = {}
    for order, tensor in enumerate(config.inputs):
        match = _INDEXED_NAME.match(tensor.name)
        if match:
            positions[tensor.name] = int(match.group(1))
        elif tensor.name in argument_names:
            positions[tensor.name] = argument_names.index(tensor.name)
        else:
            positions[tensor.name] = order
    if positions and (
        len(positions) != len(argument_names) or sorted(positions.values()) != list(range(len(positions)))
    ):
        raise ModelLoadError(
            f"{path}: config inputs {list(positions)} do not match the forward's arguments {argument_names} "
            "one to one (name them as the arguments, or <name>__<index> as Triton does)"
        )
    return positions


def _output_positions(config: ModelConfig) -> dict[str, int]:
    """Each config output's position in what the module returns: `<name>__<index>`, else config order."""
    return {
        t.name: int(match.group(1)) if (match := _INDEXED_NAME.match(t.name)) else order
        for order, t in enumerate(config.outputs)
    }


def _renamed(specs: tuple[TensorSpec, ...], positions: dict[str, int], path: Path, kind: str) -> tuple[TensorSpec, ...]:
    if not positions:
        return specs
    if any(position >= len(specs) for position in positions.values()):
        raise ModelLoadError(f"{path}: the config names {len(positions)} {kind}, the program has {len(specs)}")
    return tuple(
        TensorSpec(name, specs[position].datatype, specs[position].shape)
        for name, position in sorted(positions.items(), key=lambda item: item[1])
    )


def _config_signature(config: ModelConfig, path: Path) -> ModelSignature:
    if not config.inputs or not config.outputs:
        raise ModelLoadError(
            f"{path}: a TorchScript model declares its tensors in config.pbtxt (input and output, with "
            "data_type and dims), as Triton's PyTorch backend requires"
        )
    return signature_from_config(config)


def _exported_signature(program: Any) -> ModelSignature:
    """Names, datatypes and shapes (-1 where dynamic) as the exported program records them;
    outputs are named OUTPUT__<i>, Triton's convention."""
    user_inputs = set(program.graph_signature.user_inputs)
    inputs, outputs = [], []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            inputs.append(_spec(node.name, node.meta["val"]))
        elif node.op == "output":
            for index, value in enumerate(node.args[0]):
                outputs.append(_spec(f"OUTPUT__{index}", value.meta["val"]))
    return ModelSignature(inputs=tuple(inputs), outputs=tuple(outputs))


def _spec(name: str, value: Any) -> TensorSpec:
    datatype = _DATATYPES.get(value.dtype)
    if datatype is None:
        raise ModelLoadError(f"tensor '{name}' is {value.dtype}, which inferd cannot serve")
    return TensorSpec(name, datatype, tuple(d if isinstance(d, int) else -1 for d in value.shape))

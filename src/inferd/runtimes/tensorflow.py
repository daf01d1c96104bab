"""TensorFlow SavedModels: one loaded SavedModel per instance, serving one of its signatures.

A version folder holds the SavedModel in Triton's layout (`model.savedmodel/`, or the folder
`default_model_filename` names) or TF Serving's (`saved_model.pb` and `variables/` in the version
folder itself). The signature served is `serving_default` unless the `TF_SIGNATURE_DEF` parameter
names another, from the MetaGraph tagged `serve` unless `TF_GRAPH_TAG` names another (Triton's
TensorFlow backend reads the same two). Its inputs and outputs are the model's: names, datatypes
and shapes (an unknown dimension is -1) complete the config as an ONNX model's do.

TensorFlow is imported only here, when a SavedModel loads: a server of other models never imports
it. TensorFlow 2 has one pair of thread pools per process, fixed when its runtime starts: they are
sized once, before the first SavedModel loads, to the cores (intra-op) and 1 (inter-op: a
signature's ops in order, as ONNX Runtime's sessions run them here), so that models do not each
bring pools of their own.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from inferd.config.model import ModelConfig, ModelSignature, TensorSpec
from inferd.config.parameters import TF_GRAPH_TAG, TF_SIGNATURE_DEF
from inferd.datatypes import NAMES
from inferd.errors import InternalError, InvalidRequestError, ModelLoadError
from inferd.runtimes.base import RuntimeOptions, cores_available
from inferd.runtimes.tensorflow_layout import DEFAULT_SIGNATURE, DEFAULT_TAG, saved_model_folder
from inferd.types import DataType

logger = logging.getLogger("inferd.tensorflow")


# Not measured per model: the variables (about the files' size) and the graph's kernels.
MEMORY_PER_FILE_BYTE = 1.5
MEMORY_PER_MODEL_BYTES = 8 << 20


def estimate_memory_bytes(model_bytes: int) -> int:
    """What one instance of a SavedModel whose files hold `model_bytes` keeps resident."""
    return int(MEMORY_PER_FILE_BYTE * model_bytes) + MEMORY_PER_MODEL_BYTES


_pools_lock = threading.Lock()
_pools_sized = False


def _size_thread_pools() -> None:
    """TensorFlow's process-wide pools, sized once before its runtime starts (after, it refuses)."""
    global _pools_sized
    with _pools_lock:
        if _pools_sized:
            return
        try:
            tf.config.threading.set_intra_op_parallelism_threads(cores_available())
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError as exc:  # this process ran TensorFlow before inferd loaded a model
            logger.warning("TensorFlow's thread pools keep their sizes: %s", exc)
        _pools_sized = True


_DATATYPES_BY_TF_NUMBER = {names.tf_number: datatype for datatype, names in NAMES.items()}


def _datatype(dtype: Any, where: str) -> DataType:
    datatype = _DATATYPES_BY_TF_NUMBER.get(int(dtype.as_datatype_enum))
    if datatype is None:
        raise ModelLoadError(f"{where} is {dtype.name}, which inferd cannot serve")
    return datatype


def _spec(name: str, spec: Any, where: str) -> TensorSpec:
    if spec.shape.rank is None:
        raise ModelLoadError(f"{where} has an unknown rank: give the signature a shape")
    shape = tuple(-1 if size is None else int(size) for size in spec.shape.as_list())
    return TensorSpec(name, _datatype(spec.dtype, where), shape)


class SavedModelRuntime:
    # A signature's call flattens its arguments in Python before TensorFlow computes: on threads.
    may_run_inline = False

    def __init__(self, config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> None:
        self._name = config.name
        folder = saved_model_folder(version_dir, config.default_model_filename)
        tag = config.parameters.get(TF_GRAPH_TAG.name, DEFAULT_TAG)
        signature_name = config.parameters.get(TF_SIGNATURE_DEF.name, DEFAULT_SIGNATURE)
        _size_thread_pools()
        try:
            self._model = tf.saved_model.load(str(folder), tags=[tag])
        except Exception as exc:  # TensorFlow raises its own error types for a missing tag or a bad file
            raise ModelLoadError(f"TensorFlow cannot load the SavedModel in {folder}: {exc}") from exc
        signatures = self._model.signatures
        if signature_name not in signatures:
            raise ModelLoadError(
                f"the SavedModel in {folder} has no signature '{signature_name}' (it has: "
                f"{', '.join(sorted(signatures)) or 'none'}); name one with the {TF_SIGNATURE_DEF.name} parameter"
            )
        self._function = signatures[signature_name]
        positional, named = self._function.structured_input_signature
        if positional:
            raise ModelLoadError(f"signature '{signature_name}' takes positional arguments; serving needs names")
        outputs = self._function.structured_outputs
        if not isinstance(outputs, Mapping):
            raise ModelLoadError(f"signature '{signature_name}' returns {type(outputs).__name__}, not named outputs")
        self._signature = ModelSignature(
            inputs=tuple(_spec(n, s, f"input '{n}'") for n, s in sorted(named.items())),
            outputs=tuple(_spec(n, s, f"output '{n}'") for n, s in sorted(outputs.items())),
        )
        self._dtypes = {name: spec.dtype for name, spec in named.items()}

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        try:
            # BYTES arrays (objects holding bytes) become tf.string; bfloat16 arrays are ml_dtypes', as TensorFlow's.
            feeds = {name: tf.constant(array, dtype=self._dtypes[name]) for name, array in inputs.items()}
            returned = self._function(**feeds)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
            raise InvalidRequestError(f"the model rejected the inputs: {_message(exc)}") from exc
        except tf.errors.OpError as exc:
            raise InternalError(f"TensorFlow failed: {_message(exc)}") from exc
        results: dict[str, np.ndarray[Any, Any]] = {}
        for name in output_names:
            value = returned[name].numpy()
            results[name] = value if value.dtype != object else _as_bytes(value)
        return results

    def close(self) -> None:
        del self._function, self._model


# The lines of TensorFlow's messages that locate an error in its graph and in Python, not say it.
_TRAIL = re.compile(
    r"^(Graph execution error:|Detected at node |<stack traces unavailable>|\s*\[\[\{\{node |\s+File \")"
)


def _message(exc: Exception) -> str:
    """What TensorFlow says went wrong, without where in its graph and stack ("Matrix
    size-incompatible: In[0]: [2,5], In[1]: [4,3]")."""
    text = str(getattr(exc, "message", None) or exc)
    said = [line for line in text.splitlines() if line.strip() and not _TRAIL.match(line)]
    return re.sub(r"\s*\[Op:[^\]]*\]\s*$", "", said[-1] if said else text).strip()


def _as_bytes(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """tf.string outputs as inferd's BYTES: an object array of bytes (TensorFlow's already are)."""
    if all(isinstance(item, bytes) for item in array.reshape(-1)):
        return array
    flat = [item if isinstance(item, bytes) else str(item).encode("utf-8") for item in array.reshape(-1)]
    converted = np.empty(len(flat), dtype=object)
    converted[:] = flat
    return converted.reshape(array.shape)

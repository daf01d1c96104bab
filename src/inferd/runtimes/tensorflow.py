"""TensorFlow SavedModels: one loaded SavedModel per instance, serving one of its signatures.

A version folder holds the SavedModel in Triton's layout (`model.savedmodel/`, or the folder
`default_model_filename` names) or TF Serving's (`saved_model.pb` and `variables/` in the version
folder itself). The signature served is `serving_default` unless the `TF_SIGNATURE_DEF` parameter
names another, from the MetaGraph tagged `serve` unless `TF_GRAPH_TAG` names another (Triton's
TensorFlow backend reads the same two). Its inputs and outputs are the model's: names, datatypes
and shapes (an unknown dimension is -1) complete the config as an ONNX model's do.

TensorFlow is imported only here, when a SavedModel loads: a server of other models never imports
it. TensorFlow 2 has one pair of thread pools per process, fixed when its runtime starts: the
intra-op pool (one op's threads) is sized once, before the first SavedModel loads, to the cores,
so that models do not each bring pools of their own; the inter-op pool (ops, and calls, run side by
side) keeps TensorFlow's size, one per core, or instances of a model would wait for each other.

Placement follows the instance group: KIND_CPU runs on the CPU, KIND_GPU on a GPU TensorFlow sees
(a load error where it sees none, as for ONNX and PyTorch models), KIND_AUTO where TensorFlow
places it. GPUs, where there are, grow their memory as they need it rather than take it all.

The MIXED_PRECISION parameter ("bfloat16") has grappler rewrite the model's graph with oneDNN's
bfloat16 auto mixed precision. TensorFlow 2 offers that rewrite only for the whole process
(`tf.config.optimizer.set_experimental_options`); inferd instead gives this model's calls function
options of their own (the calling thread's, set around each call), so the other models of the
server keep computing in float32. TensorFlow instantiates a function once per set of options.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

# No public API sets function options for one model's calls (only the process's): the eager
# context's per-thread ones are what tf.function's calls read.
from tensorflow.python.eager import context as tf_context

from inferd.config.model import InstanceKind, ModelConfig, ModelSignature, TensorSpec
from inferd.config.parameters import MIXED_PRECISION, TF_GRAPH_TAG, TF_SIGNATURE_DEF
from inferd.datatypes import NAMES
from inferd.errors import InternalError, InvalidRequestError, ModelLoadError
from inferd.runtimes.base import RuntimeOptions, computes_in_bfloat16, cores_available, warn_if_bfloat16_is_slow
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
            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError as exc:  # this process ran TensorFlow before inferd loaded a model
            logger.warning("TensorFlow's thread pools and GPU memory keep their settings: %s", exc)
        _pools_sized = True


_collect_lock = threading.Lock()


def _collect_cycles() -> None:
    """Free what a closed SavedModel leaves in reference cycles (its functions and their graphs):
    only a full collection does, and a server freezes what its start-up made, models included
    (gc.freeze), so that is unfrozen for the collection and frozen again after. Measured: 6
    SavedModels loaded and closed 3 times under a freeze left 100 MiB more each time; with this,
    none."""
    with _collect_lock:
        frozen = gc.get_freeze_count() > 0
        if frozen:
            gc.unfreeze()
        gc.collect()
        if frozen:
            gc.freeze()


def _device(kind: InstanceKind, config: ModelConfig) -> str | None:
    """The tf.device an instance of `kind` runs on (None: where TensorFlow places it)."""
    if kind is InstanceKind.CPU:
        return "/CPU:0"
    if kind is InstanceKind.GPU:
        if not tf.config.list_physical_devices("GPU"):
            raise ModelLoadError(
                f"model '{config.name}': instance_group kind KIND_GPU asks for a GPU, but TensorFlow sees none "
                "(tensorflow-cpu has no GPU support); use KIND_CPU or KIND_AUTO"
            )
        return "/GPU:0"
    return None


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
        group = options.instance_group
        bfloat16 = computes_in_bfloat16(config)  # (checked before the SavedModel loads)
        device = _device(group.kind, config)
        if device == "/GPU:0" and group.gpus:
            device = f"/GPU:{group.gpus[0]}"
        if bfloat16:
            device = _bfloat16_device(config, device)
        self._placement = tf.device(device) if device is not None else contextlib.nullcontext()
        try:
            with self._placement:
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
        self._call_options = _bfloat16_call_options() if bfloat16 else None

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        try:
            # BYTES arrays (objects holding bytes) become tf.string; bfloat16 arrays are ml_dtypes', as TensorFlow's.
            with self._placement, self._options():
                feeds = {name: tf.constant(array, dtype=self._dtypes[name]) for name, array in inputs.items()}
                returned = self._function(**feeds)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
            raise InvalidRequestError(f"the model rejected the inputs: {_message(exc)}") from exc
        except tf.errors.OpError as exc:
            raise InternalError(f"TensorFlow failed: {_message(exc)}") from exc
        results: dict[str, np.ndarray[Any, Any]] = {}
        for name in output_names:
            tensor = returned[name]
            if tensor.dtype == tf.string:  # bytes already; a 0-d one's .numpy() is bytes, not an array
                results[name] = np.asarray(tensor.numpy(), dtype=object)
            else:
                results[name] = np.asarray(tensor.numpy())  # a 0-d one's is a numpy scalar
        return results

    @contextlib.contextmanager
    def _options(self) -> Iterator[None]:
        """This model's function options on the calling thread for the call (then the thread's own)."""
        if self._call_options is None:
            yield
            return
        eager = tf_context.context()
        previous = eager.function_call_options
        eager.function_call_options = self._call_options
        try:
            yield
        finally:
            eager.function_call_options = previous

    def close(self) -> None:
        del self._function, self._model
        _collect_cycles()


def _bfloat16_device(config: ModelConfig, device: str | None) -> str:
    """Where a model computing in bfloat16 runs: the CPU (oneDNN's rewrite changes only the nodes
    placed there, so KIND_AUTO is the CPU too, and KIND_GPU a load error)."""
    if device is not None and device.startswith("/GPU"):
        raise ModelLoadError(
            f"model '{config.name}': {MIXED_PRECISION.name} bfloat16 is oneDNN's rewrite, for the CPU; "
            "use instance_group KIND_CPU"
        )
    warn_if_bfloat16_is_slow(config, logger)
    return "/CPU:0"


def _bfloat16_call_options() -> Any:
    """Function options whose grappler config turns on oneDNN's bfloat16 auto mixed precision."""
    from tensorflow.core.protobuf import rewriter_config_pb2

    eager = tf_context.context()
    proto = eager.config  # a copy: the process's settings (pools, placement) with the rewrite added
    proto.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = rewriter_config_pb2.RewriterConfig.ON
    return tf_context.FunctionCallOptions(config_proto=proto)


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

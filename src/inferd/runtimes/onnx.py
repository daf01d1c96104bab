"""ONNX Runtime: one InferenceSession per instance, placed by the instance group's kind.

Provider choice is a pure function of the asked kind, the providers this onnxruntime build has and
the GPUs the machine has, so the GPU path is testable on a machine without one.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from inferd.config.model import InstanceKind, ModelConfig, ModelSignature, TensorSpec
from inferd.config.parameters import (
    ALLOW_SPINNING,
    CUDNN_CONV_ALGO_SEARCH,
    ENABLE_TENSORRT,
    INTER_OP_THREAD_COUNT,
    INTRA_OP_THREAD_COUNT,
)
from inferd.datatypes import NAMES
from inferd.errors import ModelLoadError
from inferd.runtimes.base import RuntimeOptions, cores_available, release_freed_memory
from inferd.runtimes.onnx_cache import GRAPH_FILE, MIN_EXTERNAL_INITIALIZER_BYTES, WEIGHTS_FILE, OptimizedModelCache
from inferd.runtimes.onnx_errors import execution_error, without_source_locations
from inferd.runtimes.onnx_strings import bytes_from_ort, str_for_ort
from inferd.types import DataType

logger = logging.getLogger("inferd.onnx")

DEFAULT_MODEL_FILENAME = "model.onnx"
CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"

_DATATYPES_BY_ORT_TYPE = {names.onnx: datatype for datatype, names in NAMES.items()}

ProviderEntry = str | tuple[str, dict[str, Any]]


def select_providers(
    kind: InstanceKind,
    *,
    available: Sequence[str],
    gpu_count: int,
    gpus: Sequence[int] = (),
    use_tensorrt: bool = False,
    cuda_options: Mapping[str, str] | None = None,
) -> list[ProviderEntry]:
    """The execution providers for an instance of `kind`, best first, CPU last as the fallback.

    KIND_GPU without a usable GPU is an error (as in Triton); KIND_AUTO and KIND_MODEL fall back to CPU.
    """
    gpu_usable = gpu_count > 0 and CUDA_PROVIDER in available
    if kind is InstanceKind.CPU or (kind in (InstanceKind.AUTO, InstanceKind.MODEL) and not gpu_usable):
        return [CPU_PROVIDER]
    if not gpu_usable:
        reason = "no GPU was found" if gpu_count == 0 else f"this onnxruntime build lacks {CUDA_PROVIDER}"
        raise ModelLoadError(
            f"instance_group kind KIND_GPU asks for a GPU, but {reason} "
            f"(available providers: {', '.join(available) or 'none'}); use KIND_CPU or KIND_AUTO"
        )
    device_id = gpus[0] if gpus else 0
    if device_id >= gpu_count:
        raise ModelLoadError(f"instance_group asks for GPU {device_id}, but this machine has {gpu_count}")
    providers: list[ProviderEntry] = []
    if use_tensorrt and TENSORRT_PROVIDER in available:
        providers.append((TENSORRT_PROVIDER, {"device_id": device_id}))
    providers.append((CUDA_PROVIDER, {"device_id": device_id, **(cuda_options or {})}))
    providers.append(CPU_PROVIDER)
    return providers


# Triton's values of cudnn_conv_algo_search (its onnxruntime backend's) and ONNX Runtime's names.
_CONV_ALGO_SEARCHES = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}


def cuda_options_of(parameters: Mapping[str, str]) -> dict[str, str]:
    """CUDA provider options a model's config asks for: `cudnn_conv_algo_search` as Triton takes
    it (0, 1, 2) or by ONNX Runtime's name."""
    asked = parameters.get(CUDNN_CONV_ALGO_SEARCH.name)
    if asked is None:
        return {}
    value = _CONV_ALGO_SEARCHES.get(asked.strip(), asked.strip().upper())
    if value not in _CONV_ALGO_SEARCHES.values():
        raise ModelLoadError(
            f"parameter {CUDNN_CONV_ALGO_SEARCH.name} is {asked!r}: use 0 (EXHAUSTIVE), 1 (HEURISTIC) or 2 (DEFAULT)"
        )
    return {"cudnn_conv_algo_search": value}


def _provider_name(entry: ProviderEntry) -> str:
    return entry if isinstance(entry, str) else entry[0]


def check_started_providers(kind: InstanceKind, asked: Sequence[ProviderEntry], started: Sequence[str]) -> str | None:
    """Judge the providers a session started with against those it asked for.

    onnxruntime's Python API does not fail when a GPU provider cannot start (its CUDA or cuDNN
    libraries missing, TensorRT's absent): it prints an error and retries with the next providers,
    down to CPU, and the session serves there. KIND_GPU on CPU is the error Triton makes it;
    otherwise the fall is said (returned, for the caller's log) rather than left to be found
    in the latency.
    """
    asked_names = [_provider_name(entry) for entry in asked]
    lost = [name for name in asked_names if name != CPU_PROVIDER and name not in started]
    if not lost:
        return None
    on_gpu = any(name in started for name in (CUDA_PROVIDER, TENSORRT_PROVIDER))
    if kind is InstanceKind.GPU and not on_gpu:
        raise ModelLoadError(
            f"instance_group kind KIND_GPU asks for a GPU, but onnxruntime could not start "
            f"{', '.join(lost)} (the CUDA and cuDNN libraries its build needs were not found or do not "
            f"fit this GPU; onnxruntime's log says which), and the session would run on "
            f"{', '.join(started) or 'nothing'}"
        )
    return (
        f"onnxruntime could not start {', '.join(lost)} (onnxruntime's log says why); "
        f"this instance runs on {', '.join(started)}"
    )


_dlls_preloaded = False


def _preload_gpu_libraries() -> None:
    """Let a pip-installed onnxruntime-gpu find CUDA and cuDNN from the nvidia-* wheels (its
    [cuda,cudnn] extras), as onnxruntime's docs ask; without this its CUDA provider finds them only
    on LD_LIBRARY_PATH or after `import torch`. Once a process; a CPU build returns at once."""
    global _dlls_preloaded
    preload = getattr(ort, "preload_dlls", None)
    if _dlls_preloaded or preload is None:
        return
    _dlls_preloaded = True
    try:
        preload(msvc=False)
    except OSError as exc:  # a library it found but could not load: the session will say more
        logger.warning("onnxruntime.preload_dlls: %s", exc)


def detect_gpu_count() -> int:
    """NVIDIA device nodes present; 0 on a CPU-only machine."""
    dev = Path("/dev")
    return sum(1 for p in dev.glob("nvidia[0-9]*") if p.name[len("nvidia") :].isdigit())


# A loaded session's memory, measured as RSS over 10 sessions each of MLPs from 6 KB to 34 MB
# (benchmarks note, stop 9): 1.42-1.73x the model file above 0.5 MB (constant folding and
# pre-packed weights copy some of it), and about 1 MiB for the smallest.
MEMORY_PER_FILE_BYTE = 1.6
MEMORY_PER_SESSION_BYTES = 1 << 20


def estimate_memory_bytes(model_bytes: int) -> int:
    """What one instance (session) of a model whose files hold `model_bytes` keeps resident."""
    return int(MEMORY_PER_FILE_BYTE * model_bytes) + MEMORY_PER_SESSION_BYTES


_shared_pool_lock = threading.Lock()
_shared_pool_made = False
_OWN_POOL_PARAMETERS = (INTRA_OP_THREAD_COUNT, INTER_OP_THREAD_COUNT, ALLOW_SPINNING)


def _use_shared_pool(options: ort.SessionOptions) -> None:
    """Compute on ONNX Runtime's process-wide intra-op pool, sized to the cores. It must exist
    before the first session creates ORT's environment, and then every session must use it."""
    global _shared_pool_made
    with _shared_pool_lock:
        if not _shared_pool_made:
            ort.set_global_thread_pool_sizes(cores_available(), 1)
            _shared_pool_made = True
    options.use_per_session_threads = False


def _warn_of_own_pool_parameters(config: ModelConfig) -> None:
    ignored = [parameter.name for parameter in _OWN_POOL_PARAMETERS if parameter.name in config.parameters]
    if ignored:
        logger.warning(
            "model %s: parameters %s apply to a pool of its own, and sessions share one; "
            "start the server with --intra-op-pools per-instance to apply them",
            config.name,
            ", ".join(ignored),
            extra={"model": config.name},
        )


def _use_own_pool(config: ModelConfig, options: ort.SessionOptions, threads: int) -> None:
    if _shared_pool_made:  # not in a server, where one setting holds for every model
        raise ModelLoadError("this process shares one intra-op pool already; a session cannot have its own")
    options.intra_op_num_threads = _int_parameter(config, INTRA_OP_THREAD_COUNT.name, threads)
    options.inter_op_num_threads = _int_parameter(config, INTER_OP_THREAD_COUNT.name, 1)
    # Spinning intra-op threads burn the cores the event loop needs to parse requests; they
    # wait on the OS instead unless the model's parameters ask otherwise.
    spinning = config.parameters.get(ALLOW_SPINNING.name, "false").lower() == "true"
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")


@dataclass(slots=True)
class ArenaShrink:
    """When a CPU session gives its memory arena back to the system.

    ONNX Runtime's arena keeps what the largest execution needed: MiniLM at batch 32 grows it by
    ~180 MiB, kept after a burst for good (an overload left the server 216 MiB larger). Shrinking
    after every execution cost 4% at batch 1 and 13% at batch 32, and no arena cost as much, so an
    execution shrinks it only when its inputs are a quarter of the largest since the last shrink or
    less, at most once every `interval_s`: sustained large batches keep their arena; the first small
    execution after a burst frees what the burst grew."""

    interval_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _largest: int = 0
    _last_shrink: float = -math.inf

    def after(self, size: int) -> bool:
        """Whether the execution of inputs of `size` bytes about to run should shrink the arena."""
        if size * 4 > self._largest:  # every execution asks: most end here, without the clock
            if size > self._largest:
                self._largest = size
            return False
        now = self.clock()
        if now - self._last_shrink < self.interval_s:
            return False
        self._last_shrink, self._largest = now, size
        return True


class OnnxRuntime:
    # Sessions only compute (and release the GIL meanwhile): a fast one may run on the loop.
    may_run_inline = True

    def __init__(self, config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> None:
        self._name = config.name
        path = version_dir / (config.default_model_filename or DEFAULT_MODEL_FILENAME)
        if not path.is_file():
            raise ModelLoadError(f"model file {path} not found")
        providers = select_providers(
            options.instance_group.kind,
            available=ort.get_available_providers(),
            gpu_count=detect_gpu_count(),
            gpus=options.instance_group.gpus,
            use_tensorrt=config.parameters.get(ENABLE_TENSORRT.name, "").lower() == "true",
            cuda_options=cuda_options_of(config.parameters),
        )
        if providers != [CPU_PROVIDER]:
            _preload_gpu_libraries()
        if options.intra_op_threads is None:
            _warn_of_own_pool_parameters(config)

        def session_options() -> ort.SessionOptions:
            made = ort.SessionOptions()
            if options.intra_op_threads is None:
                _use_shared_pool(made)
            else:
                _use_own_pool(config, made, options.intra_op_threads)
            made.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            made.log_severity_level = 3
            return made

        # Only CPU sessions are cached: a GPU provider's graph is the provider's own (TensorRT
        # keeps its engines by its own cache options).
        cache = options.onnx_cache if providers == [CPU_PROVIDER] else None
        try:
            if cache is None:
                self._session = ort.InferenceSession(str(path), sess_options=session_options(), providers=providers)
            else:
                self._session = _cached_session(config.name, path, session_options, cache)
        except ModelLoadError:  # the options' own (a thread pool this process cannot give)
            raise
        except Exception as exc:  # ORT raises its own pybind exception types for corrupt files
            raise ModelLoadError(
                f"onnxruntime cannot load {path}: {without_source_locations(str(exc))}",
                server_message=f"onnxruntime cannot load {path}: {exc}",
            ) from exc
        try:
            fell_back = check_started_providers(
                options.instance_group.kind, asked=providers, started=self._session.get_providers()
            )
        except ModelLoadError:
            del self._session  # its memory now, not when the error's frames go
            raise
        if fell_back is not None:
            logger.warning("model %s: %s", self._name, fell_back)
        self._signature = ModelSignature(
            inputs=tuple(_spec(arg) for arg in self._session.get_inputs()),
            outputs=tuple(_spec(arg) for arg in self._session.get_outputs()),
        )
        self._string_inputs = {s.name for s in self._signature.inputs if s.datatype is DataType.BYTES}
        # CPU sessions only: other providers' arenas are their own.
        self._arena = ArenaShrink() if self._session.get_providers()[0] == CPU_PROVIDER else None
        self._shrink_options = ort.RunOptions()
        self._shrink_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self._string_outputs = {s.name for s in self._signature.outputs if s.datatype is DataType.BYTES}
        # ONNX Runtime's Python API takes and gives no bfloat16 array: such tensors go as OrtValues.
        self._bf16_inputs = {s.name for s in self._signature.inputs if s.datatype is DataType.BF16}
        bf16_outputs = any(s.datatype is DataType.BF16 for s in self._signature.outputs)
        if bf16_outputs and self._string_inputs:  # OrtValues hold no strings, and bfloat16 comes back as one
            del self._session
            raise ModelLoadError(
                f"model '{self._name}' takes strings ({', '.join(sorted(self._string_inputs))}) and answers "
                "bfloat16: ONNX Runtime's Python API cannot run both in one call"
            )
        self._run = (
            self._run_ort_values if bf16_outputs else self._run_bf16_inputs if self._bf16_inputs else self._session.run
        )

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        feeds = {
            name: _to_ort_strings(array) if name in self._string_inputs else array for name, array in inputs.items()
        }
        shrink = False
        if self._arena is not None:
            size = 0
            for array in inputs.values():  # a loop, not sum() of a generator: a batch of one pays for this
                size += array.nbytes
            shrink = self._arena.after(size)
        try:
            results = self._run(list(output_names), feeds, self._shrink_options if shrink else None)
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ValueError) as exc:
            raise execution_error(self._name, exc, inputs, invalid_argument=True) from exc
        except Exception as exc:
            raise execution_error(self._name, exc, inputs, invalid_argument=False) from exc
        if shrink:  # the arena freed its chunks; the C heap keeps their pages unless trimmed
            release_freed_memory()
        return {
            name: _from_ort_strings(array) if name in self._string_outputs else array
            for name, array in zip(output_names, results, strict=True)
        }

    def _run_bf16_inputs(
        self, output_names: list[str], feeds: dict[str, Any], options: ort.RunOptions | None
    ) -> list[np.ndarray[Any, Any]]:
        """bfloat16 inputs as OrtValues, the rest (strings too) as they are; no bfloat16 answer."""
        mixed = {name: _ort_value(array) if name in self._bf16_inputs else array for name, array in feeds.items()}
        results: list[np.ndarray[Any, Any]] = self._session.run(output_names, mixed, options)
        return results

    def _run_ort_values(
        self, output_names: list[str], feeds: dict[str, Any], options: ort.RunOptions | None
    ) -> list[np.ndarray[Any, Any]]:
        values = {name: _ort_value(array) for name, array in feeds.items()}  # views of `feeds`, kept alive here
        return [_array_of(value) for value in self._session.run_with_ort_values(output_names, values, options)]

    def close(self) -> None:
        del self._session, self._run


_BFLOAT16 = DataType.BF16.numpy_dtype
_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16


def _ort_value(array: np.ndarray[Any, Any]) -> ort.OrtValue:
    array = np.require(array, requirements="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    if array.dtype == _BFLOAT16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), _ONNX_BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _array_of(value: ort.OrtValue) -> np.ndarray[Any, Any]:
    if value.data_type() != "tensor(bfloat16)":
        array: np.ndarray[Any, Any] = value.numpy()
        return array
    copied = np.empty(value.shape(), dtype=_BFLOAT16)  # its bytes copied from ONNX Runtime's buffer
    ctypes.memmove(copied.ctypes.data, value.data_ptr(), copied.nbytes)
    return copied


def optimized_engine(options: ort.SessionOptions) -> str:
    """What shapes an optimized graph besides the model: ONNX Runtime's version and build, and the
    optimization level (ONNX Runtime's default, all)."""
    return f"onnxruntime {ort.__version__} {ort.get_device()} {options.graph_optimization_level.name}"


def _cached_session(
    name: str, path: Path, session_options: Callable[[], ort.SessionOptions], cache: OptimizedModelCache
) -> ort.InferenceSession:
    """A CPU session of the model at `path` from the optimized-model cache (see runtimes.onnx_cache):
    from its entry when written, else from the model's own file, writing the entry on the way."""
    plain = session_options()  # first: options that cannot be given fail before anything is written
    try:
        entry = cache.entry_for(path, optimized_engine(plain))
    except OSError as exc:  # an unreadable file: the plain load says what is wrong with it
        logger.warning("model %s: optimized-model cache not used: %s", name, exc, extra={"model": name})
        entry = None
    if entry is None:
        return ort.InferenceSession(str(path), sess_options=plain, providers=[CPU_PROVIDER])
    if entry.is_written():
        cache.used(entry)  # first: a commit beside this load must not evict what it opens
        cached = session_options()
        cached.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # it was optimized
        try:
            opened = entry.graph.stat()
            session = ort.InferenceSession(str(entry.graph), sess_options=cached, providers=[CPU_PROVIDER])
        except Exception as exc:  # evicted meanwhile, or damaged: the model's own file still serves
            logger.warning(
                "model %s: optimized-model cache entry %s not loaded (%s); loading %s",
                name,
                entry.folder,
                without_source_locations(str(exc)),
                path,
                extra={"model": name},
            )
            if not isinstance(exc, OSError):
                cache.discard_if_same(entry, opened)
        else:
            logger.debug("model %s: session from the optimized-model cache %s", name, entry.folder)
            return session
    writing = session_options()
    try:
        written = cache.writing_folder()
    except OSError as exc:  # the folder removed or full: the model still loads, uncached
        logger.warning("model %s: optimized model not cached (%s)", name, exc, extra={"model": name})
        return ort.InferenceSession(str(path), sess_options=plain, providers=[CPU_PROVIDER])
    writing.optimized_model_filepath = str(written / GRAPH_FILE)
    writing.add_session_config_entry("session.optimized_model_external_initializers_file_name", WEIGHTS_FILE)
    writing.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", str(MIN_EXTERNAL_INITIALIZER_BYTES)
    )
    try:
        session = ort.InferenceSession(str(path), sess_options=writing, providers=[CPU_PROVIDER])
    except Exception as exc:
        cache.abandon(written)
        # A full disk fails the write; a bad model fails again here, and says why.
        session = ort.InferenceSession(str(path), sess_options=plain, providers=[CPU_PROVIDER])
        logger.warning(
            "model %s: optimized model not cached (%s)", name, without_source_locations(str(exc)), extra={"model": name}
        )
        return session
    if cache.commit(written, entry):
        logger.info("model %s: optimized model cached in %s", name, entry.folder, extra={"model": name})
    else:
        logger.info(
            "model %s: optimized model not cached (its files changed while it loaded, the entry was written "
            "beside this load, or it is larger than the cache)",
            name,
            extra={"model": name},
        )
    return session


def _int_parameter(config: ModelConfig, key: str, default: int) -> int:
    raw = config.parameters.get(key)
    if raw is None or raw == "":
        return default
    try:
        return max(0, int(raw))
    except ValueError:
        raise ModelLoadError(f"parameter {key} must be an integer, got '{raw}'") from None


def _spec(arg: Any) -> TensorSpec:
    datatype = _DATATYPES_BY_ORT_TYPE.get(arg.type)
    if datatype is None:
        raise ModelLoadError(f"tensor '{arg.name}' has type {arg.type}, which inferd cannot serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
    return TensorSpec(name=arg.name, datatype=datatype, shape=shape)


def _to_ort_strings(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    # ORT string tensors take Python str; BYTES elements arrive as bytes (see onnx_strings).
    flat = [str_for_ort(item) if isinstance(item, bytes) else str(item) for item in array.reshape(-1)]
    return np.array(flat, dtype=object).reshape(array.shape)


def _from_ort_strings(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    flat = [bytes_from_ort(item) if isinstance(item, str) else bytes(item) for item in array.reshape(-1)]
    return np.array(flat, dtype=object).reshape(array.shape)

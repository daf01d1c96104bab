"""The runtime contract: what core needs from an execution engine (ONNX Runtime, PyTorch, Python).

A runtime is one loaded session of one model version. `execute` runs one batch that core has
already merged and validated; core splits the outputs back per request, so a runtime never knows
how many requests a batch came from. `execute` is called from a worker thread, or from the event loop when
`may_run_inline` and the model is fast, one call at a time per runtime instance (core owns one
instance per `instance_group` slot).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from inferd.config.model import InstanceGroup, ModelConfig, ModelSignature, TensorConfig, TensorSpec
from inferd.config.parameters import MIXED_PRECISION
from inferd.errors import ModelConfigError

if TYPE_CHECKING:
    from inferd.runtimes.onnx_cache import OptimizedModelCache


def release_freed_memory() -> None:
    """Give the pages that freed allocations left in the C heap back to the system (glibc's
    `malloc_trim`; nothing elsewhere). glibc keeps them: a MiniLM session deleted left 60-90 MiB
    resident of the 150 it held, and an arena shrink 20-30 MiB of what it freed; trimmed, the
    process returns to the same size each time (2-6 ms a call). Called after a version is closed
    and after an arena shrink, never per request."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


# glibc's mallopt parameter for the size from which a block gets a mapping of its own.
_M_MMAP_THRESHOLD = -3
LARGE_BLOCK_BYTES = 128 << 10


def keep_large_blocks_off_the_heap() -> None:
    """Give every block of 128 KiB or more a mapping of its own, returned to the system when freed
    (glibc's `mallopt(M_MMAP_THRESHOLD)`; nothing elsewhere, or when the user set the threshold in
    the environment). glibc's default starts there but raises the threshold to the size of each
    mapped block freed, after which MiniLM's answers (540 KB of JSON), its outputs and request
    bodies come from the heap and leave it fragmented: under the soak's mixed load and hot swaps,
    RSS rose 3% in 10 minutes and 9% in 25 (benchmarks/soak.py); with the threshold fixed, -0.6%
    in 10. Called once, before the server's threads start."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc.mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)


@functools.cache
def _libc_function(name: str) -> Any:
    library_name = ctypes.util.find_library("c")
    library = ctypes.CDLL(library_name) if library_name else None
    return getattr(library, name, None)


def cores_available() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.cache
def cpu_description() -> tuple[str, tuple[str, ...]]:
    """What names this CPU's instruction set, as Linux's /proc/cpuinfo says: ("flags", its flags,
    sorted) on x86 and arm64 (`Features`), else ("model", its model lines, sorted and distinct:
    ppc64le's, never its clock, which moves); ("", ()) where the file cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            return describe_cpu(cpuinfo.read())
    except OSError:
        return "", ()


def describe_cpu(cpuinfo: str) -> tuple[str, tuple[str, ...]]:
    """`cpu_description` of a /proc/cpuinfo's text."""
    fields = [(name.strip().lower(), value.strip()) for name, value in (
        line.split(":", 1) for line in cpuinfo.splitlines() if ":" in line
    )]  # fmt: skip
    flags = next((value for name, value in fields if name in ("flags", "features")), None)
    if flags is not None:
        return "flags", tuple(sorted(flags.split()))
    return "model", tuple(sorted({value for name, value in fields if name in ("cpu", "model name")}))


def cpu_computes_bfloat16() -> bool:
    """Whether the CPU has bfloat16 arithmetic (x86's AVX512-BF16 or AMX, arm64's BF16): without
    it, bfloat16 kernels convert to float32 and back, slower than float32 alone."""
    kind, flags = cpu_description()
    return kind == "flags" and bool(set(flags) & {"avx512_bf16", "amx_bf16", "bf16"})


def warn_if_bfloat16_is_slow(config: ModelConfig, logger: logging.Logger) -> None:
    """A model computing in bfloat16 on the CPU, which has no bfloat16 arithmetic: say it costs."""
    if not cpu_computes_bfloat16():
        logger.warning(
            "model %s: %s bfloat16 on a CPU without bfloat16 arithmetic (AVX512-BF16, AMX) is slower than float32",
            config.name, MIXED_PRECISION.name, extra={"model": config.name},
        )  # fmt: skip


def computes_in_bfloat16(config: ModelConfig) -> bool:
    """Whether the config asks its model to compute in bfloat16 (the MIXED_PRECISION parameter)."""
    value = config.parameters.get(MIXED_PRECISION.name)
    if value is None:
        return False
    if value != "bfloat16":
        raise ModelConfigError(
            f"model '{config.name}': parameter {MIXED_PRECISION.name} is {value!r}; the one it takes is \"bfloat16\""
        )
    return True


def positive_parameter(config: ModelConfig, name: str) -> int | None:
    """A config parameter that must be a positive integer (None when absent)."""
    value = config.parameters.get(name)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise ModelConfigError(f"model '{config.name}': parameter {name} must be a positive integer, got {value!r}")
    return int(value)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any (a runtime must not wait for itself on it)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def signature_from_config(config: ModelConfig) -> ModelSignature:
    """The signature config.pbtxt declares, as a model file would: full shapes as the runtime sees
    them (`reshape` where given), -1 first for the batch when the model batches. For runtimes whose
    files do not record their tensors (TorchScript, Python models without declarations)."""
    batch = (-1,) if config.max_batch_size > 0 else ()

    def spec(tensor: TensorConfig) -> TensorSpec:
        dims = tensor.reshape if tensor.reshape is not None else tensor.dims
        return TensorSpec(tensor.name, tensor.datatype, (*batch, *dims))

    return ModelSignature(inputs=tuple(map(spec, config.inputs)), outputs=tuple(map(spec, config.outputs)))


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """How core asks a runtime to be placed."""

    instance_group: InstanceGroup
    intra_op_threads: int | None
    """Threads of the instance's own pool for one execution (instances x threads fit the cores);
    None: compute on the pool the server's single-instance models share."""
    event_loop: asyncio.AbstractEventLoop | None = None
    """The server's event loop, where a runtime's coroutines run (async Python models); None
    outside a server, where each execution runs its coroutine to the end on a loop of its own."""
    onnx_cache: OptimizedModelCache | None = None
    """Where ONNX sessions keep their optimized models between loads (runtimes.onnx_cache); None: off."""


class Runtime(Protocol):
    @property
    def signature(self) -> ModelSignature: ...

    @property
    def may_run_inline(self) -> bool:
        """Whether an execution only computes, so that a fast one may run on the event loop. False
        for a runtime whose code may block (I/O, sleeps) or hold the GIL for long (Python models):
        the loop must never run those, however fast they once were."""
        ...

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch. Raises InvalidRequestError when the engine rejects the inputs themselves.
        `deadline_s`: the batch's earliest deadline (time.monotonic()), None when none has one: for
        runtimes that pass the work on (remote); the others ignore it."""
        ...

    def close(self) -> None: ...


class RuntimeFactory(Protocol):
    def __call__(self, config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> Runtime: ...

"""Warm-up: run a model version's `model_warmup` samples on every instance before it is ready,
so the first real requests do not pay for lazy allocations and graph preparation."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig, WarmupDataKind, WarmupInput, WarmupSample
from inferd.core.executor import InstancePool
from inferd.errors import InferdError, ModelLoadError
from inferd.types import DataType, element_count

logger = logging.getLogger("inferd.warmup")

WARMUP_FOLDER = "warmup"


def run_warmup(config: ModelConfig, pool: InstancePool, model_dir: Path) -> None:
    """Blocking; raises ModelLoadError naming the sample that failed."""
    names = [t.name for t in config.outputs]
    for sample in config.warmup:
        started = time.perf_counter()
        try:
            feeds = {name: _array(config, sample, name, item, model_dir) for name, item in sample.inputs.items()}
            for _ in range(sample.count):
                pool.run_blocking(feeds, names)
        except InferdError as exc:
            raise ModelLoadError(f"model_warmup '{sample.name}' failed: {exc.message}") from exc
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"model_warmup '{sample.name}' failed: {exc}") from exc
        logger.info(
            "model %s: warm-up '%s' ran %d time(s) on %d instance(s) in %.1f ms",
            config.name,
            sample.name,
            sample.count,
            pool.size,
            (time.perf_counter() - started) * 1000,
            extra={"model": config.name},
        )


def probe_inputs(config: ModelConfig) -> dict[str, Any]:
    """Zeros of one row (any-size dims taken as 1) for every required input: enough to time the
    model once it is loaded."""
    feeds = {}
    for tensor in config.inputs:
        if tensor.optional:
            continue
        dims = tuple(1 if d < 0 else d for d in (tensor.reshape if tensor.reshape is not None else tensor.dims))
        shape = ((1,) if config.max_batch_size > 0 else ()) + dims
        if tensor.datatype is DataType.BYTES:
            feeds[tensor.name] = np.full(shape, b"", dtype=object)
        else:
            feeds[tensor.name] = np.zeros(shape, dtype=tensor.datatype.numpy_dtype)
    return feeds


def _array(config: ModelConfig, sample: WarmupSample, name: str, item: WarmupInput, model_dir: Path) -> Any:
    if config.input(name) is None:
        raise ValueError(f"input '{name}' is not an input of the model")
    shape = ((sample.batch_size,) if config.max_batch_size > 0 else ()) + item.dims
    count = element_count(shape)
    if item.kind is WarmupDataKind.ZERO:
        if item.datatype is DataType.BYTES:
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=item.datatype.numpy_dtype)
    if item.kind is WarmupDataKind.RANDOM:
        return _random(item.datatype, shape)
    raw = (model_dir / WARMUP_FOLDER / item.file_name).read_bytes()
    if item.datatype is DataType.BYTES:
        return np.full(shape, raw, dtype=object)
    needed = count * item.datatype.itemsize
    if len(raw) < needed:
        raise ValueError(f"input '{name}': {item.file_name} has {len(raw)} bytes, shape {list(shape)} needs {needed}")
    return np.frombuffer(raw[:needed], dtype=item.datatype.numpy_dtype).reshape(shape)


def _random(datatype: DataType, shape: tuple[int, ...]) -> Any:
    rng = np.random.default_rng(0)
    if datatype is DataType.BYTES:
        return np.full(shape, b"warmup", dtype=object)
    if datatype is DataType.BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    dtype = datatype.numpy_dtype
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    # Small non-negative integers: valid as ids, indices and counts in most models.
    return rng.integers(0, 8, size=shape).astype(dtype)

"""What the tools send (`inferd perf`, `inferd validate`): one request's tensors per sample, built
from the model's metadata and config, as perf_analyzer builds them: zeros, random values, or
samples from a file (perf_analyzer's JSON input-data format, JSON lines of `{input: values}`, or
an .npz of arrays whose first axis is the sample)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd.types import DataType, ModelMetadata, TensorMetadata

Sample = dict[str, np.ndarray[Any, Any]]
# perf_analyzer's default length of a random BYTES element.
STRING_LENGTH = 128


class InputError(ValueError):
    """The inputs cannot be built as asked: the message says which input and why."""


def request_shapes(
    metadata: ModelMetadata, max_batch_size: int, batch_size: int, shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """Each input's full shape for one request: `batch_size` rows when the model batches, the
    other dimensions from the metadata, variable ones from `shapes` (as perf_analyzer's --shape,
    without the batch dimension)."""
    if batch_size < 1:
        raise InputError(f"batch size {batch_size} must be at least 1")
    if max_batch_size == 0 and batch_size != 1:
        raise InputError(f"model '{metadata.name}' does not batch (max_batch_size 0): the batch size must be 1")
    if max_batch_size and batch_size > max_batch_size:
        raise InputError(f"batch size {batch_size} is over model '{metadata.name}''s max_batch_size {max_batch_size}")
    unknown = set(shapes) - {t.name for t in metadata.inputs}
    if unknown:
        raise InputError(f"--shape names {sorted(unknown)}, but the inputs are {[t.name for t in metadata.inputs]}")
    result = {}
    for tensor in metadata.inputs:
        dims = tensor.shape[1:] if max_batch_size else tensor.shape
        given = shapes.get(tensor.name)
        if given is not None:
            if len(given) != len(dims) or any(d not in (-1, g) for d, g in zip(dims, given, strict=True)):
                raise InputError(f"--shape {tensor.name}:{_dims(given)} does not fit its shape {list(dims)}")
            dims = tuple(given)
        elif any(d < 0 for d in dims):
            raise InputError(
                f"input '{tensor.name}' has a variable dimension ({list(dims)}): give one with "
                f"--shape {tensor.name}:{_dims(tuple(d if d >= 0 else 16 for d in dims))}"
            )
        result[tensor.name] = ((batch_size,) if max_batch_size else ()) + tuple(dims)
    return result


def synthetic_samples(
    metadata: ModelMetadata, shapes: Mapping[str, tuple[int, ...]], kind: str, count: int = 16, seed: int = 0
) -> list[Sample]:
    """`count` samples of zeros (one is enough) or of random values in each datatype's range."""
    if kind not in ("zero", "random"):
        raise InputError(f"input data {kind!r} must be zero, random, or a file (.json or .npz)")
    generator = np.random.default_rng(seed)
    return [
        {t.name: _synthetic(t, shapes[t.name], kind, generator) for t in metadata.inputs}
        for _ in range(1 if kind == "zero" else count)
    ]


def file_samples(path: Path, metadata: ModelMetadata, shapes: Mapping[str, tuple[int, ...]]) -> list[Sample]:
    """Samples from perf_analyzer's JSON (`{"data": [{"INPUT0": [...] | {"content": [...], "shape":
    [...]} | {"b64": "..."}}, ...]}`) or an .npz; each sample is checked against its input."""
    if not path.is_file():
        raise InputError(f"input data file '{path}' does not exist")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        counts = {len(a) for a in arrays.values()}
        if len(counts) != 1:
            raise InputError(f"'{path}': every array must hold the same number of samples (first axis)")
        raw: list[dict[str, Any]] = [{name: a[i] for name, a in arrays.items()} for i in range(counts.pop())]
    elif path.suffix == ".jsonl":
        try:
            raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"'{path}' is not JSON lines: {exc}") from None
        if not raw:
            raise InputError(f"'{path}' holds no samples")
    else:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"'{path}' is not JSON: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("data"), list) or not document["data"]:
            raise InputError(f"'{path}' must be perf_analyzer's input data: {{\"data\": [{{input: values}}, ...]}}")
        raw = document["data"]
    samples = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise InputError(f"'{path}' sample {index} must map input names to values")
        samples.append(
            {t.name: _from_file(t, shapes[t.name], entry, f"'{path}' sample {index}") for t in metadata.inputs}
        )
    return samples


def _synthetic(
    tensor: TensorMetadata, shape: tuple[int, ...], kind: str, generator: np.random.Generator
) -> np.ndarray[Any, Any]:
    datatype = DataType.from_wire(tensor.datatype)
    if datatype is DataType.BYTES:
        if kind == "zero":
            return np.full(shape, b"", dtype=object)
        letters = generator.integers(ord("a"), ord("z") + 1, size=(int(np.prod(shape)), STRING_LENGTH), dtype=np.uint8)
        return np.array([row.tobytes() for row in letters], dtype=object).reshape(shape)
    dtype = datatype.numpy_dtype
    if kind == "zero":
        return np.zeros(shape, dtype)
    if datatype is DataType.BOOL:
        return generator.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        # Small values: ids and indices (a token id, a class) stay inside any vocabulary.
        return generator.integers(0, 100, size=shape).astype(dtype)
    return generator.random(size=shape).astype(dtype)


def _from_file(
    tensor: TensorMetadata, shape: tuple[int, ...], entry: Mapping[str, Any], where: str
) -> np.ndarray[Any, Any]:
    if tensor.name not in entry:
        raise InputError(f"{where} has no input '{tensor.name}'")
    value = entry[tensor.name]
    datatype = DataType.from_wire(tensor.datatype)
    if isinstance(value, Mapping) and "b64" in value:
        content: Any = np.frombuffer(base64.b64decode(value["b64"]), dtype=datatype.numpy_dtype)
    elif isinstance(value, Mapping):
        content = value.get("content")
    else:
        content = value
    if datatype is DataType.BF16 and isinstance(content, np.ndarray) and content.dtype.str == "|V2":
        content = content.view(datatype.numpy_dtype)  # .npy and .npz keep bfloat16 as 2 bytes of void
    if datatype is DataType.BYTES:
        items = [
            s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in np.asarray(content, dtype=object).reshape(-1)
        ]
        array = np.array(items, dtype=object)
    else:
        array = np.asarray(content, dtype=datatype.numpy_dtype)
    needed = int(np.prod(shape))
    if array.size != needed:
        raise InputError(f"{where}: input '{tensor.name}' has {array.size} values; {list(shape)} needs {needed}")
    return array.reshape(shape)


def _dims(dims: Sequence[int]) -> str:
    return ",".join(str(d) for d in dims)


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME:1,128` (perf_analyzer's --shape) → ("NAME", (1, 128))."""
    name, separator, dims = text.rpartition(":")
    try:
        parsed = tuple(int(d) for d in dims.split(","))
    except ValueError:
        parsed = ()
    if not separator or not name or not parsed or any(d < 1 for d in parsed):
        raise InputError(f"--shape {text!r} must be NAME:d1,d2,... with positive dimensions, as INPUT0:1,128")
    return name, parsed

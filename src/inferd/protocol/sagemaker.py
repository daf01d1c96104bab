"""The SageMaker hosting contract's bodies: content types for /invocations (JSON, NumPy's .npy, CSV,
and Triton's SageMaker binary+json), Accept negotiation, and the multi-model endpoint documents.

JSON bodies are read by the v2 or TF Serving codec (whichever the body is); .npy and CSV carry one
array, the model's single input, and answer with its single output (or JSON).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd.errors import MalformedRequestError, NotAcceptableError, TensorDataError, UnsupportedMediaTypeError
from inferd.protocol import json_v2
from inferd.types import DataType

JSON = "application/json"
NPY = "application/x-npy"
CSV = "text/csv"
# Triton's SageMaker mode: a v2 JSON header of `json-header-size` bytes, then binary tensors.
TRITON_BINARY = "application/vnd.sagemaker-triton.binary+json"
HEADER_SIZE_PARAMETER = "json-header-size"
READS = (JSON, TRITON_BINARY, NPY, CSV)
ANSWERS = (JSON, NPY, CSV)


def media_type(header: bytes | None) -> tuple[str, dict[str, str]]:
    """`type/subtype; a=b` as (type/subtype lower-cased, {a: b}); JSON when the header is absent."""
    if not header:
        return JSON, {}
    kind, *parameters = header.decode("latin-1").split(";")
    found = {}
    for parameter in parameters:
        key, _, value = parameter.partition("=")
        found[key.strip().lower()] = value.strip().strip('"')
    return kind.strip().lower(), found


def check_readable(kind: str) -> None:
    if kind not in READS:
        raise UnsupportedMediaTypeError(
            f"Content-Type {kind!r} is not supported on /invocations; send one of {', '.join(READS)}"
        )


def answer_type(accept: bytes | None, default: str) -> str:
    """The first type of the Accept header that inferd can answer in (`default` for */* or none)."""
    if not accept:
        return default
    wanted = [entry.split(";")[0].strip().lower() for entry in accept.decode("latin-1").split(",")]
    for kind in wanted:
        if kind in ("*/*", "application/*", ""):
            return default
        if kind in ANSWERS:
            return kind
    raise NotAcceptableError(
        f"Accept {accept.decode('latin-1')!r} names no type inferd answers in: {', '.join(ANSWERS)}"
    )


def is_v2_body(document: Any) -> bool:
    """A KServe v2 request (`inputs` a list of named tensors) rather than a TF Serving one."""
    inputs = document.get("inputs") if isinstance(document, dict) else None
    return (
        isinstance(inputs, list)
        and bool(inputs)
        and all(isinstance(entry, dict) and "name" in entry and "datatype" in entry for entry in inputs)
    )


def decode_npy(body: bytes) -> np.ndarray[Any, Any]:
    """One array in NumPy's .npy format (no pickled objects: a .npy of objects is refused)."""
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise TensorDataError(f"the body is not a NumPy .npy array without objects: {exc}") from None
    if not isinstance(array, np.ndarray):
        raise TensorDataError("the body is a .npz archive; send one array as .npy")
    return array


def decode_csv(body: bytes, datatype: DataType) -> np.ndarray[Any, Any]:
    """Rows of comma-separated values as a 2-D array of the model input's datatype."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise TensorDataError("the CSV body is not UTF-8 text") from None
    rows = [line.split(",") for line in text.splitlines() if line.strip()]
    if not rows:
        raise TensorDataError("the CSV body holds no rows")
    widths = {len(row) for row in rows}
    if len(widths) > 1:
        raise TensorDataError(f"CSV rows have different numbers of values: {sorted(widths)}")
    if datatype is DataType.BYTES:
        array = np.empty((len(rows), widths.pop()), dtype=object)
        for index, row in enumerate(rows):
            array[index] = [value.encode("utf-8") for value in row]
        return array
    # Numbers are read from the cells by numpy's string casts, not by np.loadtxt: its C tokenizer
    # crashed the process (SIGSEGV) on bodies the fuzz tests sent, and a client's body must never
    # reach code that can.
    cells = np.char.strip(np.array(rows, dtype=np.str_))
    try:
        if datatype is DataType.BOOL:
            truth = np.isin(cells, ("1", "true", "True"))
            if not (truth | np.isin(cells, ("0", "false", "False"))).all():
                raise ValueError("a BOOL value must be 0, 1, true or false")
            return truth
        # A number past a float type's range becomes ±inf, as in JSON bodies (and Triton).
        with np.errstate(over="ignore"):
            if datatype is DataType.BF16:  # numpy reads no text as bfloat16: as float32, rounded to it
                return cells.astype(np.float32).astype(datatype.numpy_dtype)
            return cells.astype(datatype.numpy_dtype)
    except (ValueError, OverflowError) as exc:
        raise TensorDataError(f"the CSV body does not hold {datatype.value} values: {exc}") from None


def encode_npy(array: np.ndarray[Any, Any]) -> bytes:
    # The .npy format has no bfloat16 (numpy reads it back as void bytes): float32 holds it exactly.
    if array.dtype == DataType.BF16.numpy_dtype:
        array = array.astype(np.float32)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=array.dtype.kind == "O")
    return buffer.getvalue()


def encode_csv(array: np.ndarray[Any, Any]) -> bytes:
    """One row per line (a 1-D array: one value per line), as SageMaker's toolkit writes CSV."""
    rows = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(-1, 1)
    lines = []
    for row in rows:
        values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in row.tolist()]
        lines.append(",".join(values))
    return ("\n".join(lines) + "\n").encode("utf-8")


def decode_load_body(body: bytes) -> tuple[str, str]:
    """POST /models: `{"model_name": ..., "url": ...}`."""
    document = json_v2.load_json(body)
    if not isinstance(document, dict):
        raise MalformedRequestError('the body must be a JSON object {"model_name": ..., "url": ...}')
    name, url = document.get("model_name"), document.get("url")
    if not isinstance(name, str) or not name:
        raise MalformedRequestError("'model_name' must be a non-empty string")
    if not isinstance(url, str) or not url:
        raise MalformedRequestError("'url' must be the path of the model's folder")
    return name, url


def model_json(name: str, folder: Path) -> dict[str, str]:
    return {"modelName": name, "modelUrl": str(folder)}


def models_json(models: Sequence[tuple[str, Path]]) -> dict[str, Any]:
    return {"models": [model_json(name, folder) for name, folder in models]}

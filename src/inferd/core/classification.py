"""Triton's classification extension: an output requested with `classification: N` (tritonclient's
`class_count`) comes back as its top N classes, BYTES elements "score:index[:label]", per batch item
([batch, N]) when the model batches, else over the whole tensor ([N]). Scores print as C's "%f"
does for floating types (six decimals) and as integers for integer types; the index is the flat
index within the item; the label is the line of the output's `label_filename` at that index, read
from the model's folder when the version loads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig
from inferd.core.model_files import confined_path
from inferd.errors import InvalidRequestError, ModelLoadError
from inferd.types import DataType, InferRequest, InferResponse, Tensor

PARAMETER = "classification"
_SCORED = frozenset({
    DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64, DataType.INT8, DataType.INT16,
    DataType.INT32, DataType.INT64, DataType.FP32, DataType.FP64,
})  # fmt: skip
MAX_ELEMENTS = 1_000_000
"""Triton's bound: a larger output is not a classification."""


def with_labels(config: ModelConfig, model_dir: Path) -> ModelConfig:
    """`config` with every output's `label_filename` read (one label a line, index = line)."""
    outputs = []
    for output in config.outputs:
        if not output.label_filename:
            outputs.append(output)
            continue
        what = f"label_filename of output '{output.name}'"
        path = confined_path(model_dir, output.label_filename, what, config.name)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(
                f"model '{config.name}': cannot read the label file '{output.label_filename}' of output "
                f"'{output.name}': {exc}"
            ) from None
        lines = text.split("\n")  # as Triton reads them: a "\r" stays, a last unterminated line counts
        if lines and lines[-1] == "":
            lines.pop()
        outputs.append(replace(output, labels=tuple(lines)))
    return replace(config, outputs=tuple(outputs))


def requested_counts(request: InferRequest) -> dict[str, int]:
    """Outputs asked for as classifications, and how many classes each; 0 (Triton's "not a
    classification") is left out."""
    counts = {}
    for output in request.outputs:
        value = output.parameters.get(PARAMETER)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequestError(
                f"output '{output.name}': invalid value for the '{PARAMETER}' parameter, expected a whole "
                f"number >= 0 (the classes to return), got {value!r}",
                tensor=output.name,
            )
        if value:
            counts[output.name] = value
    return counts


def classify(response: InferResponse, counts: dict[str, int], config: ModelConfig) -> InferResponse:
    """`response` with each output in `counts` replaced by its top classes."""
    outputs = tuple(
        _top_classes(tensor, counts[tensor.name], config) if tensor.name in counts else tensor
        for tensor in response.outputs
    )
    return replace(response, outputs=outputs)


def _top_classes(tensor: Tensor, count: int, config: ModelConfig) -> Tensor:
    if tensor.datatype not in _SCORED:
        raise InvalidRequestError(
            f"class result not available for output due to unsupported type '{tensor.datatype.value}': output "
            f"'{tensor.name}' of model '{config.name}' is not a tensor of scores",
            tensor=tensor.name,
        )
    if tensor.data.size > MAX_ELEMENTS:
        raise InvalidRequestError(
            f"classification output tensor too large: output '{tensor.name}' has {tensor.data.size} elements "
            f"(at most {MAX_ELEMENTS})",
            tensor=tensor.name,
        )
    spec = config.output(tensor.name)
    labels = spec.labels if spec is not None else ()
    batched = config.max_batch_size > 0 and tensor.data.ndim >= 1
    items = tensor.data.reshape(tensor.data.shape[0], -1) if batched else tensor.data.reshape(1, -1)
    floating = tensor.datatype in (DataType.FP32, DataType.FP64)
    k = min(count, items.shape[1])
    rows: list[list[bytes]] = []
    for item in items:
        # Highest first; ties in index order (a stable sort, as Triton's is for small outputs).
        order = np.argsort(-item.astype(np.float64), kind="stable")[:k]
        rows.append([_entry(item[index], int(index), labels, floating) for index in order])
    shape = (len(rows), k) if batched else (k,)
    data: np.ndarray[Any, Any] = np.array([e for row in rows for e in row], dtype=object).reshape(shape)
    return Tensor(tensor.name, DataType.BYTES, shape, data)


def _entry(score: Any, index: int, labels: tuple[str, ...], floating: bool) -> bytes:
    text = f"{float(score):f}" if floating else str(int(score))
    text += f":{index}"
    if index < len(labels) and labels[index]:
        text += f":{labels[index]}"
    return text.encode("utf-8")

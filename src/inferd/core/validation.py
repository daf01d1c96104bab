"""Checks a request against its model's config and shapes the inputs for the runtime; checks and
shapes the runtime's outputs into the answer.

Runs before any execution, so every mistake in a request is reported with the tensor's name and
what was expected, and the runtime only ever sees inputs of the declared names, types and shapes;
and after it, so a client only ever sees outputs of the declared types, shaped as declared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig, TensorConfig
from inferd.errors import (
    BatchSizeError,
    DatatypeMismatchError,
    MalformedRequestError,
    MissingInputError,
    ModelOutputError,
    ShapeMismatchError,
    UnknownTensorError,
    with_triton_phrase,
)
from inferd.types import DataType, InferRequest, InferResponse, Tensor


def prepare_inputs(config: ModelConfig, request: InferRequest) -> tuple[dict[str, np.ndarray[Any, Any]], int]:
    """The runtime's feeds (reshaped where the config says so) and the batch size (1 if unbatched)."""
    _check_names(config, request)
    _check_input_count(config, request)
    feeds: dict[str, np.ndarray[Any, Any]] = {}
    batch_size: int | None = None
    batch_source = ""
    for tensor in request.inputs:
        spec = config.input(tensor.name)
        if spec is None:
            raise UnknownTensorError(
                with_triton_phrase(
                    f"unexpected inference input '{tensor.name}' for model '{config.name}'",
                    f"model '{config.name}' has no input '{tensor.name}'; its inputs are "
                    f"{[t.name for t in config.inputs]}",
                ),
                tensor=tensor.name,
            )
        _check_datatype(config, spec, tensor)
        tensor_batch = _check_shape(config, spec, tensor)
        if batch_size is None:
            batch_size, batch_source = tensor_batch, tensor.name
        elif tensor_batch != batch_size:
            raise BatchSizeError(
                with_triton_phrase(
                    f"input '{tensor.name}' batch size does not match other inputs for '{config.name}'",
                    f"input '{tensor.name}' has batch size {tensor_batch} but input '{batch_source}' has "
                    f"{batch_size}; all inputs of one request must share the batch dimension",
                ),
                tensor=tensor.name,
                expected=str(batch_size),
                actual=str(tensor_batch),
            )
        feeds[tensor.name] = _reshaped(config, spec, tensor, tensor_batch)
    missing = [t.name for t in config.inputs if not t.optional and t.name not in feeds]
    if missing:
        raise _missing_inputs(config, request, missing)
    return feeds, batch_size or 1


def _check_names(config: ModelConfig, request: InferRequest) -> None:
    """What Triton refuses as it builds a request, before it counts the inputs: a name given twice,
    then a requested output the model does not have."""
    for kind, tensors in (("input", request.inputs), ("output", request.outputs)):
        if len(tensors) < 2:
            continue
        seen: set[str] = set()
        for tensor in tensors:
            if tensor.name in seen:
                raise MalformedRequestError(
                    with_triton_phrase(
                        f"{kind} '{tensor.name}' already exists in request",
                        f"the request names {kind} '{tensor.name}' more than once",
                    ),
                    tensor=tensor.name,
                )
            seen.add(tensor.name)
    if request.outputs:
        output_names(config, request)


def _check_input_count(config: ModelConfig, request: InferRequest) -> None:
    """Triton counts a request's inputs before it looks at any of them: too few or too many is
    refused first, in its words (its input validation tests compare the whole sentence)."""
    required = sum(1 for t in config.inputs if not t.optional)
    if required <= len(request.inputs) <= len(config.inputs):
        return
    names = {tensor.name for tensor in request.inputs}
    missing = [t.name for t in config.inputs if not t.optional and t.name not in names]
    if missing:
        raise _missing_inputs(config, request, missing)
    # More inputs than the model has, none given twice (_check_names): some are not the model's.
    unknown = [tensor.name for tensor in request.inputs if config.input(tensor.name) is None]
    raise UnknownTensorError(
        with_triton_phrase(
            _triton_input_count(config, request, missing),
            f"model '{config.name}' has no input(s) {unknown}; its inputs are {[t.name for t in config.inputs]}",
        ),
        tensor=unknown[0],
    )


def _missing_inputs(config: ModelConfig, request: InferRequest, missing: list[str]) -> MissingInputError:
    return MissingInputError(
        with_triton_phrase(
            _triton_input_count(config, request, missing),
            f"model '{config.name}' needs input(s) {missing}, which the request does not carry",
        ),
        tensor=missing[0],
    )


def _triton_input_count(config: ModelConfig, request: InferRequest, missing: list[str]) -> str:
    def listed(names: Any) -> str:  # Triton writes name lists as ['a','b']
        return "[" + ",".join(f"'{name}'" for name in names) + "]"

    required = sum(1 for t in config.inputs if not t.optional)
    expected = (
        f"{required} inputs"
        if required == len(config.inputs)
        else f"number of inputs between {required} and {len(config.inputs)}"
    )
    return (
        f"expected {expected} but got {len(request.inputs)} inputs for model '{config.name}'. Got input(s) "
        f"{listed(t.name for t in request.inputs)}, but missing required input(s) {listed(missing)}. Please "
        "provide all required input(s)."
    )


def output_names(config: ModelConfig, request: InferRequest) -> list[str]:
    """The outputs to compute: the requested ones (checked), else all of the model's."""
    if not request.outputs:
        return [t.name for t in config.outputs]
    names = []
    for requested in request.outputs:
        if config.output(requested.name) is None:
            raise UnknownTensorError(
                with_triton_phrase(
                    f"unexpected inference output '{requested.name}' for model '{config.name}'",
                    f"model '{config.name}' has no output '{requested.name}'; its outputs are "
                    f"{[t.name for t in config.outputs]}",
                ),
                tensor=requested.name,
            )
        names.append(requested.name)
    return names


def _check_datatype(config: ModelConfig, spec: TensorConfig, tensor: Tensor) -> None:
    if tensor.datatype is not spec.datatype:
        raise DatatypeMismatchError(
            with_triton_phrase(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype.value}', but model "
                f"'{config.name}' expects '{spec.datatype.value}'",
                f"input '{tensor.name}' of model '{config.name}' has datatype {tensor.datatype.value}, "
                f"expected {spec.datatype.value}",
            ),
            tensor=tensor.name,
            expected=spec.datatype.value,
            actual=tensor.datatype.value,
        )


def _check_shape(config: ModelConfig, spec: TensorConfig, tensor: Tensor) -> int:
    """The tensor's batch size, after checking its shape against the config."""
    shape, dims = tensor.shape, spec.dims
    if config.max_batch_size == 0:
        if not _dims_match(shape, dims):
            raise _shape_error(config, spec, tensor, "")
        return 1
    # The common case first and cheaply: [batch, *dims] with a batch within the limit.
    if len(shape) == len(dims) + 1 and _dims_match(shape[1:], dims) and 1 <= shape[0] <= config.max_batch_size:
        return shape[0]
    expected = list(config.full_shape(spec))
    if len(shape) == len(dims) and _dims_match(shape, dims):
        raise BatchSizeError(
            with_triton_phrase(
                _triton_shape(config, tensor, expected),
                f"input '{tensor.name}' has shape {list(shape)}, which lacks the batch dimension: model "
                f"'{config.name}' batches (max_batch_size {config.max_batch_size}), so the shape must be "
                f"{expected} with the batch size first, e.g. {[1, *shape]}",
            ),
            tensor=tensor.name,
            expected=str(expected),
            actual=str(list(shape)),
        )
    if len(shape) != len(dims) + 1 or not _dims_match(shape[1:], dims):
        raise _shape_error(config, spec, tensor, " (the first dimension is the batch size)")
    batch = shape[0]
    raise BatchSizeError(
        with_triton_phrase(
            f"inference request batch-size must be <= {config.max_batch_size} for '{config.name}'",
            f"input '{tensor.name}' has batch size {batch} (the first dimension of shape {list(shape)}), "
            f"but model '{config.name}' accepts 1 to max_batch_size {config.max_batch_size}",
        ),
        tensor=tensor.name,
        expected=f"1..{config.max_batch_size}",
        actual=str(batch),
    )


def _dims_match(actual: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    if actual == declared:  # no -1 in the config: one tuple comparison
        return True
    return len(actual) == len(declared) and all(d == -1 or a == d for a, d in zip(actual, declared, strict=True))


def _shape_error(config: ModelConfig, spec: TensorConfig, tensor: Tensor, note: str) -> ShapeMismatchError:
    expected = list(config.full_shape(spec))
    return ShapeMismatchError(
        with_triton_phrase(
            _triton_shape(config, tensor, expected),
            f"input '{tensor.name}' of model '{config.name}' has shape {list(tensor.shape)}, expected "
            f"{expected}{note}; -1 means any size",
        ),
        tensor=tensor.name,
        expected=str(expected),
        actual=str(list(tensor.shape)),
    )


def _triton_shape(config: ModelConfig, tensor: Tensor, expected: list[int]) -> str:
    def compact(shape: Any) -> str:  # Triton writes shapes as [a,b]
        return "[" + ",".join(str(d) for d in shape) + "]"

    return (
        f"unexpected shape for input '{tensor.name}' for model '{config.name}'. Expected {compact(expected)}, "
        f"got {compact(tensor.shape)}"
    )


def _reshaped(config: ModelConfig, spec: TensorConfig, tensor: Tensor, batch: int) -> np.ndarray[Any, Any]:
    if spec.reshape is None:
        return tensor.data
    target = (batch, *spec.reshape) if config.max_batch_size > 0 else spec.reshape
    try:
        return tensor.data.reshape(target)
    except ValueError:
        raise ShapeMismatchError(
            f"input '{tensor.name}' of shape {list(tensor.shape)} cannot be reshaped to {list(target)} "
            "as the model's config asks",
            tensor=tensor.name,
            expected=str(list(target)),
            actual=str(list(tensor.shape)),
        ) from None


def check_output_rows(model: str, results: dict[str, np.ndarray[Any, Any]], rows: int) -> None:
    """A batching model's outputs have the batch as their first dimension: `rows` of them. Checked
    where results come back from a run, before they are split per request (a wrong count would
    hand requests other requests' rows) or sent."""
    for name, array in results.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise ModelOutputError(
                f"model '{model}' output '{name}' has shape {list(array.shape)}, but the batch had {rows} "
                "rows: a batching model's outputs have the batch as their first dimension"
            )


def answer(
    config: ModelConfig,
    version: int,
    request: InferRequest,
    results: dict[str, np.ndarray[Any, Any]],
    names: Sequence[str],
    rows: int,
) -> InferResponse:
    """The answer of `version` to `request`: its outputs `names` of the runtime's `results` (of
    `rows` rows), each checked and shaped as the config declares it."""
    return InferResponse(
        model_name=config.name,
        model_version=str(version),
        request_id=request.context.request_id,
        outputs=tuple(_output_tensor(config, version, name, results.get(name), rows) for name in names),
        id=request.id,
    )


def _output_tensor(
    config: ModelConfig, version: int, name: str, array: np.ndarray[Any, Any] | None, rows: int
) -> Tensor:
    spec = config.output(name)
    if spec is None or array is None:
        raise ModelOutputError(f"model '{config.name}' version {version} produced no output '{name}'")
    if spec.reshape is not None:
        # The runtime's shape is `reshape`; clients see `dims` (Triton's reshape semantics).
        target = (rows, *spec.dims) if config.max_batch_size > 0 else spec.dims
        if -1 not in target:
            array = array.reshape(target)
    expected = spec.datatype.numpy_dtype
    if array.dtype is not expected and array.dtype != expected and spec.datatype is not DataType.BYTES:
        raise ModelOutputError(
            f"model '{config.name}' version {version} output '{name}' is {array.dtype}, "
            f"but its config says {spec.datatype.value}"
        )
    return Tensor(name=name, datatype=spec.datatype, shape=array.shape, data=array)

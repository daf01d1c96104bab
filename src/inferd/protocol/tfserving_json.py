"""TF Serving's REST API bodies (https://www.tensorflow.org/tfx/serving/api_rest), both ways.

Predict takes the row format (`"instances"`: a list of rows, each a value when the model has one
input or an object naming each input) or the columnar format (`"inputs"`: a value, or an object
naming each input). The answer mirrors it: `"predictions"` (a list of rows: each a value when
the model has one output, else an object) or `"outputs"` (a value, or an object). Strings travel
as JSON text, or as `{"b64": "..."}` for binary; outputs whose names end in `_bytes` (TF Serving's
rule) and strings that are not UTF-8 (where TF Serving would write invalid JSON) go as base64.

TF Serving reads the datatype of each value from the model's signature, never from the JSON: so
does this codec, from the model's metadata.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.errors import InferdError, MalformedRequestError, TensorDataError, UnknownTensorError
from inferd.protocol import json_v2
from inferd.protocol.tf_types import DEFAULT_SIGNATURE, PREDICT_METHOD, tf_name
from inferd.types import DataType, ModelMetadata, Tensor, TensorMetadata


@dataclass(frozen=True, slots=True)
class PredictRequest:
    inputs: tuple[Tensor, ...]
    # True for "instances" (answered with "predictions"), False for "inputs" (answered with "outputs").
    row_format: bool


def decode_predict(document: Any, signature: ModelMetadata) -> PredictRequest:
    """A `:predict` body (parsed: `json_v2.load_json`) as tensors of the model's input datatypes."""
    if not isinstance(document, dict):
        raise MalformedRequestError('request body must be a JSON object with "instances" or "inputs"')
    check_signature_name(document.get("signature_name"))
    has_instances, has_inputs = "instances" in document, "inputs" in document
    if has_instances == has_inputs:
        raise MalformedRequestError(
            'request body must have exactly one of "instances" (row format) or "inputs" (columnar format)'
        )
    by_name = {tensor.name: tensor for tensor in signature.inputs}
    if has_instances:
        return PredictRequest(_rows(document["instances"], by_name), row_format=True)
    return PredictRequest(_columns(document["inputs"], by_name), row_format=False)


def check_signature_name(name: Any) -> None:
    """inferd models have one signature, `serving_default` (also what an empty name means)."""
    if name is None or name in ("", DEFAULT_SIGNATURE):
        return
    if not isinstance(name, str):
        raise MalformedRequestError('"signature_name" must be a string')
    raise MalformedRequestError(
        f"Serving signature name: {name!r} not found in signature def; the model has only '{DEFAULT_SIGNATURE}'"
    )


def encode_predict(outputs: Sequence[Tensor], *, row_format: bool) -> bytes:
    """`"predictions"` or `"outputs"`; floats as TF Serving writes them (a float32 0.1 is 0.1; NaN,
    Infinity and -Infinity for the values JSON has no number for)."""
    document: dict[str, Any]
    if row_format:
        document = {"predictions": prediction_rows(outputs)}
    elif len(outputs) == 1:
        document = {"outputs": json_value(outputs[0])}
    else:
        document = {"outputs": {tensor.name: json_value(tensor) for tensor in outputs}}
    return json_v2.encode_tensor_json(document)


def refuse_bfloat16(tensors: Sequence[Tensor], *, answering: bool) -> None:
    """TF Serving's REST API carries no bfloat16 (its JSON reader converts no value to it, its
    writer writes none): its door refuses such a tensor as TF Serving does, with its words (a 400).
    The other doors reading this JSON (SageMaker, batch) take numbers rounded to it and write it
    as the float32 that holds it."""
    for tensor in tensors:
        if tensor.datatype is not DataType.BF16:
            continue
        instead = "TF Serving's gRPC API, or a v2 binary request"
        if answering:
            said = f"Failed to write JSON value for tensor type: bfloat16 (output {tensor.name!r}; ask over {instead})"
        else:
            first = json_v2.encode_tensor_json(float(tensor.data.reshape(-1)[0]) if tensor.data.size else None)
            said = (
                f"Conversion of JSON Value: {first.decode()} to type: bfloat16 "
                f"(input {tensor.name!r}; send it over {instead})"
            )
        raise TensorDataError(said, tensor=tensor.name)


def encode_error(error: InferdError, request_id: str) -> bytes:
    """TF Serving's `{"error": message}`, with inferd's machine-readable fields beside it."""
    return json_v2.encode_error(error, request_id)


def model_status_json(versions: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
    """GetModelStatus as REST shows it; `versions`: (version, TF state name, error message)."""
    return {
        "model_version_status": [
            {
                "version": version,
                "state": state,
                "status": {"error_code": "UNKNOWN" if reason else "OK", "error_message": reason},
            }
            for version, state, reason in versions
        ]
    }


def metadata_json(metadata: ModelMetadata, version: str) -> dict[str, Any]:
    """GetModelMetadata as REST shows it: the model's one signature, `serving_default`."""
    return {
        "model_spec": {"name": metadata.name, "signature_name": "", "version": version},
        "metadata": {
            "signature_def": {
                "signature_def": {
                    DEFAULT_SIGNATURE: {
                        "inputs": {t.name: _tensor_info(t) for t in metadata.inputs},
                        "outputs": {t.name: _tensor_info(t) for t in metadata.outputs},
                        "method_name": PREDICT_METHOD,
                    }
                }
            }
        },
    }


def _tensor_info(tensor: TensorMetadata) -> dict[str, Any]:
    return {
        "dtype": tf_name(DataType.from_wire(tensor.datatype)),
        "tensor_shape": {"dim": [{"size": str(size), "name": ""} for size in tensor.shape], "unknown_rank": False},
        "name": tensor.name,
    }


# -- decoding ------------------------------------------------------------------------------------


def _rows(instances: Any, by_name: dict[str, TensorMetadata]) -> tuple[Tensor, ...]:
    if not isinstance(instances, list) or not instances:
        raise MalformedRequestError('"instances" must be a non-empty list of rows')
    named = [isinstance(row, dict) and not _is_b64(row) for row in instances]
    if all(named):
        names = list(instances[0])
        for index, row in enumerate(instances):
            if list(row) != names and set(row) != set(names):
                raise MalformedRequestError(
                    f'"instances" row {index} names inputs {sorted(row)} but row 0 names {sorted(names)}: '
                    "every row must name the same inputs"
                )
        return tuple(
            _tensor(_input(name, by_name), [row[name] for row in instances], f'"instances" input {name!r}')
            for name in names
        )
    if any(named):
        raise MalformedRequestError('"instances" mixes objects (named inputs) with plain values')
    return (_tensor(_only_input(by_name, '"instances"'), instances, '"instances"'),)


def decode_columns(value: Any, signature: ModelMetadata) -> tuple[Tensor, ...]:
    """A columnar "inputs" value (the only input's value, or an object naming each input)."""
    return _columns(value, {tensor.name: tensor for tensor in signature.inputs})


def _columns(inputs: Any, by_name: dict[str, TensorMetadata]) -> tuple[Tensor, ...]:
    if isinstance(inputs, dict) and not _is_b64(inputs):
        if not inputs:
            raise MalformedRequestError('"inputs" names no input')
        return tuple(
            _tensor(_input(name, by_name), value, f'"inputs" input {name!r}') for name, value in inputs.items()
        )
    return (_tensor(_only_input(by_name, '"inputs"'), inputs, '"inputs"'),)


def _input(name: str, by_name: dict[str, TensorMetadata]) -> TensorMetadata:
    found = by_name.get(name)
    if found is None:
        raise UnknownTensorError(
            f"the model has no input {name!r}; its inputs are {sorted(by_name)}",
            tensor=name,
            expected=", ".join(sorted(by_name)),
        )
    return found


def _only_input(by_name: dict[str, TensorMetadata], where: str) -> TensorMetadata:
    if len(by_name) != 1:
        raise MalformedRequestError(
            f"{where} gives unnamed values but the model has {len(by_name)} inputs {sorted(by_name)}: "
            "name each input in an object"
        )
    return next(iter(by_name.values()))


def _tensor(spec: TensorMetadata, value: Any, where: str) -> Tensor:
    datatype = DataType.from_wire(spec.datatype)
    if datatype is DataType.BYTES:
        array = _bytes_array(value, where)
    else:
        array = _number_array(value, spec.name, datatype, where)
    return Tensor(name=spec.name, datatype=datatype, shape=array.shape, data=array)


def _shape_of(value: Any, where: str) -> tuple[int, ...]:
    """The shape of nested lists, checking that every list at one depth has the same length."""
    shape: list[int] = []
    level = [value]
    while all(isinstance(item, list) for item in level) and level:
        lengths = {len(item) for item in level}
        if len(lengths) != 1:
            raise TensorDataError(f"{where}: lists at depth {len(shape)} differ in length {sorted(lengths)}")
        shape.append(lengths.pop())
        level = [element for item in level for element in item]
        if len(shape) > json_v2.MAX_DIMS:
            raise TensorDataError(f"{where}: more than {json_v2.MAX_DIMS} dimensions")
    if any(isinstance(item, list) for item in level):
        raise TensorDataError(f"{where}: values and lists are mixed at depth {len(shape)}")
    return tuple(shape)


def _number_array(value: Any, name: str, datatype: DataType, where: str) -> np.ndarray[Any, Any]:
    fast = json_v2.nested_numbers(value, datatype) if isinstance(value, list) else None
    if fast is not None:
        return fast
    shape = _shape_of(value, where)
    flat = [value] if not shape else value if len(shape) == 1 else list(json_v2.leaves(value))
    return json_v2.numbers_from_json(name, datatype, flat, where).reshape(shape)


def _bytes_array(value: Any, where: str) -> np.ndarray[Any, Any]:
    shape = _shape_of(value, where)
    flat = [value] if not shape else list(json_v2.leaves(value))
    elements: list[bytes] = []
    for item in flat:
        if isinstance(item, str):
            elements.append(item.encode("utf-8"))
        elif _is_b64(item):
            try:
                elements.append(base64.b64decode(item["b64"], validate=True))
            except (binascii.Error, ValueError, TypeError):
                raise TensorDataError(f'{where}: {{"b64": ...}} holds no valid base64') from None
        else:
            raise TensorDataError(f'{where}: string data must be text or {{"b64": "..."}}, found {item!r}')
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


# -- encoding ------------------------------------------------------------------------------------


def prediction_rows(outputs: Sequence[Tensor]) -> Any:
    """The row format's "predictions": a list of rows, each a value when there is one output,
    else an object naming each output (their first dimensions must agree)."""
    values = {tensor.name: json_value(tensor) for tensor in outputs}
    if len(outputs) == 1:
        only = values[outputs[0].name]
        return only if _row_count(only) is not None else [only]
    rows = {_row_count(value) for value in values.values()}
    count = rows.pop() if len(rows) == 1 else None
    if not count:
        raise MalformedRequestError(
            'the model\'s outputs differ in their first dimension, which the row format ("instances") needs '
            'to match: ask in the columnar format ("inputs")'
        )
    return [{name: value[row] for name, value in values.items()} for row in range(count)]


def _row_count(value: Any) -> int | None:
    """How many rows a value holds along its first dimension; None for a scalar."""
    if isinstance(value, np.ndarray):
        return len(value) if value.ndim else None
    return len(value) if isinstance(value, list) else None


def json_value(tensor: Tensor) -> Any:
    """A tensor's JSON value: numbers stay an array (written by `json_v2.encode_tensor_json`);
    strings become JSON text or base64 objects."""
    data = tensor.data
    if tensor.datatype is not DataType.BYTES:
        return data
    as_base64 = tensor.name.endswith("_bytes")
    flat = [_string_json(item, as_base64) for item in data.reshape(-1)]
    return np.array(flat, dtype=object).reshape(data.shape).tolist() if data.ndim else flat[0]


def _string_json(item: Any, as_base64: bool) -> Any:
    raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
    if not as_base64:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"b64": base64.b64encode(raw).decode("ascii")}

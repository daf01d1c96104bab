"""The other doors' bodies: TF Serving REST (row and columnar), SageMaker (JSON, CSV, .npy,
Triton's binary+json, with Content-Type and Accept), TorchServe (JSON values or raw bytes), OpenAI
embeddings, and the small JSON bodies of the repository and shared memory routes."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from hypothesis import strategies as st

from inferd.protocol import sagemaker
from inferd.testing.strategies.kserve import grpc_dims, v2_binary_bodies, v2_documents
from inferd.testing.strategies.values import (
    Target,
    array_bytes,
    element_count,
    elements,
    encode_json,
    header_text,
    json_values,
    model_names,
    mutated,
    one_in,
    small_count,
    target_shape,
    targets,
    usually,
)
from inferd.types import DataType


@st.composite
def _value(draw: st.DrawFn, datatype: DataType, dims: tuple[int, ...]) -> Any:
    """One row's value of an input: nested lists of `dims` (strings maybe as {"b64": ...})."""
    element = elements(datatype)
    if datatype is DataType.BYTES and draw(st.booleans()):
        element = st.binary(max_size=6).map(lambda raw: {"b64": base64.b64encode(raw).decode()})
    if one_in(draw, 40):
        return draw(json_values)
    value: Any = draw(element)
    for size in reversed(dims):
        value = draw(st.lists(element, max_size=3)) if one_in(draw, 40) else [value] * size
    return value


@st.composite
def tfserving_documents(draw: st.DrawFn, target: Target | None = None) -> Any:
    """A `:predict` body: rows ("instances", named or not) or columns ("inputs")."""
    target = target or draw(targets)
    rows = draw(st.integers(1, 3))
    single = len(target.inputs) == 1 and draw(st.booleans())
    document: dict[str, Any]
    if draw(st.booleans()):
        if single:
            _, datatype, dims = target.inputs[0]
            instances = [draw(_value(datatype, dims)) for _ in range(rows)]
        else:
            instances = [{name: draw(_value(dt, dims)) for name, dt, dims in target.inputs} for _ in range(rows)]
        document = {"instances": instances}
    else:
        columns = {name: [draw(_value(dt, dims)) for _ in range(rows)] for name, dt, dims in target.inputs}
        document = {"inputs": next(iter(columns.values())) if single else columns}
    if one_in(draw, 5):
        document["signature_name"] = draw(
            usually(st.sampled_from(["serving_default", ""]), st.just("other") | json_values)
        )
    return draw(mutated(document))


@st.composite
def torchserve_bodies(draw: st.DrawFn, target: Target | None = None) -> tuple[str, bytes]:
    """(Content-Type, body) of a /predictions request: JSON (columns naming the inputs, the only
    input's value, or a v2 body) or any bytes as the model's BYTES input."""
    target = target or draw(targets)
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.sampled_from(["application/octet-stream", "text/plain", "image/png"])), draw(st.binary())
    if kind == 1:
        return "application/json", encode_json(draw(v2_documents(target)))
    document = draw(tfserving_documents(target))
    value = document.get("inputs", document) if isinstance(document, dict) else document
    return "application/json", encode_json(value)


def _csv(datatype: DataType) -> st.SearchStrategy[bytes]:
    cell = elements(datatype).map(str) | st.text(alphabet='0123456789.-e, x"', max_size=4)
    row = st.lists(cell, min_size=1, max_size=17).map(",".join)
    return st.lists(row, min_size=0, max_size=3).map(lambda rows: "\n".join(rows).encode())


@st.composite
def npy_bodies(draw: st.DrawFn) -> bytes:
    """NumPy's .npy: an array of any of its dtypes (objects only as a pickle, which is refused),
    cut short now and then."""
    dtype = draw(st.sampled_from(["<f4", "<f8", "<i8", "|u1", "|b1", "<U3", "|S2", "<c8", "<f2"]))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(shape, dtype=dtype))
    raw = buffer.getvalue()
    if draw(st.integers(0, 5)) == 0:
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


@st.composite
def sagemaker_bodies(draw: st.DrawFn, target: Target | None = None) -> tuple[dict[str, str], bytes]:
    """(headers, body) of an /invocations request: the target model's header, a Content-Type and
    an Accept, and a body of that type (JSON v2 or TF Serving, CSV, .npy, Triton's binary+json)."""
    target = target or draw(targets)
    headers = {sagemaker_target_header(): target.model}
    kind = draw(st.integers(0, 5))
    if kind <= 1:
        document = draw(v2_documents(target)) if kind == 0 else draw(tfserving_documents(target))
        headers["Content-Type"], body = sagemaker.JSON, encode_json(document)
    elif kind == 2:
        headers["Content-Type"], body = sagemaker.CSV, draw(_csv(target.inputs[0][1]))
    elif kind == 3:
        headers["Content-Type"], body = sagemaker.NPY, draw(npy_bodies())
    elif kind == 4:
        body, length = draw(v2_binary_bodies(target))
        headers["Content-Type"] = f"{sagemaker.TRITON_BINARY};{sagemaker.HEADER_SIZE_PARAMETER}={length}"
    else:
        headers["Content-Type"], body = draw(header_text), draw(st.binary(max_size=32))
    if draw(st.booleans()):
        headers["Accept"] = draw(st.sampled_from([*sagemaker.ANSWERS, "*/*", "text/html", "application/*;q=0.5"]))
    return headers, body


def sagemaker_target_header() -> str:
    return "X-Amzn-SageMaker-Target-Model"


@st.composite
def openai_documents(draw: st.DrawFn) -> Any:
    """An embeddings request: `input` a text, a list of them, token ids or anything."""
    texts = st.text(max_size=16)
    document: dict[str, Any] = {
        "model": draw(usually(st.just("sentence_embedding"), st.just("add_sub") | model_names, 4)),
        "input": draw(
            usually(texts | st.lists(texts, min_size=1, max_size=4), st.lists(st.integers(0, 50), max_size=3))
        ),
    }
    if draw(st.booleans()):
        document["encoding_format"] = draw(usually(st.sampled_from(["float", "base64"]), st.just("int8")))
    if one_in(draw, 6):
        document["dimensions"] = draw(usually(st.integers(1, 4), st.integers(-1, 6) | json_values, 3))
    if one_in(draw, 10):
        document["user"] = draw(usually(st.text(max_size=6), json_values, 3))
    return draw(mutated(document))


# The small bodies of the repository and shared memory routes.
index_documents = st.fixed_dictionaries({}, optional={"ready": st.booleans() | json_values}).flatmap(mutated)
load_documents = st.fixed_dictionaries(
    {},
    optional={
        "parameters": st.dictionaries(
            st.sampled_from(["config", "file:1/model.onnx", "file:config.pbtxt"]) | st.text(max_size=6),
            st.text(max_size=12) | json_values,
            max_size=2,
        )
    },
).flatmap(mutated)
unload_documents = st.fixed_dictionaries(
    {}, optional={"parameters": st.fixed_dictionaries({}, optional={"unload_dependents": st.booleans() | json_values})}
).flatmap(mutated)
register_documents = st.fixed_dictionaries(
    {"key": st.text(max_size=12) | json_values, "byte_size": st.integers(-1, 2**64) | json_values},
    optional={"offset": st.integers(-1, 2**64) | json_values},
).flatmap(mutated)
sagemaker_load_documents = st.fixed_dictionaries(
    {"model_name": model_names | json_values, "url": st.text(max_size=16) | json_values}
).flatmap(mutated)


# -- TF Serving gRPC -------------------------------------------------------------------------------

# Values of each TensorProto *_val field, and the datatypes that write to it.
_TF_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "float_val": st.floats(width=32),
    "double_val": st.floats(),
    "int_val": st.integers(-(2**31), 2**31 - 1),
    "int64_val": st.integers(-(2**63), 2**63 - 1),
    "bool_val": st.booleans(),
    "half_val": st.integers(-(2**31), 2**31 - 1),
    "uint32_val": st.integers(0, 2**32 - 1),
    "uint64_val": st.integers(0, 2**64 - 1),
    "string_val": st.binary(max_size=8),
}
_TF_FIELD = {
    DataType.FP32: "float_val", DataType.FP64: "double_val", DataType.INT32: "int_val", DataType.INT16: "int_val",
    DataType.INT8: "int_val", DataType.UINT8: "int_val", DataType.UINT16: "int_val", DataType.INT64: "int64_val",
    DataType.BOOL: "bool_val", DataType.FP16: "half_val", DataType.BF16: "half_val", DataType.UINT32: "uint32_val",
    DataType.UINT64: "uint64_val", DataType.BYTES: "string_val",
}  # fmt: skip


@st.composite
def tfserving_predict_requests(draw: st.DrawFn, target: Target | None = None) -> Any:
    """A TF Serving PredictRequest: each input a TensorProto in its *_val field or tensor_content
    (fewer values than the shape holds are repeated, as TensorFlow does), dtypes and shapes from
    right to hostile, a version or label, an output filter."""
    from inferd.protocol.tf_types import tf_name
    from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
    from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb

    target = target or draw(targets)
    message = serving_pb.PredictRequest()
    message.model_spec.name = draw(usually(st.just(target.model), model_names, 12))
    choice = draw(st.integers(0, 5))
    if choice == 0:
        message.model_spec.version.value = draw(usually(st.just(1), st.integers(-5, 2**62)))
    elif choice == 1:
        message.model_spec.version_label = draw(usually(st.just("stable"), st.text(max_size=5)))
    if one_in(draw, 8):
        message.model_spec.signature_name = draw(st.sampled_from(["serving_default", "other", ""]))
    for name, wanted, dims in target.inputs:
        datatype = draw(st.sampled_from(list(DataType))) if one_in(draw, 12) else wanted
        tensor = message.inputs[draw(usually(st.just(name), st.text(max_size=5), 16))]
        tensor.dtype = draw(usually(st.just(tf_pb.DataType.Value(tf_name(datatype))), st.integers(0, 30), 16))
        shape = draw(st.lists(grpc_dims, max_size=3)) if one_in(draw, 10) else draw(target_shape(target, dims))
        tensor.tensor_shape.dim.extend(tf_pb.TensorShapeProto.Dim(size=size) for size in shape)
        if one_in(draw, 20):
            tensor.tensor_shape.unknown_rank = True
        if datatype is not DataType.BYTES and one_in(draw, 3):
            tensor.tensor_content = draw(array_bytes(datatype, shape))
            continue
        field = _TF_FIELD[datatype]
        count = element_count(shape) if small_count(shape) else 1
        count = draw(usually(st.just(count), st.integers(0, max(count, 1)), 6))  # TF repeats the last value
        getattr(tensor, field).extend(draw(st.lists(_TF_VALUES[field], min_size=count, max_size=count)))
    message.output_filter.extend(draw(st.lists(st.sampled_from(["OUTPUT0", "y", "EMBEDDING", "nope"]), max_size=2)))
    return message

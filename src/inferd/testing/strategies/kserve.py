"""KServe v2 bodies: JSON requests, requests with the binary tensor extension, and gRPC
ModelInferRequest messages (tritonclient's compiled protos)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from inferd.testing.strategies.values import (
    Target,
    array_bytes,
    dims,
    element_count,
    encode_json,
    ids,
    json_values,
    mutated,
    names,
    one_in,
    small_count,
    target_shape,
    targets,
    tensor_data,
    usually,
)
from inferd.types import DataType

datatype_names = st.sampled_from([d.value for d in DataType]) | st.text(max_size=6)


@st.composite
def _datatype(draw: st.DrawFn, wanted: DataType) -> DataType:
    """The model's datatype mostly; another one sometimes."""
    return draw(st.sampled_from(list(DataType))) if one_in(draw, 12) else wanted


@st.composite
def _parameters(draw: st.DrawFn) -> dict[str, Any]:
    keys = st.sampled_from(
        ["binary_data_output", "binary_data", "classification", "shared_memory_region", "sequence_id", "priority"]
    )
    return draw(st.dictionaries(keys | st.text(max_size=5), json_values, max_size=2))


@st.composite
def v2_documents(draw: st.DrawFn, target: Target | None = None) -> Any:
    """A v2 infer request for a target model as parsed JSON: inputs with JSON data, maybe outputs,
    parameters and an id; near misses and arbitrary JSON among them."""
    target = target or draw(targets)
    inputs = []
    for name, wanted, dims_ in target.inputs:
        datatype = draw(_datatype(wanted))
        shape = draw(target_shape(target, dims_))
        entry: dict[str, Any] = {"name": name, "datatype": datatype.value, "shape": shape}
        entry["data"] = draw(tensor_data(datatype, shape))
        if one_in(draw, 10):
            entry["parameters"] = draw(_parameters())
        inputs.append(draw(mutated(entry)))
    document: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        document["id"] = draw(ids)
    if draw(st.integers(0, 3)) == 0:
        document["outputs"] = draw(st.lists(st.fixed_dictionaries({"name": names}, optional={
            "parameters": _parameters()}), max_size=2))  # fmt: skip
    if draw(st.integers(0, 4)) == 0:
        document["parameters"] = draw(_parameters())
    return draw(mutated(document))


@st.composite
def v2_binary_bodies(draw: st.DrawFn, target: Target | None = None) -> tuple[bytes, int | None]:
    """A v2 request whose tensors follow its JSON header (the binary extension), and the header's
    length for Inference-Header-Content-Length: right mostly, else off, or missing."""
    target = target or draw(targets)
    header_inputs, parts = [], []
    for name, wanted, dims_ in target.inputs:
        datatype = draw(_datatype(wanted))
        shape = draw(target_shape(target, dims_))
        raw = draw(array_bytes(datatype, shape))
        size = draw(st.integers(-2, len(raw) + 4)) if one_in(draw, 12) else len(raw)
        header_inputs.append(
            {"name": name, "datatype": datatype.value, "shape": shape, "parameters": {"binary_data_size": size}}
        )
        parts.append(raw)
    document: dict[str, Any] = {"inputs": header_inputs}
    if draw(st.booleans()):
        document["parameters"] = {"binary_data_output": draw(st.booleans())}
    header = encode_json(draw(mutated(document)))
    body = header + b"".join(parts)
    choice = draw(st.integers(0, 19))
    if choice == 0:
        return body, None
    if choice == 1:
        return body, draw(st.integers(-1, len(body) + 2))
    return body, len(header)


# -- gRPC ----------------------------------------------------------------------------------------

# The typed contents field of each datatype (FP16 has none) and the values it takes.
_CONTENTS = {
    DataType.BOOL: ("bool_contents", st.booleans()),
    DataType.INT8: ("int_contents", st.integers(-(2**31), 2**31 - 1)),
    DataType.INT16: ("int_contents", st.integers(-(2**31), 2**31 - 1)),
    DataType.INT32: ("int_contents", st.integers(-(2**31), 2**31 - 1)),
    DataType.INT64: ("int64_contents", st.integers(-(2**63), 2**63 - 1)),
    DataType.UINT8: ("uint_contents", st.integers(0, 2**32 - 1)),
    DataType.UINT16: ("uint_contents", st.integers(0, 2**32 - 1)),
    DataType.UINT32: ("uint_contents", st.integers(0, 2**32 - 1)),
    DataType.UINT64: ("uint64_contents", st.integers(0, 2**64 - 1)),
    DataType.FP32: ("fp32_contents", st.floats(width=32)),
    DataType.FP64: ("fp64_contents", st.floats()),
    DataType.BYTES: ("bytes_contents", st.binary(max_size=8)),
}
# An int64 dimension: any of the edges, negative ones included (protobuf carries them).
grpc_dims = dims | st.integers(-(2**63), 2**63 - 1)


@st.composite
def _infer_parameter(draw: st.DrawFn, message: Any) -> None:
    kind = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]))
    values = {
        "bool_param": st.booleans(),
        "int64_param": st.integers(-(2**63), 2**63 - 1),
        "string_param": st.text(max_size=8),
        "double_param": st.floats(),
        "uint64_param": st.integers(0, 2**64 - 1),
    }
    setattr(message, kind, draw(values[kind]))


@st.composite
def _grpc_parameters(draw: st.DrawFn, container: Any) -> None:
    keys = st.sampled_from(["shared_memory_region", "shared_memory_byte_size", "classification", "binary_data"])
    for key in draw(st.lists(keys | st.text(max_size=5), max_size=2)):
        draw(_infer_parameter(container[key]))


@st.composite
def model_infer_requests(draw: st.DrawFn, target: Target | None = None) -> Any:
    """A ModelInferRequest for a target model: typed contents or raw_input_contents (rarely both),
    shapes from right to hostile, parameters of every kind, outputs asked for."""
    from tritonclient.grpc import service_pb2 as pb

    target = target or draw(targets)
    message = pb.ModelInferRequest(
        model_name=draw(usually(st.just(target.model), st.text(max_size=6), 12)),
        model_version=draw(usually(st.sampled_from(["", "", "1"]), st.sampled_from(["2", "-1"]) | st.text(max_size=3))),
        id=draw(ids),
    )
    raw = draw(st.integers(0, 2)) == 0
    for name, wanted, dims_ in target.inputs:
        datatype = draw(_datatype(wanted))
        shape = draw(st.lists(grpc_dims, max_size=3)) if one_in(draw, 12) else draw(target_shape(target, dims_))
        tensor = message.inputs.add(
            name=draw(usually(st.just(name), names, 16)),
            datatype=draw(usually(st.just(datatype.value), datatype_names, 16)),
            shape=shape,
        )
        if one_in(draw, 10):
            draw(_grpc_parameters(tensor.parameters))
        if raw:
            message.raw_input_contents.append(draw(array_bytes(datatype, shape)))
        if not raw or one_in(draw, 20):
            field, values = _CONTENTS.get(datatype, _CONTENTS[DataType.FP32])
            count = element_count(shape) if small_count(shape) else draw(st.integers(0, 3))
            getattr(tensor.contents, field).extend(draw(st.lists(values, min_size=count, max_size=count)))
    for name in draw(st.lists(names, max_size=2)) if one_in(draw, 3) else ():
        output = message.outputs.add(name=name)
        if draw(st.booleans()):
            draw(_grpc_parameters(output.parameters))
    if one_in(draw, 5):
        draw(_grpc_parameters(message.parameters))
    return message

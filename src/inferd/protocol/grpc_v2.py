"""KServe v2 gRPC messages (compiled protos shipped by tritonclient) ⇄ inferd types.

Inputs arrive either all in `raw_input_contents` (little-endian bytes, in input order) or each in
its typed `contents` field; outputs always leave in `raw_output_contents`, as Triton sends them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from inferd.config.model import ModelConfig
from inferd.datatypes import NAMES
from inferd.errors import InferdError, MalformedRequestError, TensorDataError, with_triton_phrase
from inferd.limits import UNLIMITED, RequestLimits
from inferd.protocol import model_config, shared_memory
from inferd.protocol.request_id import REQUEST_ID_HEADER, check_request_id
from inferd.protocol.status import error_from_grpc
from inferd.protocol.tensor_bytes import (
    bytes_array,
    check_element_count,
    check_shape_size,
    tensor_from_bytes,
    tensor_to_bytes,
)
from inferd.types import (
    BatchStatistics,
    DataType,
    Door,
    DurationStatistic,
    InferRequest,
    InferResponse,
    ModelIndexEntry,
    ModelMetadata,
    ModelStatistics,
    RequestContext,
    RequestedOutput,
    ServerMetadata,
    Tensor,
    TensorMetadata,
    element_count,
    new_request_id,
)

_DURATION_FIELDS = (
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss",
)  # fmt: skip

# Which typed contents field carries each datatype; FP16 has none and must come raw.
_CONTENTS_FIELD = {datatype: names.grpc_contents for datatype, names in NAMES.items() if names.grpc_contents}


_FIELD_DTYPES = {
    "bool_contents": np.bool_,
    "int_contents": np.int64,
    "int64_contents": np.int64,
    "uint_contents": np.uint64,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


def decode_request(
    message: Any,
    *,
    limits: RequestLimits,
    context: RequestContext | None = None,
    regions: shared_memory.RegionAccess | None = None,
    target: tuple[str, str] | None = None,
) -> InferRequest:
    """A `ModelInferRequest`, of `context` (the call's: a new one, of this door, when None). The
    context's request id (gRPC metadata) wins over the message's `id`; else one is made. `target`:
    the (model, version) the call resolved the message's to (an endpoint's variant)."""
    check_request_id(message.id, "'id'")
    if context is None:
        context = RequestContext(door=Door.KSERVE_GRPC)
    try:
        inputs = _decode_inputs(message, regions, limits)
        outputs = tuple(
            RequestedOutput(name=o.name, parameters=parameters_to_dict(o.parameters)) for o in message.outputs
        )
        parameters = parameters_to_dict(message.parameters)
    except InferdError as exc:
        exc.request_id = context.request_id or message.id or new_request_id()
        raise
    model, version = target or (message.model_name, message.model_version)
    return context.request(model, version, inputs, outputs, parameters, message.id)


def encode_response(
    response: InferResponse, request: InferRequest | None = None, regions: shared_memory.RegionAccess | None = None
) -> Any:
    """Outputs the request placed in shared memory are written there; their raw_output_contents
    entry is empty (it stays, so entries line up with outputs)."""
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    wishes = {o.name: o.parameters for o in request.outputs} if request is not None else {}
    placed = shared_memory.write_outputs(response.outputs, wishes, regions) if wishes else {}
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype.value, shape=tensor.shape)
        if tensor.name in placed:
            message.raw_output_contents.append(b"")  # as Triton: an empty entry keeps the indices aligned
        else:
            message.raw_output_contents.append(tensor_to_bytes(tensor))
    return message


# The response parameter that tells a stream's client whether a request's responses are over.
FINAL_RESPONSE = "triton_final_response"
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"


def encode_stream_response(
    response: InferResponse, request: InferRequest, final: bool, regions: shared_memory.RegionAccess | None = None
) -> Any:
    """A response of a ModelStreamInfer stream, saying whether it is the request's last."""
    encoded = encode_response(response, request, regions)
    encoded.parameters[FINAL_RESPONSE].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=encoded)


def empty_final_response(request: InferRequest) -> Any:
    """What ends a decoupled model's responses to a request that asked for it (Triton's
    `triton_enable_empty_final_response`): a response without outputs, marked final."""
    empty = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
    empty.parameters[FINAL_RESPONSE].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=empty)


def encode_request(request: InferRequest) -> Any:
    """A request as a client sends it (inferd.client): every input in `raw_input_contents`."""
    message = pb.ModelInferRequest(model_name=request.model_name, model_version=request.model_version, id=request.id)
    for tensor in request.inputs:
        message.inputs.add(name=tensor.name, datatype=tensor.datatype.value, shape=tensor.shape)
        message.raw_input_contents.append(tensor_to_bytes(tensor))
    for output in request.outputs:
        message.outputs.add(name=output.name)
    return message


def decode_response(message: Any, *, request_id: str = "") -> InferResponse:
    """A server's response as a client receives it (outputs in `raw_output_contents`, as Triton
    and inferd send them); arrays view the message's bytes."""
    raw = message.raw_output_contents
    if len(raw) != len(message.outputs):
        raise MalformedRequestError(
            f"response carries {len(raw)} raw_output_contents for {len(message.outputs)} outputs"
        )
    outputs = []
    for item, data in zip(message.outputs, raw, strict=True):
        try:
            datatype = DataType.from_wire(item.datatype)
        except ValueError:
            raise MalformedRequestError(
                f"output '{item.name}': datatype {item.datatype!r} is not a v2 datatype"
            ) from None
        # An answer its client asked for: no server's limits apply.
        outputs.append(tensor_from_bytes(item.name, datatype, tuple(int(d) for d in item.shape), data, UNLIMITED))
    return InferResponse(
        model_name=message.model_name,
        model_version=message.model_version,
        request_id=request_id,
        outputs=tuple(outputs),
        id=message.id,
    )


def decode_load_parameters(message: Any) -> tuple[str, dict[str, bytes]]:
    """RepositoryModelLoadRequest's parameters: the config override ("" for none) and the files."""
    config, files = "", {}
    for key, parameter in message.parameters.items():
        if key == "config":
            if parameter.WhichOneof("parameter_choice") != "string_param":
                raise MalformedRequestError("load parameter 'config' must be a string_param holding JSON")
            config = parameter.string_param
        elif key.startswith("file:"):
            if parameter.WhichOneof("parameter_choice") != "bytes_param":
                raise MalformedRequestError(f"load parameter '{key}' must be a bytes_param")
            files[key[len("file:") :]] = parameter.bytes_param
    return config, files


def decode_unload_parameters(message: Any) -> bool:
    """RepositoryModelUnloadRequest's parameters: whether `unload_dependents` is asked."""
    parameter = message.parameters.get("unload_dependents")
    if parameter is None:
        return False
    if parameter.WhichOneof("parameter_choice") != "bool_param":
        raise MalformedRequestError("unload parameter 'unload_dependents' must be a bool_param")
    return bool(parameter.bool_param)


def encode_load_request(name: str, config_json: str = "", files: Mapping[str, bytes] | None = None) -> Any:
    message = pb.RepositoryModelLoadRequest(model_name=name)
    if config_json:
        message.parameters["config"].string_param = config_json
    for path, content in (files or {}).items():
        message.parameters[f"file:{path}"].bytes_param = content
    return message


def encode_unload_request(name: str, unload_dependents: bool) -> Any:
    message = pb.RepositoryModelUnloadRequest(model_name=name)
    message.parameters["unload_dependents"].bool_param = unload_dependents
    return message


def decode_repository_index(message: Any) -> list[ModelIndexEntry]:
    return [ModelIndexEntry(name=m.name, version=m.version, state=m.state, reason=m.reason) for m in message.models]


def decode_server_metadata(message: Any) -> ServerMetadata:
    return ServerMetadata(name=message.name, version=message.version, extensions=tuple(message.extensions))


def decode_statistics(message: Any) -> list[ModelStatistics]:
    def duration(raw: Any) -> DurationStatistic:
        return DurationStatistic(count=raw.count, ns=raw.ns)

    return [
        ModelStatistics(
            name=s.name,
            version=s.version,
            last_inference_ms=s.last_inference,
            inference_count=s.inference_count,
            execution_count=s.execution_count,
            **{key: duration(getattr(s.inference_stats, key)) for key in _DURATION_FIELDS},
            batches=tuple(
                BatchStatistics(
                    batch_size=b.batch_size,
                    compute_input=duration(b.compute_input),
                    compute_infer=duration(b.compute_infer),
                    compute_output=duration(b.compute_output),
                )
                for b in s.batch_stats
            ),
        )
        for s in message.model_stats
    ]


def decode_model_config(message: Any) -> dict[str, Any]:
    """A ModelConfigResponse's config as the JSON document the HTTP endpoint returns."""
    from google.protobuf import json_format

    return dict(json_format.MessageToDict(message.config, preserving_proto_field_name=True))


# The trailing metadata inferd's server sends beside an error's message (server/grpc.py's abort).
_ERROR_TRAILERS = {"inferd-code": "code", "inferd-tensor": "tensor", "inferd-expected": "expected",
                   "inferd-actual": "actual", "inferd-retry-after-ms": "retry_after_ms"}  # fmt: skip


def decode_error(status_name: str, details: str, trailing: Sequence[tuple[str, Any]]) -> InferdError:
    """A failed call as inferd's typed error: its class from the `inferd-code` trailer (inferd's
    server), else from the status; the request id and the wait before a retry when sent."""
    fields = {_ERROR_TRAILERS[key]: str(value) for key, value in trailing if key in _ERROR_TRAILERS}
    retry_after_s = None
    if "retry_after_ms" in fields:
        retry_after_s = float(fields["retry_after_ms"]) / 1000
    else:
        seconds = next((str(value) for key, value in trailing if key == "retry-after"), "")
        retry_after_s = float(seconds) if seconds.isascii() and seconds.isdigit() else None
    error = error_from_grpc(
        status_name,
        fields.get("code"),
        details or status_name,
        tensor=fields.get("tensor"),
        expected=fields.get("expected"),
        actual=fields.get("actual"),
        retry_after_s=retry_after_s,
    )
    error.request_id = next((str(value) for key, value in trailing if key == REQUEST_ID_HEADER), None)
    return error


def encode_repository_index(entries: list[ModelIndexEntry]) -> Any:
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(name=e.name, version=e.version, state=e.state, reason=e.reason)
            for e in entries
        ]
    )


def encode_server_metadata(metadata: ServerMetadata) -> Any:
    return pb.ServerMetadataResponse(name=metadata.name, version=metadata.version, extensions=metadata.extensions)


def encode_model_metadata(metadata: ModelMetadata) -> Any:
    message = pb.ModelMetadataResponse(name=metadata.name, versions=metadata.versions, platform=metadata.platform)
    for tensor in metadata.inputs:
        message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    for tensor in metadata.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    return message


def decode_model_metadata(message: Any) -> ModelMetadata:
    def tensors(items: Any) -> tuple[TensorMetadata, ...]:
        return tuple(TensorMetadata(t.name, t.datatype, tuple(int(d) for d in t.shape)) for t in items)

    return ModelMetadata(
        name=message.name,
        versions=tuple(message.versions),
        platform=message.platform,
        inputs=tensors(message.inputs),
        outputs=tensors(message.outputs),
    )


def encode_model_config(config: ModelConfig) -> Any:
    return pb.ModelConfigResponse(config=model_config.to_proto(config))


def parameters_to_dict(parameters: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in parameters.items():
        which = value.WhichOneof("parameter_choice")
        if which is not None:
            result[key] = getattr(value, which)
    return result


def _decode_inputs(
    message: Any, regions: shared_memory.RegionAccess | None, limits: RequestLimits
) -> tuple[Tensor, ...]:
    """Input by input, each checked in Triton's order (where its data is, then the data), so a
    request with several mistakes gets the error Triton gives first: its clients match that text.
    Each is held to `limits` (the server's)."""
    model = message.model_name
    raw = message.raw_input_contents
    # raw_input_contents carries, in order, every input that is neither in shared memory nor typed.
    next_raw = 0
    tensors = []
    for index, item in enumerate(message.inputs):
        name = item.name
        if not name:
            raise MalformedRequestError(f"inputs[{index}] has no name")
        # Most requests carry no shared memory: the parameters are converted only for inputs that name a region.
        place = (
            shared_memory.placement(parameters_to_dict(item.parameters), name)
            if shared_memory.REGION in item.parameters
            else None
        )
        typed = _has_contents(item)
        if place is not None and typed:
            raise MalformedRequestError(
                f"unexpected 'content' provided when using shared memory for input tensor '{name}' for model '{model}'",
                tensor=name,
            )
        if place is None and typed and raw:
            # As Triton: one request carries its data one way, never both.
            raise MalformedRequestError(
                with_triton_phrase(
                    f"contents field must not be specified when using raw_input_contents for '{name}' for model "
                    f"'{model}'",
                    "send every input in raw_input_contents, or every one in contents",
                ),
                tensor=name,
            )
        try:
            datatype = DataType.from_wire(item.datatype)
        except ValueError:
            raise MalformedRequestError(
                f"input '{name}': datatype {item.datatype!r} is not a v2 datatype", tensor=name
            ) from None
        shape = tuple(int(d) for d in item.shape)
        if any(d < 0 for d in shape):
            raise MalformedRequestError(f"input '{name}': shape {list(shape)} has a negative dimension", tensor=name)
        check_shape_size(name, shape)
        if place is not None:
            data = shared_memory.read_input(place, regions, name)
            tensors.append(tensor_from_bytes(name, datatype, shape, memoryview(data), limits, model=model))
        elif next_raw < len(raw):
            tensors.append(tensor_from_bytes(name, datatype, shape, raw[next_raw], limits, model=model))
            next_raw += 1
        elif typed or (not raw and element_count(shape) == 0):
            tensors.append(Tensor(name, datatype, shape, _typed_contents(name, datatype, shape, item.contents, limits)))
        else:
            raise MalformedRequestError(
                with_triton_phrase(
                    f"unable to find data for input tensor '{name}' for model '{model}' in request",
                    f"inputs[{index}] has no contents, names no shared memory region, and raw_input_contents "
                    f"(of {len(raw)} entries) has none left for it",
                ),
                tensor=name,
            )
    if next_raw != len(raw):
        raise MalformedRequestError(
            f"raw_input_contents has {len(raw)} entries for {next_raw} inputs not in shared memory; when "
            "used, it must carry every such input, in order"
        )
    return tuple(tensors)


def _has_contents(item: Any) -> bool:
    contents = item.contents
    return any(len(getattr(contents, field)) for field in set(_CONTENTS_FIELD.values()))


def _typed_contents(
    name: str, datatype: DataType, shape: tuple[int, ...], contents: Any, limits: RequestLimits
) -> np.ndarray[Any, Any]:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise MalformedRequestError(
            f"input '{name}': {datatype.value} has no typed contents field; send it in raw_input_contents",
            tensor=name,
        )
    values = getattr(contents, field)
    count = element_count(shape)
    if len(values) != count:
        raise TensorDataError(
            f"input '{name}': shape {list(shape)} holds {count} elements but contents.{field} has {len(values)}",
            tensor=name,
            expected=f"{count} elements",
            actual=f"{len(values)} elements",
        )
    check_element_count(name, count, limits)
    if datatype is DataType.BYTES:
        return bytes_array(name, values, limits).reshape(shape)
    target = datatype.numpy_dtype
    # Read at the field's own width (so UINT64 stays exact), then narrow with a range check.
    array: np.ndarray[Any, Any] = np.array(values, dtype=_FIELD_DTYPES[field])
    if target.kind in "iu" and array.size:
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            raise TensorDataError(
                f"input '{name}': a value is outside {datatype.value}'s range [{info.min}, {info.max}]", tensor=name
            )
    return array.astype(target).reshape(shape)


def encode_statistics(statistics: list[ModelStatistics]) -> Any:
    message = pb.ModelStatisticsResponse()
    for s in statistics:
        item = message.model_stats.add(
            name=s.name,
            version=s.version,
            last_inference=s.last_inference_ms,
            inference_count=s.inference_count,
            execution_count=s.execution_count,
        )
        for field_name in _DURATION_FIELDS:
            duration = getattr(s, field_name)
            getattr(item.inference_stats, field_name).CopyFrom(
                pb.StatisticDuration(count=duration.count, ns=duration.ns)
            )
        for b in s.batches:
            batch = item.batch_stats.add(batch_size=b.batch_size)
            for field_name in ("compute_input", "compute_infer", "compute_output"):
                duration = getattr(b, field_name)
                getattr(batch, field_name).CopyFrom(pb.StatisticDuration(count=duration.count, ns=duration.ns))
    return message

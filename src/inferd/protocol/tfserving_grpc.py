"""TF Serving's gRPC messages (PredictRequest/Response, GetModelMetadata, GetModelStatus) ⇄ inferd's
types, on the wire-compatible messages of `protocol.tfserving_pb` (no TensorFlow import).

A TensorProto's values arrive in `tensor_content` (raw little-endian bytes) or in the typed `*_val`
field TensorFlow uses for its dtype (`int_val` for the small integer types, `half_val` holding
FP16's bits, `string_val` for strings); fewer values than the shape holds repeat the last one, as
TensorFlow fills them. Outputs go back in `tensor_content`, strings in `string_val`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferd.datatypes import NAMES
from inferd.errors import MalformedRequestError, TensorDataError
from inferd.limits import BYTES_ELEMENT_OVERHEAD, RequestLimits, text_bytes
from inferd.protocol.tensor_bytes import check_element_count, check_shape_size, check_text_size
from inferd.protocol.tf_types import DEFAULT_SIGNATURE, PREDICT_METHOD, STATE_NUMBERS, from_tf_number, tf_name
from inferd.protocol.tfserving_json import check_signature_name
from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.types import DataType, ModelMetadata, RequestedOutput, Tensor, TensorMetadata, element_count

# The most a numeric tensor may grow to when its last value is repeated over a shape it does not
# fill: a few bytes on the wire must not allocate gigabytes. Strings are held to the request's text
# limit (--max-request-text-bytes), counting each repeated one at its length.
MAX_FILLED_BYTES = 64 * 1024 * 1024

# The *_val field TensorFlow writes each dtype's values to.
_VALUE_FIELDS = {datatype: names.tf_values for datatype, names in NAMES.items()}
# The numpy type that holds each numeric *_val field's values exactly (protobuf's own widths).
_FIELD_DTYPES = {
    "float_val": np.float32,
    "double_val": np.float64,
    "int_val": np.int64,
    "int64_val": np.int64,
    "bool_val": np.bool_,
    "uint32_val": np.uint64,
    "uint64_val": np.uint64,
}


def model_spec_version(spec: Any) -> tuple[str, str]:
    """(version number as text or "", version label or "") of a ModelSpec."""
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return str(spec.version.value), ""
    if choice == "version_label":
        return "", spec.version_label
    return "", ""


def decode_predict(message: Any, limits: RequestLimits) -> tuple[tuple[Tensor, ...], tuple[RequestedOutput, ...]]:
    """The inputs (held to `limits`, the server's) and the outputs asked for (`output_filter`; none:
    all) of a PredictRequest."""
    check_signature_name(message.model_spec.signature_name)
    if not message.inputs:
        raise MalformedRequestError("PredictRequest.inputs is empty")
    inputs = tuple(tensor_from_proto(name, proto, limits) for name, proto in sorted(message.inputs.items()))
    outputs = tuple(RequestedOutput(name) for name in message.output_filter)
    return inputs, outputs


def tensor_from_proto(name: str, proto: Any, limits: RequestLimits) -> Tensor:
    datatype = from_tf_number(proto.dtype)
    if datatype is None:
        dtype_name = tf_pb.DataType.Name(proto.dtype) if proto.dtype in tf_pb.DataType.values() else proto.dtype
        raise TensorDataError(f"input '{name}': dtype {dtype_name} is not one inferd serves", tensor=name)
    if proto.tensor_shape.unknown_rank:
        raise TensorDataError(f"input '{name}': the shape has an unknown rank", tensor=name)
    shape = tuple(dim.size for dim in proto.tensor_shape.dim)
    if any(size < 0 for size in shape):
        raise TensorDataError(f"input '{name}': shape {list(shape)} has a negative dimension", tensor=name)
    check_shape_size(name, shape)
    count = element_count(shape)
    if proto.tensor_content and datatype is not DataType.BYTES:
        dtype = datatype.numpy_dtype
        if len(proto.tensor_content) != count * dtype.itemsize:
            raise TensorDataError(
                f"input '{name}': tensor_content holds {len(proto.tensor_content)} bytes; shape {list(shape)} of "
                f"{datatype.value} needs {count * dtype.itemsize}",
                tensor=name,
            )
        return Tensor(name, datatype, shape, np.frombuffer(proto.tensor_content, dtype=dtype).reshape(shape))
    values = getattr(proto, _VALUE_FIELDS[datatype])
    if len(values) > count or (not values and count):
        raise TensorDataError(
            f"input '{name}': {_VALUE_FIELDS[datatype]} holds {len(values)} values; shape {list(shape)} holds {count}",
            tensor=name,
        )
    check_element_count(name, count, limits)  # before a shape is filled: its count is the client's choice
    if datatype is DataType.BYTES:
        # What the tensor holds once its last string is repeated: its real bytes, not the
        # pointers' (one 512-byte string over [1, 1000000] is a 512 MB tensor, and as large an answer).
        repeated = (len(values[-1]) + BYTES_ELEMENT_OVERHEAD) * (count - len(values)) if values else 0
        check_text_size(name, text_bytes(values) + repeated, limits)
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
    elif datatype is DataType.FP16 or datatype is DataType.BF16:  # half_val: each value's 16 bits in an int32
        array = np.array(values, dtype=np.int32).astype(np.uint16).view(datatype.numpy_dtype)
    else:
        # Read at the field's own width: numpy would read [2**64 - 1, 5] as float64 and lose them.
        array = _checked(name, datatype, np.array(values, dtype=_FIELD_DTYPES[_VALUE_FIELDS[datatype]]))
    if len(array) < count:  # TensorFlow repeats the last value over the rest
        if datatype is not DataType.BYTES and count * datatype.numpy_dtype.itemsize > MAX_FILLED_BYTES:
            raise TensorDataError(
                f"input '{name}': {len(values)} values would be repeated to fill shape {list(shape)}, "
                f"more than {MAX_FILLED_BYTES >> 20} MiB: send every value",
                tensor=name,
            )
        array = np.concatenate([array, np.repeat(array[-1:], count - len(array))])
    return Tensor(name, datatype, shape, array.reshape(shape))


def _checked(name: str, datatype: DataType, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    target = datatype.numpy_dtype
    if target.kind in "iu" and values.size:
        info = np.iinfo(target)
        if values.min() < info.min or values.max() > info.max:
            raise TensorDataError(f"input '{name}': a value is outside {datatype.value}'s range", tensor=name)
    return values.astype(target)


def tensor_to_proto(tensor: Tensor) -> Any:
    proto = tf_pb.TensorProto(dtype=tf_name(tensor.datatype))
    proto.tensor_shape.dim.extend(tf_pb.TensorShapeProto.Dim(size=size) for size in tensor.shape)
    if tensor.datatype is DataType.BYTES:
        proto.string_val.extend(
            item if isinstance(item, bytes) else str(item).encode("utf-8") for item in tensor.data.reshape(-1)
        )
    else:
        proto.tensor_content = np.ascontiguousarray(tensor.data, dtype=tensor.datatype.numpy_dtype).tobytes()
    return proto


def encode_predict(outputs: Sequence[Tensor], model: str, version: str) -> Any:
    message = serving_pb.PredictResponse()
    message.model_spec.name = model
    message.model_spec.signature_name = DEFAULT_SIGNATURE
    if version.isdigit():
        message.model_spec.version.value = int(version)
    for tensor in outputs:
        message.outputs[tensor.name].CopyFrom(tensor_to_proto(tensor))
    return message


def encode_metadata(metadata: ModelMetadata, version: str, fields: Sequence[str]) -> Any:
    for field in fields:
        if field != "signature_def":
            raise MalformedRequestError(f"Metadata field {field} is not supported; ask for signature_def")
    signature = tf_pb.SignatureDef(method_name=PREDICT_METHOD)
    for tensors, target in ((metadata.inputs, signature.inputs), (metadata.outputs, signature.outputs)):
        for tensor in tensors:
            target[tensor.name].CopyFrom(_tensor_info(tensor))
    signatures = serving_pb.SignatureDefMap()
    signatures.signature_def[DEFAULT_SIGNATURE].CopyFrom(signature)
    message = serving_pb.GetModelMetadataResponse()
    message.model_spec.name = metadata.name
    if version.isdigit():
        message.model_spec.version.value = int(version)
    message.metadata["signature_def"].Pack(signatures)
    return message


def encode_status(versions: Sequence[tuple[str, str, str]]) -> Any:
    """GetModelStatusResponse; `versions`: (version, TF state name, error message), newest first."""
    message = serving_pb.GetModelStatusResponse()
    for version, state, reason in versions:
        entry = message.model_version_status.add(
            version=int(version) if version.isdigit() else 0, state=STATE_NUMBERS[state]
        )
        entry.status.error_code = 2 if reason else 0  # UNKNOWN, or OK
        entry.status.error_message = reason
    return message


def _tensor_info(tensor: TensorMetadata) -> Any:
    info = tf_pb.TensorInfo(name=tensor.name, dtype=tf_name(DataType.from_wire(tensor.datatype)))
    info.tensor_shape.dim.extend(tf_pb.TensorShapeProto.Dim(size=size) for size in tensor.shape)
    return info

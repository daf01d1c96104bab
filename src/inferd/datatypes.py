"""Every name each ecosystem gives a datatype, in one table: a new datatype is one row here (and
its numpy type in `types`), and every codec, the config reader and the ONNX runtime read it.

The names are plain strings, so this module imports nothing but `types`: Triton's config.pbtxt
(`TYPE_FP32`), KServe v2's gRPC typed contents field, TensorFlow's DataType enum (name and number,
for TF Serving's REST metadata and TensorProto), the TensorProto field TensorFlow writes values to,
and ONNX Runtime's type string.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.types import DataType


@dataclass(frozen=True, slots=True)
class DatatypeNames:
    config: str
    # KServe v2 gRPC's typed contents field; None where the datatype must come raw (FP16, BF16).
    grpc_contents: str | None
    tf_name: str
    tf_number: int
    # The TensorProto `*_val` field TensorFlow writes this datatype's values to.
    tf_values: str
    onnx: str


NAMES: dict[DataType, DatatypeNames] = {
    DataType.BOOL: DatatypeNames("TYPE_BOOL", "bool_contents", "DT_BOOL", 10, "bool_val", "tensor(bool)"),
    DataType.UINT8: DatatypeNames("TYPE_UINT8", "uint_contents", "DT_UINT8", 4, "int_val", "tensor(uint8)"),
    DataType.UINT16: DatatypeNames("TYPE_UINT16", "uint_contents", "DT_UINT16", 17, "int_val", "tensor(uint16)"),
    DataType.UINT32: DatatypeNames("TYPE_UINT32", "uint_contents", "DT_UINT32", 22, "uint32_val", "tensor(uint32)"),
    DataType.UINT64: DatatypeNames("TYPE_UINT64", "uint64_contents", "DT_UINT64", 23, "uint64_val", "tensor(uint64)"),
    DataType.INT8: DatatypeNames("TYPE_INT8", "int_contents", "DT_INT8", 6, "int_val", "tensor(int8)"),
    DataType.INT16: DatatypeNames("TYPE_INT16", "int_contents", "DT_INT16", 5, "int_val", "tensor(int16)"),
    DataType.INT32: DatatypeNames("TYPE_INT32", "int_contents", "DT_INT32", 3, "int_val", "tensor(int32)"),
    DataType.INT64: DatatypeNames("TYPE_INT64", "int64_contents", "DT_INT64", 9, "int64_val", "tensor(int64)"),
    DataType.FP16: DatatypeNames("TYPE_FP16", None, "DT_HALF", 19, "half_val", "tensor(float16)"),
    DataType.BF16: DatatypeNames("TYPE_BF16", None, "DT_BFLOAT16", 14, "half_val", "tensor(bfloat16)"),
    DataType.FP32: DatatypeNames("TYPE_FP32", "fp32_contents", "DT_FLOAT", 1, "float_val", "tensor(float)"),
    DataType.FP64: DatatypeNames("TYPE_FP64", "fp64_contents", "DT_DOUBLE", 2, "double_val", "tensor(double)"),
    DataType.BYTES: DatatypeNames("TYPE_STRING", "bytes_contents", "DT_STRING", 7, "string_val", "tensor(string)"),
}

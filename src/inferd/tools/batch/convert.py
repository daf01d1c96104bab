"""Records to tensors, and a model's answers back to output records.

A mini-batch of records becomes the inputs of one request, a row per record; the answer's rows
become the output records, each written as a TF Serving prediction row (the value when the model
has one output, else an object naming each output), then joined and filtered as SageMaker's data
processing does (`filters`). What a JSON record may be is what inferd's doors read: a v2 request
holding one row, a TF Serving row (an object naming each input), or a plain value for a model of
one input; the decoding is theirs (`protocol.json_v2`, `protocol.tfserving_json`), so a record is
read exactly as the server would read it. A record that cannot be read is that record's error,
never its mini-batch's: a mini-batch is decoded at once, and only when that fails record by record.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from inferd.errors import InferdError, TensorDataError
from inferd.limits import UNLIMITED
from inferd.protocol import json_v2, tfserving_json
from inferd.tools.batch.filters import FilterError, JsonFilter, join
from inferd.tools.batch.options import (
    FILE_COLUMN,
    RECORD_COLUMN,
    AssembleWith,
    BatchOptions,
    BatchUsageError,
    Format,
    JoinSource,
    OutputKind,
)
from inferd.tools.batch.records import Record, Records, positions
from inferd.tools.batch.store import frame
from inferd.types import DataType, ModelMetadata, Tensor, TensorMetadata

_NOT_NUMBERS = (b'"', b"t", b"f", b"n")


class MalformedRecordError(ValueError):
    """A record that is not what its content type says (not JSON, not one CSV row, not UTF-8)."""


@dataclass(frozen=True, slots=True)
class RecordError:
    record: Record
    reason: str
    code: str


@dataclass(slots=True)
class Group:
    """Records that travel as one request: their inputs stacked, a row per record."""

    records: Sequence[Record]
    inputs: tuple[Tensor, ...]
    # Each record's source as the join and the output filter see it (a parsed JSON value, the
    # CSV row's fields); None when nothing needs it.
    sources: list[Any]


class Converter:
    def __init__(self, options: BatchOptions, signature: ModelMetadata, max_batch_size: int) -> None:
        """`signature`: the model's inputs and outputs (their shapes with -1 for the batch when it
        batches); `max_batch_size`: 0 when the model takes no batch dimension (each record is then
        a whole request of its own)."""
        self._format = options.format
        self._signature = signature
        self._batching = max_batch_size > 0
        self._input_filter = JsonFilter.compile(options.input_filter, "--input-filter")
        self._output_filter = JsonFilter.compile(options.output_filter, "--output-filter")
        self._join = options.join_source is JoinSource.INPUT
        self._end = b"\n" if options.assemble_with is AssembleWith.LINE else b""
        self._inputs = {tensor.name: tensor for tensor in signature.inputs}
        declared = [tensor.name for tensor in signature.outputs]
        unknown = [name for name in options.outputs if name not in declared]
        if unknown:
            raise BatchUsageError(f"--outputs names {unknown}, not outputs of {signature.name}: {declared}")
        # The outputs written, in the order asked (else the signature's).
        self._output_names = list(options.outputs) or declared
        self._parquet = options.output_kind is OutputKind.PARQUET
        taken = [name for name in (FILE_COLUMN, RECORD_COLUMN) if name in self._output_names]
        if self._parquet and taken:
            raise BatchUsageError(
                f"{signature.name} has an output named {taken[0]!r}, a column a Parquet output keeps each row's "
                "input in: leave it out with --outputs, or write .out records"
            )
        self._columns = dict(options.columns) or {name: name for name in self._inputs}
        if self._format in (Format.CSV, Format.NPY, Format.TEXT, Format.RAW) and len(self._inputs) != 1:
            raise BatchUsageError(
                f"{options.content_type} records feed a model of one input; {signature.name} has "
                f"{len(self._inputs)}: {sorted(self._inputs)} (JSON Lines, NPZ and Parquet name each input)"
            )
        if self._format is Format.PARQUET:
            unknown = sorted(set(self._columns.values()) - set(self._inputs))
            if unknown:
                raise BatchUsageError(
                    f"--columns names {unknown}, not inputs of {signature.name}: {sorted(self._inputs)}"
                )
        self._keeps_source = self._join or not self._output_filter.selects_all
        # The one numeric input a JSON line may be a plain list for (the fast path), or None.
        only = next(iter(self._inputs.values())) if len(self._inputs) == 1 else None
        self._plain_input = (
            only
            if only is not None
            and self._batching
            and self._format in (Format.JSON_LINES, Format.JSON)
            and self._input_filter.selects_all
            and not self._keeps_source
            and DataType.from_wire(only.datatype) is not DataType.BYTES
            else None
        )
        # One numeric output of rows written as JSON lines, unfiltered: written at C speed.
        written = [tensor for tensor in signature.outputs if tensor.name in self._output_names]
        self._plain_output = (
            not self._parquet
            and len(written) == 1
            and self._batching
            and self._format is not Format.CSV
            and not self._keeps_source
            and options.assemble_with is AssembleWith.LINE
            and DataType.from_wire(written[0].datatype) is not DataType.BYTES
        )

    # -- records to requests -----------------------------------------------------------------------

    def decode(self, records: Sequence[Record]) -> tuple[list[Group], list[RecordError]]:
        """`records` as groups of stacked inputs (at once when they stack; else record by record,
        each joining the group before it when their shapes agree), and the errors of those that
        cannot be read. A record that reads but does not fit the model (a row too short) is the
        model's to refuse: the job then finds it by halving its mini-batch."""
        fast = self._plain_rows(records)
        if fast is not None:
            return [fast], []
        values: list[Any] = []
        sources: list[Any] = []
        errors: list[RecordError] = []
        kept: list[Record] = []
        for record in records:
            try:
                source, value = self._model_value(record)
            except (InferdError, FilterError, ValueError) as exc:
                errors.append(_error(record, exc))
                continue
            kept.append(record)
            values.append(value)
            sources.append(source if self._keeps_source else None)
        if not kept:
            return [], errors
        if self._batching:
            try:
                return [Group(kept, self._fitted(self._stack(values)), sources)], errors
            except (InferdError, ValueError, TypeError):
                pass  # one of them, or their shapes: record by record below
        groups: list[Group] = []
        for record, value, source in zip(kept, values, sources, strict=True):
            try:
                inputs = self._fitted(self._stack([value]) if self._batching else self._whole(value))
            except (InferdError, ValueError, TypeError) as exc:
                errors.append(_error(record, exc))
                continue
            last = groups[-1] if groups and self._batching else None
            if last is not None and isinstance(last.records, list) and _same_shapes(last.inputs, inputs):
                last.records.append(record)
                last.inputs = tuple(_concatenate(a, b) for a, b in zip(last.inputs, inputs, strict=True))
                last.sources.append(source)
            else:
                groups.append(Group([record], inputs, [source]))
        errors.sort(key=lambda error: error.record.index)
        return groups, errors

    def _plain_rows(self, records: Sequence[Record]) -> Group | None:
        """The mini-batch most jobs send, at C speed: JSON lines that are each a plain list of
        numbers for the model's one input, read in one parse and one numpy conversion (the TF
        Serving door's own reader of nested numbers). None when they are anything else, or one
        of them is not JSON: the general path reads them, record by record where it must."""
        if not self._plain_input or not records:
            return None
        raws = records.raws if isinstance(records, Records) else [record.raw for record in records]
        try:
            # Each line parsed on its own (as fast as one parse of them all): lines that are not
            # JSON alone must not become rows together (`[1,2],[3` and `[4,5]]`).
            values = list(map(orjson.loads, raws))
        except orjson.JSONDecodeError:
            return None
        joined = b"".join(raws)
        # Text with no quote and no t, f or n holds no string, true, false or null: only
        # numbers, which the reader then takes without looking at each (a byte search each).
        only_numbers = all(joined.find(letter) < 0 for letter in _NOT_NUMBERS)
        spec = self._plain_input
        array = json_v2.nested_numbers(values, DataType.from_wire(spec.datatype), only_numbers=only_numbers)
        if array is None or array.ndim == 0 or len(array) != len(records):
            return None
        tensor = Tensor(spec.name, DataType.from_wire(spec.datatype), array.shape, array)
        return Group(records, self._fitted((tensor,)), [None] * len(records))

    def _model_value(self, record: Record) -> tuple[Any, Any]:
        """The record as its source (what the join sees) and what the model gets of it."""
        form = self._format
        if form in (Format.JSON_LINES, Format.JSON):
            try:
                source = orjson.loads(record.raw)
            except orjson.JSONDecodeError as exc:
                raise MalformedRecordError(f"not JSON: {exc}") from None
            return source, self._input_filter.apply(source)
        if form is Format.CSV:
            fields = _csv_fields(record.raw)
            value = self._input_filter.apply(fields)
            return fields, value if isinstance(value, list) else [value]
        if form in (Format.TEXT, Format.RAW):
            return None, record.raw
        if form is Format.NPY:
            return None, {next(iter(self._inputs)): record.value[""]}
        if form is Format.NPZ:
            return None, record.value
        return None, {self._columns[column]: value for column, value in record.value.items() if column in self._columns}

    def _fitted(self, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Each input's rows in the shape the model declares when they hold as many values: a
        text or a number where the model takes [1] of it (what a record most naturally holds)."""
        fitted = []
        for tensor in tensors:
            spec = self._inputs.get(tensor.name)
            declared = tuple(spec.shape[1:] if self._batching else spec.shape) if spec is not None else ()
            have = tensor.shape[1:] if self._batching else tensor.shape
            if spec is None or have == declared or any(size < 0 for size in declared):
                fitted.append(tensor)
                continue
            if math.prod(have) != math.prod(declared):
                fitted.append(tensor)  # the model refuses it, saying why
                continue
            shape = (tensor.shape[0], *declared) if self._batching else declared
            fitted.append(Tensor(tensor.name, tensor.datatype, shape, tensor.data.reshape(shape)))
        return tuple(fitted)

    def _stack(self, values: list[Any]) -> tuple[Tensor, ...]:
        """Several records' values as one request's inputs, a row each."""
        form = self._format
        if form in (Format.JSON_LINES, Format.JSON):
            if any(_is_v2(value) for value in values):
                return self._v2_rows(values)
            return tfserving_json.decode_predict({"instances": values}, self._signature).inputs
        if form is Format.CSV:
            (spec,) = self._inputs.values()
            return (_tensor(spec, values),)
        if form in (Format.TEXT, Format.RAW):
            (spec,) = self._inputs.values()
            return (_texts(spec, values, (len(values), *_row_shape(spec))),)
        names = list(values[0])
        missing = sorted(set(self._inputs) - set(names))
        if missing:
            raise TensorDataError(f"the record has no value for input {missing[0]!r}")
        return tuple(_tensor(self._inputs[name], [value[name] for value in values]) for name in names)

    def _v2_rows(self, values: list[Any]) -> tuple[Tensor, ...]:
        parts = [self._v2_record(value) for value in values]
        stacked: list[Tensor] = []
        for position, first in enumerate(parts[0]):
            column = [part[position] for part in parts]
            if any(len(part) != len(parts[0]) for part in parts) or not all(
                _same_shapes((first,), (tensor,)) for tensor in column
            ):
                raise TensorDataError("the records' v2 inputs differ in names, datatypes or shapes")
            data = np.concatenate([tensor.data for tensor in column])
            stacked.append(Tensor(first.name, first.datatype, data.shape, data))
        return tuple(stacked)

    def _v2_record(self, value: Any) -> tuple[Tensor, ...]:
        request = json_v2.decode_request(
            orjson.dumps(value), limits=UNLIMITED, model_name=self._signature.name, model_version=""
        )
        for tensor in request.inputs:
            if self._batching and (not tensor.shape or tensor.shape[0] != 1):
                raise TensorDataError(
                    f"input {tensor.name!r} has shape {list(tensor.shape)}: "
                    "a v2 record holds one row (a first dimension of 1)"
                )
        return tuple(sorted(request.inputs, key=lambda tensor: tensor.name))

    def _whole(self, value: Any) -> tuple[Tensor, ...]:
        """One record that is a whole request (a model without a batch dimension)."""
        if self._format in (Format.JSON_LINES, Format.JSON):
            if _is_v2(value):
                return self._v2_record(value)
            return tfserving_json.decode_columns(value, self._signature)
        if self._format is Format.CSV:
            (spec,) = self._inputs.values()
            return (_tensor(spec, value),)
        if self._format in (Format.TEXT, Format.RAW):
            (spec,) = self._inputs.values()
            return (_texts(spec, [value], tuple(1 for _ in spec.shape)),)
        return tuple(_tensor(self._inputs[name], item) for name, item in value.items())

    # -- answers to output records -------------------------------------------------------------------

    def encode(self, group: Group, outputs: Sequence[Tensor], file_name: str = "") -> tuple[bytes, list[RecordError]]:
        """The group's output records, in order (those that failed here left out), and the errors;
        `file_name`: the input file's, which a Parquet output's rows name."""
        if self._parquet:
            return self._arrow_frame(group, outputs, file_name), []
        if self._plain_output and len(outputs) == 1:
            fast = _plain_lines(outputs[0], len(group.records))
            if fast is not None:
                return fast, []
        ordered = sorted(outputs, key=lambda tensor: self._output_order(tensor.name))
        rows = _prediction_rows(ordered, len(group.records)) if self._batching else [_whole_value(ordered)]
        written: list[bytes] = []
        errors: list[RecordError] = []
        for record, source, row in zip(group.records, group.sources, rows, strict=True):
            try:
                written.append(self._output_record(source, row) + self._end)
            except (FilterError, ValueError, TypeError) as exc:
                errors.append(_error(record, exc))
        return b"".join(written), errors

    def _arrow_frame(self, group: Group, outputs: Sequence[Tensor], file_name: str) -> bytes:
        """The group's rows as one Arrow stream (framed): its file's name and its records'
        positions, then a column per output in the order written, typed by the output's datatype."""
        import pyarrow as pa

        indexes = positions(group.records)
        columns: dict[str, Any] = {
            FILE_COLUMN: pa.DictionaryArray.from_arrays(np.zeros(len(indexes), dtype=np.int32), [file_name]),
            RECORD_COLUMN: pa.array(np.asarray(indexes, dtype=np.int64)),
        }
        for tensor in sorted(outputs, key=lambda tensor: self._output_order(tensor.name)):
            data = np.asarray(tensor.data).reshape(tensor.shape)
            if not self._batching:
                data = data[np.newaxis]  # a whole record's answer: one row
            if len(data) != len(indexes):
                raise TensorDataError(
                    f"the model answered {len(data)} rows of {tensor.name} for {len(indexes)} records"
                )
            columns[tensor.name] = _arrow_column(tensor.datatype, data)
        table = pa.table(columns)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return frame(sink.getvalue().to_pybytes())

    def _output_order(self, name: str) -> int:
        return self._output_names.index(name) if name in self._output_names else len(self._output_names)

    def _output_record(self, source: Any, row: Any) -> bytes:
        if self._format is Format.CSV:
            cells = _csv_cells(row)
            value: Any = source + cells if self._join else cells
            if not self._output_filter.selects_all:
                value = self._output_filter.apply(value)
            return _csv_line(value if isinstance(value, list) else [value])
        value = join(source, row) if self._join else row
        if not self._output_filter.selects_all:
            value = self._output_filter.apply(_plain(value))  # a path reaches into lists, not arrays
        return json_v2.encode_tensor_json(value)


def _arrow_column(datatype: DataType, data: np.ndarray[Any, Any]) -> Any:
    """An output's rows as an Arrow column: a value per row, or (nested) lists of the row's
    elements; BYTES as binary."""
    import pyarrow as pa

    flat_data = data.reshape(-1)
    if datatype is DataType.BF16:  # Arrow has no bfloat16: float32 holds each value exactly
        flat_data = flat_data.astype(np.float32)
    if datatype is DataType.BYTES:
        items = [item if isinstance(item, bytes) else str(item).encode() for item in flat_data.tolist()]
        column = pa.array(items, type=pa.binary())
    else:
        column = pa.array(flat_data)
    shape = data.shape
    for depth in range(len(shape) - 1, 0, -1):  # the innermost dimension first
        lists = int(np.prod(shape[:depth]))
        offsets = np.arange(lists + 1, dtype=np.int32) * shape[depth]
        column = pa.ListArray.from_arrays(pa.array(offsets), column)
    return column


def _plain(value: Any) -> Any:
    """A row (numpy arrays among dicts and lists) as lists, for a JSONPath to reach into; the
    numbers stay numpy's, so a float32 is still written in its own shortest form."""
    if isinstance(value, np.ndarray):
        return [_plain(item) for item in value] if value.ndim else value[()]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _error(record: Record, exc: Exception) -> RecordError:
    if isinstance(exc, InferdError):
        return RecordError(record, exc.message, exc.code.value)
    if isinstance(exc, FilterError):
        return RecordError(record, str(exc), "FILTER")
    if isinstance(exc, MalformedRecordError):
        return RecordError(record, str(exc), "MALFORMED_RECORD")
    return RecordError(record, str(exc), "INVALID_RECORD")


def _is_v2(value: Any) -> bool:
    inputs = value.get("inputs") if isinstance(value, dict) else None
    return isinstance(inputs, list) and bool(inputs) and all(isinstance(e, dict) and "name" in e for e in inputs)


def _texts(spec: TensorMetadata, values: list[bytes], shape: tuple[int, ...]) -> Tensor:
    """Texts or files' bytes as the one BYTES input, in `shape` (as many elements as `values`)."""
    texts = np.empty(len(values), dtype=object)
    texts[:] = values
    return Tensor(spec.name, DataType.BYTES, shape, texts.reshape(shape))


def _row_shape(spec: TensorMetadata) -> tuple[int, ...]:
    return tuple(1 if size < 0 else size for size in spec.shape[1:])


def _tensor(spec: TensorMetadata, rows: list[Any]) -> Tensor:
    """Values of one input (lists, arrays, strings) as its tensor, cast to the input's datatype
    (an NPY of float64 feeds an FP32 input; a float never becomes an integer)."""
    datatype = DataType.from_wire(spec.datatype)
    if datatype is DataType.BYTES:
        flat = np.asarray(rows, dtype=object)
        encoded = np.empty(flat.shape, dtype=object)
        items = flat.reshape(-1)
        if not all(isinstance(item, str | bytes) for item in items):
            raise TensorDataError(f"input {spec.name!r} is BYTES: its values must be texts or bytes")
        encoded.reshape(-1)[:] = [item.encode() if isinstance(item, str) else item for item in items]
        return Tensor(spec.name, datatype, encoded.shape, encoded)
    target = datatype.numpy_dtype
    array = np.asarray(rows)
    if array.dtype.kind in "US":
        # CSV's fields: numpy reads their text, a bad one raises (bfloat16 it reads as float32 first)
        array = array.astype(np.float32).astype(target) if datatype is DataType.BF16 else array.astype(target)
    elif array.dtype.kind == "O":
        raise TensorDataError(f"input {spec.name!r}: the records' values differ in shape or are not numbers")
    elif datatype is DataType.BF16 and array.dtype.kind in "fiu":
        array = array.astype(target)  # numbers rounded to bfloat16, as a cast does
    elif not np.can_cast(array.dtype, target, casting="same_kind"):
        raise TensorDataError(f"input {spec.name!r} is {spec.datatype}: {array.dtype} values cannot become it")
    else:
        array = array.astype(target, copy=False)
    return Tensor(spec.name, datatype, array.shape, np.ascontiguousarray(array))


def _same_shapes(a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> bool:
    return len(a) == len(b) and all(
        x.name == y.name and x.datatype is y.datatype and x.shape[1:] == y.shape[1:] for x, y in zip(a, b, strict=True)
    )


def _concatenate(a: Tensor, b: Tensor) -> Tensor:
    data = np.concatenate([a.data, b.data])
    return Tensor(a.name, a.datatype, data.shape, data)


def _plain_lines(output: Tensor, count: int) -> bytes | None:
    """An output of `count` rows of numbers (each a list) as JSON lines, from one dump of the
    whole array: exactly what a dump of each row writes, without a call per row. None for what it
    cannot write so (NaN or ±inf, which orjson writes as null; rows of other ranks)."""
    data = output.data
    if data.ndim != 2 or len(data) != count or data.dtype.kind not in "iuf" or not data.flags.c_contiguous:
        return None
    text = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
    if b"null" in text:
        return None
    return text[1:-1].replace(b"],[", b"]\n[") + b"\n"


def _prediction_rows(outputs: Sequence[Tensor], count: int) -> list[Any]:
    rows: list[Any] = tfserving_json.prediction_rows(outputs)
    if len(rows) != count:
        raise TensorDataError(f"the model answered {len(rows)} rows for {count} records")
    return rows


def _whole_value(outputs: Sequence[Tensor]) -> Any:
    values = {tensor.name: tfserving_json.json_value(tensor) for tensor in outputs}
    return values[outputs[0].name] if len(outputs) == 1 else values


def _csv_fields(raw: bytes) -> list[str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRecordError("the CSV line is not UTF-8") from None
    rows = list(csv.reader([text]))
    if len(rows) != 1:
        raise MalformedRecordError("not one CSV row")
    return rows[0]


def _csv_cells(row: Any) -> list[Any]:
    """An output row as CSV cells: every output's values, flattened, in the signature's order."""
    parts = list(row.values()) if isinstance(row, Mapping) else [row]
    cells: list[Any] = []
    for part in parts:
        if isinstance(part, np.ndarray):
            cells.extend(part.reshape(-1))
        elif isinstance(part, list):
            cells.extend(json_v2.leaves(part))
        else:
            cells.append(part)
    return cells


def _csv_line(cells: list[Any]) -> bytes:
    """Numbers as JSON writes them (a float32's shortest form), text quoted as CSV needs."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="")
    writer.writerow([_cell_text(cell) for cell in cells])
    return out.getvalue().encode("utf-8")


def _cell_text(cell: Any) -> str:
    if isinstance(cell, str):
        return cell
    if isinstance(cell, bytes):
        return cell.decode("utf-8", errors="backslashreplace")
    if isinstance(cell, dict) and "b64" in cell:
        return str(cell["b64"])
    return json_v2.encode_tensor_json(cell).decode("ascii")

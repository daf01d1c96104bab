"""Records to tensors and answers to output records (inferd.tools.batch.convert), and how the
job cuts files into shards and mini-batches: no model, no files beyond tmp_path."""

from __future__ import annotations

import numpy as np
import orjson

from inferd.tools.batch.convert import Converter
from inferd.tools.batch.options import BatchOptions, JoinSource
from inferd.tools.batch.records import Record
from inferd.types import DataType, ModelMetadata, Tensor, TensorMetadata

ONE_INPUT = ModelMetadata(
    "m", ("1",), "onnxruntime_onnx", (TensorMetadata("x", "FP32", (-1, 3)),), (TensorMetadata("y", "FP32", (-1, 2)),)
)
TWO_INPUTS = ModelMetadata(
    "m",
    ("1",),
    "onnxruntime_onnx",
    (TensorMetadata("a", "INT64", (-1, 2)), TensorMetadata("b", "FP32", (-1,))),
    (TensorMetadata("y", "FP32", (-1, 2)), TensorMetadata("z", "BYTES", (-1,))),
)


def lines(*texts: bytes) -> list[Record]:
    return [Record(index=i, line=i + 1, raw=t, size=len(t)) for i, t in enumerate(texts)]


def test_rows_stack_into_one_request_and_a_bad_record_is_its_own_error() -> None:
    converter = Converter(BatchOptions("m", "i", "o"), ONE_INPUT, max_batch_size=8)
    groups, errors = converter.decode(lines(b"[1, 2, 3]", b"not json", b'{"x": [4, 5, 6]}', b"[7, 8]", b"[9, 10, 11]"))
    assert [(e.record.index, e.code) for e in errors] == [(1, "MALFORMED_RECORD")]
    # the rest read; a row of another shape starts a group of its own (the model will refuse it)
    assert [[r.index for r in g.records] for g in groups] == [[0, 2], [3], [4]]
    np.testing.assert_array_equal(groups[0].inputs[0].data, [[1, 2, 3], [4, 5, 6]])


def test_a_good_mini_batch_decodes_at_once() -> None:
    converter = Converter(BatchOptions("m", "i", "o"), ONE_INPUT, max_batch_size=8)
    groups, errors = converter.decode(lines(b"[1, 2, 3]", b"[4, 5, 6]"))
    assert not errors and len(groups) == 1
    (x,) = groups[0].inputs
    assert x.datatype is DataType.FP32 and x.shape == (2, 3)


def test_named_inputs_and_outputs_as_rows_joined_and_filtered() -> None:
    options = BatchOptions(
        "m",
        "i",
        "o",
        input_filter="$['a','b']",
        join_source=JoinSource.INPUT,
        output_filter="$['id','SageMakerOutput']",
    )
    converter = Converter(options, TWO_INPUTS, max_batch_size=8)
    groups, errors = converter.decode(lines(b'{"id": 1, "a": [1, 2], "b": 0.5}', b'{"id": 2, "a": [3, 4], "b": 1.5}'))
    assert not errors
    (group,) = groups
    assert [t.name for t in group.inputs] == ["a", "b"] and group.inputs[0].data.dtype == np.int64
    y = Tensor("y", DataType.FP32, (2, 2), np.array([[0.1, 0.2], [0.3, 0.4]], dtype=np.float32))
    z = np.empty(2, dtype=object)
    z[:] = [b"first", b"\xff"]
    written, failed = converter.encode(group, [Tensor("z", DataType.BYTES, (2,), z), y])
    assert not failed
    assert written.endswith(b"\n")
    assert [orjson.loads(w) for w in written.splitlines()] == [
        {"id": 1, "SageMakerOutput": {"y": [0.1, 0.2], "z": "first"}},
        {"id": 2, "SageMakerOutput": {"y": [0.3, 0.4], "z": {"b64": "/w=="}}},  # not UTF-8: base64, as TF Serving
    ]


def test_csv_fields_feed_the_one_input_and_the_join_appends_the_outputs() -> None:
    options = BatchOptions("m", "i", "o", content_type="text/csv", input_filter="$[1:]", join_source=JoinSource.INPUT)
    converter = Converter(options, ONE_INPUT, max_batch_size=8)
    (group,), errors = converter.decode(lines(b'"a,b",1,2,3', b"c,4,5,6"))
    assert not errors
    np.testing.assert_array_equal(group.inputs[0].data, [[1, 2, 3], [4, 5, 6]])
    y = Tensor("y", DataType.FP32, (2, 2), np.array([[0.1, 0.2], [0.3, 0.4]], dtype=np.float32))
    written, _ = converter.encode(group, [y])
    assert written == b'"a,b",1,2,3,0.1,0.2\nc,4,5,6,0.3,0.4\n'  # float32's shortest form


def test_lines_that_are_json_only_together_are_each_malformed() -> None:
    converter = Converter(BatchOptions("m", "i", "o"), ONE_INPUT, max_batch_size=8)
    groups, errors = converter.decode(lines(b"[1,2,3],[4", b"5,6]", b"[7, 8, 9]"))
    assert [(e.record.index, e.code) for e in errors] == [(0, "MALFORMED_RECORD"), (1, "MALFORMED_RECORD")]
    assert [[r.index for r in g.records] for g in groups] == [[2]]


def test_a_bytes_input_takes_texts_and_bytes_only() -> None:
    import pytest

    from inferd.errors import TensorDataError
    from inferd.tools.batch.convert import _tensor

    tensor = _tensor(TensorMetadata("t", "BYTES", (-1,)), ["é", b"\xff"])
    assert list(tensor.data) == ["é".encode(), b"\xff"]
    with pytest.raises(TensorDataError, match="texts or bytes"):
        _tensor(TensorMetadata("t", "BYTES", (-1,)), [3, 4])


def test_an_output_filter_reaches_into_the_outputs() -> None:
    options = BatchOptions("m", "i", "o", join_source=JoinSource.INPUT, output_filter="$.SageMakerOutput[0]")
    converter = Converter(options, ONE_INPUT, max_batch_size=8)
    (group,), _ = converter.decode(lines(b"[1, 2, 3]"))
    y = Tensor("y", DataType.FP32, (1, 2), np.array([[0.5, float("nan")]], dtype=np.float32))
    written, failed = converter.encode(group, [y])
    assert not failed and written == b"0.5\n"
    everything = Converter(BatchOptions("m", "i", "o", output_filter="$[*]"), ONE_INPUT, max_batch_size=8)
    (group,), _ = everything.decode(lines(b"[1, 2, 3]"))
    written, _ = everything.encode(group, [y])
    assert written == b"[0.5,NaN]\n"  # NaN as inferd's doors write it


def test_outputs_become_arrow_columns_of_any_rank_through_framed_streams() -> None:
    import pyarrow as pa

    from inferd.tools.batch.convert import _arrow_column
    from inferd.tools.batch.store import read_frames

    cube = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    column = _arrow_column(DataType.FP32, cube)
    assert column.type == pa.list_(pa.list_(pa.float32()))
    assert column.to_pylist() == cube.tolist()
    empty = _arrow_column(DataType.INT64, np.zeros((3, 0), dtype=np.int64))
    assert empty.to_pylist() == [[], [], []]
    texts = _arrow_column(DataType.BYTES, np.array([[b"a", b"b"], [b"\xff", b""]], dtype=object))
    assert texts.to_pylist() == [[b"a", b"b"], [b"\xff", b""]]

    converter = Converter(BatchOptions("m", "in", "out", accept="application/x-parquet"), ONE_INPUT, 8)
    records = [Record(index=i, line=i + 1, raw=orjson.dumps([float(i)] * 3), size=9) for i in (3, 4)]
    groups, errors = converter.decode(records)
    assert not errors
    outputs = [Tensor("y", DataType.FP32, (2, 2), np.array([[1, 2], [3, 4]], dtype=np.float32))]
    first, _ = converter.encode(groups[0], outputs, "in.jsonl")
    body = first + first  # two mini-batches one after the other in a part
    tables = list(read_frames(body, lambda data: pa.ipc.open_stream(data).read_all()))
    rows = [{"file": "in.jsonl", "record": 3, "y": [1.0, 2.0]}, {"file": "in.jsonl", "record": 4, "y": [3.0, 4.0]}]
    assert [table.to_pylist() for table in tables] == [rows, rows]


BF16_MODEL = ModelMetadata(
    "m", ("1",), "onnxruntime_onnx", (TensorMetadata("x", "BF16", (-1, 2)),), (TensorMetadata("y", "BF16", (-1, 2)),)
)


def test_bf16_models_read_numbers_rounded_to_it_and_answer_the_float32_that_holds_it() -> None:
    import pyarrow as pa

    from inferd.tools.batch.convert import _arrow_column

    bf16 = DataType.BF16.numpy_dtype
    for options, records in (
        (BatchOptions("m", "i", "o"), lines(b"[1.00390625, 2]", b"[3, 4]")),
        (BatchOptions("m", "i", "o", content_type="text/csv"), lines(b"1.00390625,2", b"3,4")),
    ):
        converter = Converter(options, BF16_MODEL, max_batch_size=8)
        (group,), errors = converter.decode(records)
        assert not errors
        assert group.inputs[0].data.dtype == bf16 and group.inputs[0].data.astype(float).tolist() == [[1, 2], [3, 4]]
    converter = Converter(BatchOptions("m", "i", "o"), BF16_MODEL, max_batch_size=8)
    (group,), _ = converter.decode(lines(b"[1, 2]", b"[3, 4]"))
    y = np.array([[1.5, float("nan")], [-3.0e38, 0.25]], dtype=bf16)
    written, failed = converter.encode(group, [Tensor("y", DataType.BF16, (2, 2), y)])
    assert not failed and written == b"[1.5,NaN]\n[-3.0040553e+38,0.25]\n"
    column = _arrow_column(DataType.BF16, y)
    assert column.type == pa.list_(pa.float32()) and column.to_pylist()[1] == y[1].astype(np.float32).tolist()

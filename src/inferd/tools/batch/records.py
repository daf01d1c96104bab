"""The job's input: its files (a file, a folder or a prefix, local or any fsspec URL) and the
records each holds, read in order.

A file is listed with what tells a changed file (its size and its ETag or modification time), so
a rerun that would resume over changed inputs refuses instead. Records are read as a stream: a
line at a time for line-split input, a batch of rows at a time for NPY, NPZ and Parquet, the
whole file for a file that is one record. Each record keeps its position in its file (and its
line), which its output's order and its error row follow.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import fsspec
import numpy as np

from inferd.tools.batch.options import BatchOptions, BatchUsageError, Format, SplitType

PARQUET_BATCH_ROWS = 1024
READ_BYTES = 1024 * 1024  # a line-split file is read a block at a time
ROWS_PER_CHUNK = 4096  # an array's rows are handed on this many at a time


@dataclass(frozen=True)
class InputFile:
    path: str  # the filesystem's path
    name: str  # relative to the input's root, with "/": the output is <output>/<name>.out
    size: int
    version: str  # the ETag, else the modification time: what says the file changed

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "version": self.version}


class Record:
    """One record of a file. A plain class with slots, made positionally: a job makes one per
    line, so its cost is counted in the job's throughput."""

    __slots__ = ("index", "line", "raw", "size", "value")

    def __init__(self, index: int, line: int, raw: bytes, size: int, value: Any = None) -> None:
        self.index = index  # its position in its file, from 0
        self.line = line  # its line (from 1) in line-split input, else 0
        self.raw = raw  # its bytes as read (a line without its end, a file); b"" for a row of an array or table
        self.size = size  # bytes counted toward --max-payload-mb (and the progress's read bytes)
        self.value = value  # a row's values: {name: array or value}, or one array (NPY)

    def __repr__(self) -> str:
        return f"Record(index={self.index}, line={self.line}, size={self.size})"


class Records(Sequence[Record]):
    """Consecutive records of one file, kept as lists (their bytes, sizes, lines, row values) and
    made into `Record`s only when one is looked at: a mini-batch that reads cleanly never makes
    one, which on a small model is a tenth of a job's time."""

    __slots__ = ("indexes", "lines", "raws", "sizes", "start", "values")

    def __init__(
        self,
        start: int,
        raws: list[bytes],
        lines: Sequence[int],
        sizes: list[int] | None = None,
        values: list[Any] | None = None,
        indexes: list[int] | None = None,
    ) -> None:
        self.start = start  # the first one's index
        self.indexes = indexes  # each one's index, when they are not consecutive from `start`
        self.raws = raws
        self.lines = lines  # each one's line (0: not line-split)
        self.sizes = sizes if sizes is not None else list(map(len, raws))
        self.values = values

    @classmethod
    def of(cls, records: Sequence[Record]) -> Records:
        """Records already made (consecutive ones), as a Records."""
        if isinstance(records, Records):
            return records
        return cls(
            records[0].index if records else 0,
            [r.raw for r in records],
            [r.line for r in records],
            [r.size for r in records],
            [r.value for r in records] if any(r.value is not None for r in records) else None,
            [r.index for r in records],
        )

    @classmethod
    def joined(cls, chunks: Sequence[Records], start: int) -> Records:
        """Consecutive chunks of one file as one Records (`start`: the index when there are none)."""
        if not chunks:
            return cls(start, [], [])
        if len(chunks) == 1:
            return chunks[0]
        values = None
        if any(chunk.values is not None for chunk in chunks):
            values = [value for chunk in chunks for value in (chunk.values or [None] * len(chunk))]
        return cls(
            chunks[0].start,
            [raw for chunk in chunks for raw in chunk.raws],
            [line for chunk in chunks for line in chunk.lines],
            [size for chunk in chunks for size in chunk.sizes],
            values,
        )

    def __len__(self) -> int:
        return len(self.raws)

    @overload
    def __getitem__(self, position: int) -> Record: ...

    @overload
    def __getitem__(self, position: slice) -> Records: ...

    def __getitem__(self, position: int | slice) -> Record | Records:
        if isinstance(position, slice):
            start, stop, _ = position.indices(len(self.raws))
            stop = max(start, stop)
            indexes = self.indexes[start:stop] if self.indexes is not None else None
            return Records(
                indexes[0] if indexes else self.start + start,
                self.raws[start:stop],
                self.lines[start:stop],
                self.sizes[start:stop],
                self.values[start:stop] if self.values is not None else None,
                indexes,
            )
        if position < 0:
            position += len(self.raws)
        value = self.values[position] if self.values is not None else None
        index = self.indexes[position] if self.indexes is not None else self.start + position
        return Record(index, self.lines[position], self.raws[position], self.sizes[position], value)

    def index_list(self) -> list[int]:
        return list(self.indexes) if self.indexes is not None else list(range(self.start, self.start + len(self)))

    def __add__(self, other: Records) -> Records:
        """These records and the ones that follow them."""
        values = None
        if self.values is not None or other.values is not None:
            values = (self.values or [None] * len(self)) + (other.values or [None] * len(other))
        indexes = None
        if self.indexes is not None or other.indexes is not None or other.start != self.start + len(self):
            indexes = self.index_list() + other.index_list()
        return Records(
            self.start, self.raws + other.raws, [*self.lines, *other.lines], self.sizes + other.sizes, values, indexes
        )


def open_location(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path of a local path or fsspec URL."""
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, str(path)


def list_inputs(uri: str) -> tuple[fsspec.AbstractFileSystem, list[InputFile]]:
    """The files of the input, sorted by name: `uri` itself when it is a file, every file under it
    when it is a folder, else every file whose path starts with it (an S3 prefix)."""
    fs, path = open_location(uri)
    if fs.isfile(path):
        root, found = path.rsplit("/", 1)[0] if "/" in path else "", [path]
    elif fs.isdir(path):
        root, found = path.rstrip("/"), list(fs.find(path))
    else:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        root = parent
        found = [name for name in fs.find(parent) if name.startswith(path)] if parent and fs.isdir(parent) else []
    files: list[InputFile] = []
    for name in sorted(found):
        info = fs.info(name)
        if info.get("type") != "file":
            continue
        relative = name[len(root) :].lstrip("/") if root else name
        check_output_name(relative)
        version = str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or "")
        files.append(InputFile(path=name, name=relative, size=int(info.get("size") or 0), version=version))
    if not files:
        raise BatchUsageError(f"--input {uri}: no file there")
    return fs, files


def positions(records: Sequence[Record]) -> list[int]:
    """Each record's position in its file (Records keep them without making a Record each)."""
    return records.index_list() if isinstance(records, Records) else [record.index for record in records]


def check_output_name(relative: str) -> None:
    """An input's name becomes its output's (`<output>/<name>.out`): a name that could climb out of
    the output (`..`, an object key such as `a/../../b`) or land among the job's own parts is
    refused before anything runs."""
    segments = relative.split("/")
    if any(segment in ("", ".", "..") for segment in segments) or segments[0] == "_parts":
        raise BatchUsageError(
            f"input {relative!r}: its output would be written outside --output or among the job's parts; "
            "rename it or leave it out"
        )


def read_records(fs: fsspec.AbstractFileSystem, file: InputFile, options: BatchOptions) -> Iterator[Records]:
    """The records of `file`, in order, some at a time (a block of lines, a batch of rows)."""
    form = options.format
    if form is Format.NPY or form is Format.NPZ:
        yield from _chunks(_array_rows(fs, file, form))
    elif form is Format.PARQUET:
        yield from _chunks(_parquet_rows(fs, file, options.columns))
    elif options.split is SplitType.LINE:
        yield from _lines(fs, file)
    else:
        with fs.open(file.path, "rb") as handle:
            data = handle.read()
        yield Records(0, [data], [0])


def _lines(fs: fsspec.AbstractFileSystem, file: InputFile, span: Span | None = None) -> Iterator[Records]:
    """One record per line that is not empty (empty lines are skipped, their numbers kept: an
    error row names the line of the file); a line ends at LF, or CR LF. With `span`, only the
    records of its bytes (one shard's), numbered from its first."""
    index, number = (span.index, span.line - 1) if span is not None else (0, 0)
    left = span.end - span.start if span is not None else -1  # bytes still to read; -1: to the end
    rest = b""
    with fs.open(file.path, "rb") as handle:
        if span is not None:
            handle.seek(span.start)
        while True:
            block = handle.read(READ_BYTES if left < 0 else min(READ_BYTES, left)) if left != 0 else b""
            if left > 0:
                left -= len(block)
            data = rest + block
            lines = data.split(b"\n") if block else [rest]
            rest = lines.pop() if block else b""
            if b"\r" not in data and all(lines):
                # No CR, no empty line: a record per line, without a Python loop.
                records = Records(index, lines, range(number + 1, number + 1 + len(lines)))
                number += len(lines)
            else:
                kept: list[bytes] = []
                numbers: list[int] = []
                for line in lines:
                    number += 1
                    if line[-1:] == b"\r":
                        line = line[:-1]
                    if line:
                        kept.append(line)
                        numbers.append(number)
                records = Records(index, kept, numbers)
            index += len(records)
            if records:
                yield records
            if not block:
                return


@dataclass(frozen=True)
class Span:
    """Where one shard's records lie in its file: bytes [start, end) of a line-split file (-1 for
    a file read whole), its first record's index and line."""

    start: int
    end: int
    index: int
    line: int


def shard_spans(fs: fsspec.AbstractFileSystem, file: InputFile, options: BatchOptions) -> tuple[list[Span], int]:
    """The spans of the file's shards, and its records: one pass over it (a line-split file's
    bytes are found here, so that whoever reads a shard reads only its bytes)."""
    shard_records = options.shard_records
    if options.format in (Format.NPY, Format.NPZ, Format.PARQUET) or options.split is not SplitType.LINE:
        count = sum(len(chunk) for chunk in read_records(fs, file, options))
        spans = [Span(-1, -1, start, 0) for start in range(0, count, shard_records)]
        return spans or [Span(-1, -1, 0, 0)], count
    starts: list[tuple[int, int, int]] = []  # (byte, index, line) of each shard's first record
    index = number = position = 0
    rest = b""
    with fs.open(file.path, "rb") as handle:
        while True:
            block = handle.read(READ_BYTES)
            lines = (rest + block).split(b"\n") if block else [rest]
            rest = lines.pop() if block else b""
            for line in lines:
                number += 1
                if line and line != b"\r":
                    if index % shard_records == 0:
                        starts.append((position, index, number))
                    index += 1
                position += len(line) + 1
            if not block:
                break
    if not starts:  # no record: one empty shard, as the local engine makes of it
        return [Span(0, 0, 0, 1)], 0
    ends = [start for start, _, _ in starts[1:]] + [file.size]
    spans = [Span(start, end, first, line) for (start, first, line), end in zip(starts, ends, strict=True)]
    return spans, index


def read_shard(fs: fsspec.AbstractFileSystem, file: InputFile, options: BatchOptions, span: Span) -> Records:
    """The records of one shard, as `read_records` reads them: only its bytes of a line-split
    file; the file's records, then the shard's, otherwise."""
    if span.start >= 0:
        return Records.joined(list(_lines(fs, file, span)), span.index)
    records = Records.joined(list(read_records(fs, file, options)), 0)
    return records[span.index : span.index + options.shard_records]


def _chunks(records: Iterator[Record]) -> Iterator[Records]:
    chunk: list[Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == ROWS_PER_CHUNK:
            yield Records.of(chunk)
            chunk = []
    if chunk:
        yield Records.of(chunk)


def _array_rows(fs: fsspec.AbstractFileSystem, file: InputFile, form: Format) -> Iterator[Record]:
    with fs.open(file.path, "rb") as handle:
        data = io.BytesIO(handle.read())
    try:
        loaded = np.load(data, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise BatchUsageError(f"{file.name}: not an {form.value.upper()} file ({exc})") from None
    arrays: Mapping[str, np.ndarray[Any, Any]]
    if form is Format.NPZ:
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise BatchUsageError(f"{file.name}: not an NPZ archive")
        try:
            arrays = {name: loaded[name] for name in loaded.files}
        except (ValueError, OSError) as exc:
            raise BatchUsageError(f"{file.name}: cannot read its arrays ({exc})") from None
    else:
        if not isinstance(loaded, np.ndarray):
            raise BatchUsageError(f"{file.name}: not an NPY array")
        arrays = {"": loaded}
    lengths = {len(array) if array.ndim else 0 for array in arrays.values()}
    if len(lengths) != 1 or not lengths.pop():
        raise BatchUsageError(f"{file.name}: its arrays must share a first axis (the records), of at least one row")
    count = len(next(iter(arrays.values())))
    for index in range(count):
        row = {name: array[index] for name, array in arrays.items()}
        yield Record(index, 0, b"", sum(value.nbytes for value in row.values()), row)


def _parquet_rows(fs: fsspec.AbstractFileSystem, file: InputFile, columns: Mapping[str, str]) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fs.open(file.path, "rb") as handle:
        try:
            table = pq.ParquetFile(handle)
        except (pa.ArrowException, OSError) as exc:
            raise BatchUsageError(f"{file.name}: not a Parquet file ({exc})") from None
        names = table.schema_arrow.names
        missing = [column for column in columns if column not in names]
        if missing:
            raise BatchUsageError(f"{file.name}: no column {missing[0]!r}; its columns are {names}")
        wanted = list(columns) or None
        index = 0
        for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted):
            for row in batch.to_pylist():
                yield Record(index, 0, b"", _row_size(row), row)
                index += 1


def _row_size(row: Mapping[str, Any]) -> int:
    size = 0
    for value in row.values():
        if isinstance(value, bytes | str):
            size += len(value)
        elif isinstance(value, list):
            size += 8 * len(value)
        else:
            size += 8
    return size

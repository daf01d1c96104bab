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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np

from inferd.tools.batch.options import BatchOptions, BatchUsageError, Format, SplitType

OUTPUT_SUFFIX = ".out"
PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True)
class InputFile:
    path: str  # the filesystem's path
    name: str  # relative to the input's root, with "/": the output is <output>/<name>.out
    size: int
    version: str  # the ETag, else the modification time: what says the file changed

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "version": self.version}


@dataclass(slots=True)
class Record:
    index: int  # its position in its file, from 0
    line: int  # its line (from 1) in line-split input, else 0
    raw: bytes  # its bytes as read (a line without its end, a file); b"" for a row of an array or table
    value: Any = None  # a row's values: {name: array or value}, or one array (NPY)
    size: int = 0  # bytes counted toward --max-payload-mb


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
        version = str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or "")
        files.append(InputFile(path=name, name=relative, size=int(info.get("size") or 0), version=version))
    if not files:
        raise BatchUsageError(f"--input {uri}: no file there")
    return fs, files


def read_records(fs: fsspec.AbstractFileSystem, file: InputFile, options: BatchOptions) -> Iterator[Record]:
    """The records of `file`, in order."""
    form = options.format
    if form is Format.NPY or form is Format.NPZ:
        yield from _array_rows(fs, file, form)
    elif form is Format.PARQUET:
        yield from _parquet_rows(fs, file, options.columns)
    elif options.split is SplitType.LINE:
        yield from _lines(fs, file)
    else:
        with fs.open(file.path, "rb") as handle:
            data = handle.read()
        yield Record(index=0, line=0, raw=data, size=len(data))


def _lines(fs: fsspec.AbstractFileSystem, file: InputFile) -> Iterator[Record]:
    """One record per line that holds anything but white space (blank lines are skipped, their
    numbers kept: an error row names the line of the file)."""
    index = 0
    with fs.open(file.path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            stripped = line.rstrip(b"\r\n")
            if not stripped.strip():
                continue
            yield Record(index=index, line=number, raw=stripped, size=len(stripped))
            index += 1


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
        arrays = {name: loaded[name] for name in loaded.files}
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
        yield Record(index=index, line=0, raw=b"", value=row, size=sum(value.nbytes for value in row.values()))


def _parquet_rows(fs: fsspec.AbstractFileSystem, file: InputFile, columns: Mapping[str, str]) -> Iterator[Record]:
    import pyarrow.parquet as pq

    with fs.open(file.path, "rb") as handle:
        table = pq.ParquetFile(handle)
        names = table.schema_arrow.names
        missing = [column for column in columns if column not in names]
        if missing:
            raise BatchUsageError(f"{file.name}: no column {missing[0]!r}; its columns are {names}")
        wanted = list(columns) or None
        index = 0
        for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted):
            for row in batch.to_pylist():
                yield Record(index=index, line=0, raw=b"", value=row, size=_row_size(row))
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

"""The job's output location (a folder or fsspec URL) and what the job keeps there.

- `<name>.out`: an input file's output records, in input order, assembled once every shard of the
  file is done (SageMaker's name; a file's output is there whole or not at all). With `--accept`
  Parquet, `<name>.parquet` instead: a row group per shard, from the Arrow streams of its part
  (`Converter.encode`); the output folder is then a Parquet dataset (readers skip `_` files).
- `_parts/F/S.part`: shard S of input file F, written whole or not at all (a local file written
  beside, flushed and renamed; an object stored in one PUT). A part is the durable proof its
  shard finished: its first line is its header (the records it covers, its outputs, its record
  errors), the rest its output records. A rerun trusts the parts it finds and redoes the rest.
- `_manifest.json`: the job (model, options, each input's size and version) and the shards done;
  a rerun into the same output must be the same job.
- `_errors.jsonl`, `_summary.json`: written when the job ends; the parts are then removed.
"""

from __future__ import annotations

import io
import os
import struct
import uuid
from collections.abc import Callable, Iterable
from typing import IO, Any

import orjson
from fsspec.implementations.local import LocalFileSystem

from inferd.tools.batch.options import OUTPUT_SUFFIXES, OutputKind
from inferd.tools.batch.records import open_location

PARTS = "_parts"
MANIFEST = "_manifest.json"
ERRORS = "_errors.jsonl"
SUMMARY = "_summary.json"
COPY_CHUNK = 8 * 1024 * 1024


class OutputStore:
    def __init__(self, uri: str, kind: OutputKind = OutputKind.RECORDS) -> None:
        self.uri = uri
        self.kind = kind
        self.fs, path = open_location(uri)
        self.root = path.rstrip("/")
        self._local = isinstance(self.fs, LocalFileSystem)
        self.fs.makedirs(self.root, exist_ok=True)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def output_name(self, input_name: str) -> str:
        return f"{input_name}{OUTPUT_SUFFIXES[self.kind]}"

    # -- whole objects -------------------------------------------------------------------------

    def write(self, name: str, data: bytes) -> None:
        """`data` at `name`, whole or not at all."""
        target = self.path(name)
        if not self._local:
            self.fs.pipe_file(target, data)
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = f"{target}.{uuid.uuid4().hex[:8]}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)

    def read_json(self, name: str) -> Any | None:
        target = self.path(name)
        if not self.fs.exists(target):
            return None
        return orjson.loads(self.fs.cat_file(target))

    def write_json(self, name: str, document: Any) -> None:
        self.write(name, orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")

    # -- parts ---------------------------------------------------------------------------------

    @staticmethod
    def part_name(file_index: int, shard: int) -> str:
        return f"{PARTS}/{file_index:06d}/{shard:08d}.part"

    def write_part(self, file_index: int, shard: int, header: dict[str, Any], body: bytes) -> None:
        self.write(self.part_name(file_index, shard), orjson.dumps(header) + b"\n" + body)

    def parts_done(self) -> dict[int, set[int]]:
        """The shards whose parts exist, by input file."""
        folder = self.path(PARTS)
        if not self.fs.exists(folder):
            return {}
        done: dict[int, set[int]] = {}
        for found in self.fs.find(folder):
            parts = found[len(folder) :].strip("/").split("/")
            if len(parts) != 2 or not parts[1].endswith(".part"):
                continue  # a temporary file a crash left
            try:
                done.setdefault(int(parts[0]), set()).add(int(parts[1].removesuffix(".part")))
            except ValueError:
                continue
        return done

    def part_header(self, file_index: int, shard: int) -> dict[str, Any]:
        with self.fs.open(self.path(self.part_name(file_index, shard)), "rb") as handle:
            header: dict[str, Any] = orjson.loads(handle.readline())
        return header

    def assemble(self, file_index: int, shards: Iterable[int], output_name: str) -> int:
        """The output file of one input from its shards' parts, in order, whole or not at all;
        its size (-1: none written, for a Parquet output none of whose records was answered: a
        Parquet file needs a schema, which the answers give)."""
        parts = [self.path(self.part_name(file_index, shard)) for shard in shards]
        if self.kind is OutputKind.PARQUET and not any(self._has_body(path) for path in parts):
            return -1
        write = self._copy_records if self.kind is OutputKind.RECORDS else self._write_parquet
        target = self.path(output_name)
        folder, base = target.rsplit("/", 1)
        self.fs.makedirs(folder, exist_ok=True)
        temporary = target
        if self._local:
            # Beside its target, named as readers of a dataset skip (a dot first): a crash cannot
            # leave a file that `pq.read_table(output)` would take for part of the dataset.
            for stale in self.fs.glob(f"{folder}/.{base}.*.tmp"):
                self.fs.rm(stale)
            temporary = f"{folder}/.{base}.{uuid.uuid4().hex[:8]}.tmp"
        with self.fs.open(temporary, "wb") as out:
            write(out, parts)
            written = out.tell()
            if self._local:
                out.flush()
                os.fsync(out.fileno())
        if self._local:
            os.replace(temporary, target)
        return int(written)

    def _has_body(self, path: str) -> bool:
        with self.fs.open(path, "rb") as part:
            part.readline()
            return bool(part.read(1))

    def _copy_records(self, out: IO[bytes], parts: list[str]) -> None:
        for path in parts:
            with self.fs.open(path, "rb") as part:
                part.readline()
                while chunk := part.read(COPY_CHUNK):
                    out.write(chunk)

    def _write_parquet(self, out: IO[bytes], parts: list[str]) -> None:
        """One Parquet file: a row group per shard (a part's Arrow streams, one per mini-batch)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        writer: pq.ParquetWriter | None = None
        try:
            for path in parts:
                with self.fs.open(path, "rb") as part:
                    part.readline()
                    tables = list(read_frames(part.read(), lambda frame: pa.ipc.open_stream(frame).read_all()))
                if not tables:
                    continue  # a shard none of whose records was answered
                table = pa.concat_tables(tables)
                if writer is None:
                    writer = pq.ParquetWriter(out, table.schema)
                writer.write_table(table, row_group_size=max(1, table.num_rows))
        finally:
            if writer is not None:
                writer.close()

    def remove_parts(self) -> None:
        folder = self.path(PARTS)
        if self.fs.exists(folder):
            self.fs.rm(folder, recursive=True)


def same_location(a: str, b: str) -> bool:
    """Whether output `b` is input `a`, under it, or (when `a` is a prefix, neither a file nor a
    folder) begins with it: the input's listing would then read the output's files as input."""
    fs_a, path_a = open_location(a)
    fs_b, path_b = open_location(b)
    if type(fs_a) is not type(fs_b):
        return False
    path_a, path_b = path_a.rstrip("/"), path_b.rstrip("/")
    if path_b == path_a or path_b.startswith(path_a + "/"):
        return True
    return path_b.startswith(path_a) and not fs_a.isfile(path_a) and not fs_a.isdir(path_a)


def frame(data: bytes) -> bytes:
    """`data` with its length before it, so that frames joined one after another read back apart
    (a Parquet output's mini-batches, each an Arrow stream, in one part)."""
    return struct.pack("<Q", len(data)) + data


def read_frames(body: bytes, read: Callable[[bytes], Any]) -> Iterable[Any]:
    view = io.BytesIO(body)
    while header := view.read(8):
        (size,) = struct.unpack("<Q", header)
        yield read(view.read(size))

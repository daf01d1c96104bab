"""How a file's records become shards and mini-batches (pieces).

A shard is --shard-records consecutive records of one file: the unit a rerun resumes from. A
piece is a mini-batch of one shard: one record with SingleRecord, else as many as the model's
max_batch_size and --max-payload-mb allow (a record larger than the payload bound travels as that
piece's `oversized`, an error, never to the model). Pieces never cross a shard or a file. A
shard's end is announced with the number of its pieces, so whoever runs them knows when the
shard is done however the pieces finish. Shards an earlier run finished yield nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from inferd.tools.batch.records import Record, Records


@dataclass(frozen=True, slots=True)
class Piece:
    file_index: int
    shard: int
    seq: int  # its place in its shard
    records: Records
    oversized: list[Record]


@dataclass(frozen=True, slots=True)
class ShardEnd:
    file_index: int
    shard: int
    pieces: int  # how many pieces the shard was cut into


class PieceCutter:
    def __init__(
        self, file_index: int, done: frozenset[int], shard_records: int, max_records: int, limit: int | None
    ) -> None:
        """`done`: shards of the file finished by an earlier run; `max_records`: a piece's records
        at most; `limit`: a piece's bytes at most (None: no bound)."""
        self._file = file_index
        self._done = done
        self._shard_records = shard_records
        self._max_records = max_records
        self._limit = limit
        self._shard: int | None = None  # the shard being cut
        self._seq = 0
        self._pending: Records | None = None
        self._pending_bytes = 0
        self._pending_largest = 0
        self._oversized: list[Record] = []

    def add(self, chunk: Records) -> Iterator[Piece | ShardEnd]:
        """The pieces (and shard ends) `chunk`, the file's next records, completes."""
        position = 0
        while position < len(chunk):
            first = chunk.start + position
            shard = first // self._shard_records
            end = (shard + 1) * self._shard_records  # the index past the shard's last record
            part = chunk[position : position + min(len(chunk) - position, end - first)]
            position += len(part)
            if shard in self._done:
                continue
            self._shard = shard
            yield from self._cut(part)
            if part.start + len(part) == end:
                yield from self._end_shard()

    def end(self, records: int) -> Iterator[Piece | ShardEnd]:
        """What is left once the file's `records` are all added: its last shard's end (an empty
        file is one empty shard)."""
        if self._shard is not None:
            yield from self._end_shard()
        elif records == 0 and 0 not in self._done:
            yield ShardEnd(self._file, 0, 0)

    def _cut(self, part: Records) -> Iterator[Piece]:
        largest = max(part.sizes)
        limit = self._limit
        if limit is None or max(largest, self._pending_largest) * self._max_records <= limit:
            # No piece of max_records records can pass the bound: cut by count, a slice at a time.
            self._pending_largest = max(largest, self._pending_largest)
            start = 0
            if self._pending is not None:
                start = self._max_records - len(self._pending)
                self._pending = self._pending + part[:start]
                if len(self._pending) == self._max_records:
                    yield self._flush()
            while len(part) - start >= self._max_records:
                yield self._piece(part[start : start + self._max_records], [])
                start += self._max_records
            if start < len(part):
                self._pending = self._pending + part[start:] if self._pending is not None else part[start:]
            self._pending_bytes = sum(self._pending.sizes) if self._pending is not None else 0
            return
        for position, size in enumerate(part.sizes):
            if size > limit:
                self._oversized.append(part[position])
                continue
            if self._pending is not None and (
                len(self._pending) >= self._max_records or self._pending_bytes + size > limit
            ):
                yield self._flush()
            record = part[position : position + 1]
            self._pending = record if self._pending is None else self._pending + record
            self._pending_bytes += size
            self._pending_largest = max(self._pending_largest, size)

    def _flush(self) -> Piece:
        records = self._pending if self._pending is not None else Records(0, [], [])
        piece = self._piece(records, self._oversized)
        self._pending, self._pending_bytes, self._pending_largest, self._oversized = None, 0, 0, []
        return piece

    def _piece(self, records: Records, oversized: list[Record]) -> Piece:
        assert self._shard is not None
        piece = Piece(self._file, self._shard, self._seq, records, oversized)
        self._seq += 1
        return piece

    def _end_shard(self) -> Iterator[Piece | ShardEnd]:
        assert self._shard is not None
        if self._pending is not None or self._oversized:
            yield self._flush()
        yield ShardEnd(self._file, self._shard, self._seq)
        self._shard, self._seq = None, 0

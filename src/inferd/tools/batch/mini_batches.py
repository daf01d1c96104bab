"""One mini-batch (a piece) of a batch job, start to end, on any engine: the one way a piece runs,
whether the job's driver runs it (the local and server engines) or a Ray actor does.

The piece's records are decoded into groups (`convert`); each group is sent to the engine under
--invocations-timeout-seconds. A group that times out or finds the engine unavailable is tried
again (--invocations-max-retries, with backoff), then its records are errors; one the model
refuses is split in halves until the records it refuses are found, so one bad record costs only
itself. The answers are encoded into output records, in input order.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.errors import InferdError, UnavailableError
from inferd.tools.batch.convert import Converter, Group, RecordError
from inferd.tools.batch.engines import Engine
from inferd.tools.batch.options import BatchOptions
from inferd.tools.batch.pieces import Piece
from inferd.tools.batch.records import positions

RETRY_BACKOFF_S = (0.1, 0.5, 2.0, 5.0)


@dataclass
class Phases:
    """Where a job's time went (seconds; the engine's is summed over concurrent mini-batches)."""

    read_s: float = 0.0
    decode_s: float = 0.0
    infer_s: float = 0.0
    encode_s: float = 0.0
    write_s: float = 0.0

    def add(self, other: Phases) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class PieceResult:
    body: bytes  # the output records, in input order (failed records left out)
    outputs: int
    errors: list[RecordError] = field(default_factory=list)
    records: int = 0


class MiniBatches:
    def __init__(self, options: BatchOptions, engine: Engine, phases: Phases) -> None:
        self._options = options
        self._engine = engine
        self._phases = phases
        self.converter = Converter(options, engine.signature, engine.max_batch_size)

    async def run(self, piece: Piece, file_name: str) -> PieceResult:
        """`piece` of the file named `file_name` (its records' keys, when the engine routes them
        to an endpoint's variants, are the file's name and their positions)."""
        started = time.perf_counter()
        groups, errors = self.converter.decode(piece.records)
        limit = self._options.max_payload_mb
        errors += [
            RecordError(record, f"the record is {record.size} bytes, more than --max-payload-mb {limit:g}", "TOO_LARGE")
            for record in piece.oversized
        ]
        self._phases.decode_s += time.perf_counter() - started
        blobs: list[bytes] = []
        outputs = 0
        for group in groups:
            outputs += await self._run_group(group, blobs, errors, file_name)
        return PieceResult(b"".join(blobs), outputs, errors, len(piece.records) + len(piece.oversized))

    async def _run_group(self, group: Group, blobs: list[bytes], errors: list[RecordError], file_name: str) -> int:
        """Run `group`, its output records appended to `blobs` and its failures to `errors`; how
        many records it wrote."""
        timeout = self._options.invocations_timeout_s
        outputs: Any = None
        for attempt in itertools.count(1):
            started = time.perf_counter()
            try:
                keys = _keys(group, file_name) if self._engine.routes_records else None
                async with asyncio.timeout(timeout):
                    outputs = await self._engine.infer(group.inputs, self._options.outputs, timeout, keys)
            except (TimeoutError, UnavailableError) as exc:
                self._phases.infer_s += time.perf_counter() - started
                if attempt > self._options.invocations_max_retries:
                    why = f"timed out after {timeout:g} s" if isinstance(exc, TimeoutError) else exc.message
                    code = "TIMEOUT" if isinstance(exc, TimeoutError) else exc.code.value
                    tries = "try" if attempt == 1 else "tries"
                    errors.extend(RecordError(r, f"{why} ({attempt} {tries})", code) for r in group.records)
                    return 0
                await asyncio.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S)) - 1])
                continue
            except InferdError as exc:
                self._phases.infer_s += time.perf_counter() - started
                if len(group.records) == 1:
                    errors.append(RecordError(group.records[0], exc.message, exc.code.value))
                    return 0
                written = 0
                for half in _halves(group):  # find the records the model refuses
                    written += await self._run_group(half, blobs, errors, file_name)
                return written
            self._phases.infer_s += time.perf_counter() - started
            break
        started = time.perf_counter()
        try:
            blob, failed = self.converter.encode(group, outputs, file_name)
        except InferdError as exc:
            errors.extend(RecordError(r, exc.message, exc.code.value) for r in group.records)
            return 0
        finally:
            self._phases.encode_s += time.perf_counter() - started
        errors.extend(failed)
        blobs.append(blob)
        return len(group.records) - len(failed)


def _keys(group: Group, file_name: str) -> list[str]:
    """Each record's key: its file's name and its position, the same on every run and engine."""
    return [f"{file_name}:{index}" for index in positions(group.records)]


def _halves(group: Group) -> list[Group]:
    middle = len(group.records) // 2
    return [
        Group(
            group.records[part],
            tuple(type(t)(t.name, t.datatype, t.data[part].shape, t.data[part]) for t in group.inputs),
            group.sources[part],
        )
        for part in (slice(0, middle), slice(middle, None))
    ]


def error_row(error: RecordError) -> dict[str, Any]:
    """A record's error as the part's header and `_errors.jsonl` keep it."""
    row: dict[str, Any] = {"record": error.record.index}
    if error.record.line:
        row["line"] = error.record.line
    row.update(error=error.reason, code=error.code)
    return row


def shard_part(file_name: str, shard: int, results: Sequence[PieceResult]) -> tuple[dict[str, Any], bytes]:
    """A finished shard's part (`store`): its header (the records it covers, its outputs, its
    record errors in order) and its body (the output records of its pieces, in order)."""
    errors = sorted((error for result in results for error in result.errors), key=lambda error: error.record.index)
    header = {
        "file": file_name,
        "shard": shard,
        "records": sum(result.records for result in results),
        "outputs": sum(result.outputs for result in results),
        "errors": [error_row(error) for error in errors],
    }
    return header, b"".join(result.body for result in results)

"""What a batch job is asked to do: its knobs under SageMaker's names, checked together once.

`BatchOptions` is the whole request; `identity()` is the part that decides what the output holds,
which the manifest keeps so that a rerun into the same output is the same job (the engine, the
concurrency, the timeouts and the error budget may change between runs: they change how the job
runs, not what it writes).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class BatchUsageError(ValueError):
    """The job was asked something it cannot do (exit 2, before any work)."""


class Format(enum.StrEnum):
    """How an input file holds its records (chosen by --content-type)."""

    JSON_LINES = "jsonlines"  # a JSON value per line
    JSON = "json"  # one JSON document per file (or per line, split by line)
    CSV = "csv"  # a row of values per line
    NPY = "npy"  # an array per file: its first axis the records
    NPZ = "npz"  # arrays named as the inputs, their first axis the records
    PARQUET = "parquet"  # a table: its rows the records, --columns naming the inputs
    TEXT = "text"  # a text per file (or per line): a BYTES input
    RAW = "raw"  # a file's bytes, one record: a BYTES input (images, audio, documents)


# --content-type values, as SageMaker and the usual MIME registries name them.
CONTENT_TYPES: Mapping[str, Format] = {
    "application/jsonlines": Format.JSON_LINES,
    "application/x-jsonlines": Format.JSON_LINES,
    "application/jsonl": Format.JSON_LINES,
    "application/json": Format.JSON,
    "text/csv": Format.CSV,
    "application/x-npy": Format.NPY,
    "application/x-npz": Format.NPZ,
    "application/vnd.apache.parquet": Format.PARQUET,
    "application/x-parquet": Format.PARQUET,
    "text/plain": Format.TEXT,
    "application/octet-stream": Format.RAW,
}


class OutputKind(enum.StrEnum):
    """What the job writes for each input file (chosen by --accept)."""

    RECORDS = "records"  # <input>.out: an output record per input record (JSON, or CSV for CSV input)
    PARQUET = "parquet"  # <input>.parquet: a row per answered record, a column per output


# --accept values: SageMaker's TransformOutput Accept. "" (the default) writes the answers as the
# records came (JSON Lines, CSV for CSV input).
ACCEPT_TYPES: Mapping[str, OutputKind] = {
    "": OutputKind.RECORDS,
    "application/vnd.apache.parquet": OutputKind.PARQUET,
    "application/x-parquet": OutputKind.PARQUET,
}
OUTPUT_SUFFIXES: Mapping[OutputKind, str] = {OutputKind.RECORDS: ".out", OutputKind.PARQUET: ".parquet"}
# A Parquet output's columns of each row's input: its file (as --input names it) and its record
# (its position in that file).
FILE_COLUMN = "file"
RECORD_COLUMN = "record"


def format_of(content_type: str) -> Format:
    """The format a --content-type names; any other `type/subtype` (image/jpeg, audio/wav, ...) is
    a raw file sent as it is."""
    lowered = content_type.strip().lower().split(";")[0].strip()
    if lowered in CONTENT_TYPES:
        return CONTENT_TYPES[lowered]
    if lowered.count("/") == 1 and all(lowered.split("/")):
        return Format.RAW
    raise BatchUsageError(f"--content-type {content_type!r} is not a MIME type; known: {', '.join(CONTENT_TYPES)}")


class SplitType(enum.StrEnum):
    NONE = "None"  # a file is one record
    LINE = "Line"  # a line is one record


class BatchStrategy(enum.StrEnum):
    SINGLE_RECORD = "SingleRecord"
    MULTI_RECORD = "MultiRecord"


class AssembleWith(enum.StrEnum):
    NONE = "None"  # output records written one after another
    LINE = "Line"  # each output record ends with a newline


class JoinSource(enum.StrEnum):
    NONE = "None"
    INPUT = "Input"  # each output beside its input record


# Formats whose records are rows of a file (the split is theirs, not a knob).
ROW_FORMATS = frozenset({Format.NPY, Format.NPZ, Format.PARQUET})
# Formats SageMaker's data processing (filters, join) reads: JSON and CSV.
FILTERABLE = frozenset({Format.JSON_LINES, Format.JSON, Format.CSV})
MEGABYTE = 1024 * 1024


@dataclass(frozen=True)
class BatchOptions:
    model: str
    input: str
    output: str
    model_version: str = ""
    content_type: str = "application/jsonlines"
    accept: str = ""
    split_type: SplitType | None = None  # None: the format's own (Line for JSON Lines and CSV)
    batch_strategy: BatchStrategy = BatchStrategy.MULTI_RECORD
    max_payload_mb: float = 6.0
    max_concurrent_transforms: int = 4
    assemble_with: AssembleWith = AssembleWith.LINE
    input_filter: str = "$"
    output_filter: str = "$"
    join_source: JoinSource = JoinSource.NONE
    invocations_timeout_s: float = 600.0
    invocations_max_retries: int = 3
    max_error_rate: float = 0.01
    # The outputs to compute and write, in this order; empty: every output of the model.
    outputs: tuple[str, ...] = ()
    # Parquet column -> model input; empty: each input read from the column of its name.
    columns: Mapping[str, str] = field(default_factory=dict)
    shard_records: int = 10_000
    # Endpoints as `inferd serve --endpoints FILE` declares them (name -> the document core keeps
    # of it): a model named here is an endpoint, each record going to the variant its key chooses.
    endpoints: Mapping[str, Any] = field(default_factory=dict)

    @property
    def format(self) -> Format:
        return format_of(self.content_type)

    @property
    def output_kind(self) -> OutputKind:
        kind = ACCEPT_TYPES.get(self.accept.strip().lower())
        if kind is None:
            known = ", ".join(name for name in ACCEPT_TYPES if name)
            raise BatchUsageError(f"--accept {self.accept!r}: inferd batch writes {known}")
        return kind

    @property
    def split(self) -> SplitType:
        """The split in effect: the one asked, else Line for JSON Lines and CSV, None otherwise."""
        if self.split_type is not None:
            return self.split_type
        return SplitType.LINE if self.format in (Format.JSON_LINES, Format.CSV) else SplitType.NONE

    @property
    def max_payload_bytes(self) -> int | None:
        """A mini-batch's bound in bytes of its records; None: no bound (--max-payload-mb 0)."""
        return int(self.max_payload_mb * MEGABYTE) if self.max_payload_mb > 0 else None

    def check(self) -> None:
        """Raise BatchUsageError for what cannot be asked together."""
        form = self.format
        if self.split_type is not None and form in ROW_FORMATS:
            raise BatchUsageError(f"--split-type does not apply to {form.value} input: its records are its rows")
        if self.split is SplitType.NONE and form in (Format.JSON_LINES, Format.CSV):
            raise BatchUsageError(f"{self.content_type} input is split by line: --split-type None does not apply")
        if form not in FILTERABLE and (
            self.input_filter != "$" or self.output_filter != "$" or self.join_source is JoinSource.INPUT
        ):
            raise BatchUsageError(
                "--input-filter, --output-filter and --join-source apply to JSON and CSV input only "
                f"(as SageMaker's data processing), not {self.content_type}"
            )
        if self.output_kind is OutputKind.PARQUET and (
            self.output_filter != "$" or self.join_source is JoinSource.INPUT or self.assemble_with is AssembleWith.NONE
        ):
            raise BatchUsageError(
                "--output-filter, --join-source and --assemble-with shape output records: a Parquet output "
                "has a column per output instead (and a record column to join on)"
            )
        if self.columns and form is not Format.PARQUET:
            raise BatchUsageError("--columns applies to Parquet input only")
        if self.max_payload_mb < 0:
            raise BatchUsageError("--max-payload-mb must be 0 (no bound) or more")
        if self.max_concurrent_transforms < 1:
            raise BatchUsageError("--max-concurrent-transforms must be at least 1")
        if not self.invocations_timeout_s > 0:
            raise BatchUsageError("--invocations-timeout-seconds must be more than 0")
        if self.invocations_max_retries < 0:
            raise BatchUsageError("--invocations-max-retries must be 0 or more")
        if not 0 <= self.max_error_rate <= 1:
            raise BatchUsageError("--max-error-rate must be between 0 and 1")
        if self.shard_records < 1:
            raise BatchUsageError("--shard-records must be at least 1")

    def identity(self) -> dict[str, Any]:
        """What decides the output's bytes: kept in the manifest, compared by a rerun."""
        return {
            "model": self.model,
            "model_version": self.model_version,
            "content_type": self.content_type,
            "split_type": self.split.value,
            "batch_strategy": self.batch_strategy.value,
            "max_payload_mb": self.max_payload_mb,
            "assemble_with": self.assemble_with.value,
            "input_filter": self.input_filter,
            "output_filter": self.output_filter,
            "join_source": self.join_source.value,
            "columns": dict(self.columns),
            "outputs": list(self.outputs),
            "endpoint": self.endpoints.get(self.model),
            "shard_records": self.shard_records,
            # Only when it is not the default, so that manifests written before --accept still match.
            **({"accept": self.output_kind.value} if self.output_kind is not OutputKind.RECORDS else {}),
        }

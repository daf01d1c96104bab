"""How a batch job shows itself: a rich progress display while it runs (records, records/s,
errors, the input read with its ETA) and a table of its summary at the end."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from inferd.tools.batch import run
from inferd.tools.batch.records import InputFile


class RichProgress(run.Progress):
    def __init__(self, console: Console) -> None:
        self._console = console
        self._records = 0
        self._errors = 0
        self._started = time.perf_counter()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%"),
            TextColumn(
                "{task.fields[records]:>10,} records  {task.fields[rate]:>9,.0f}/s  {task.fields[errors]:,} errors"
            ),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None

    def start(self, files: Sequence[InputFile], total_bytes: int) -> None:
        self._started = time.perf_counter()
        self._task = self._progress.add_task(
            f"{len(files)} file{'s' if len(files) != 1 else ''}",
            total=max(total_bytes, 1),
            records=0,
            rate=0.0,
            errors=0,
        )
        self._progress.start()

    def advance(self, records: int, errors: int) -> None:
        self._records += records
        self._errors += errors
        if self._task is not None:
            elapsed = max(time.perf_counter() - self._started, 1e-9)
            self._progress.update(self._task, records=self._records, rate=self._records / elapsed, errors=self._errors)

    def read(self, read_bytes: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=read_bytes)

    def stop(self) -> None:
        self._progress.stop()


def summary_table(summary: run.Summary, output: str) -> Table:
    table = Table(title=f"inferd batch: {summary.status}", show_header=False)
    table.add_column("measure", style="bold")
    table.add_column("value", justify="right")
    table.add_row("records", f"{summary.records:,}")
    table.add_row("outputs", f"{summary.outputs:,}")
    table.add_row("errors", f"{summary.errors:,} ({summary.error_rate:.3%}; budget {summary.error_budget:.3%})")
    table.add_row("files done", f"{summary.files_done} of {summary.files}")
    table.add_row("shards", f"{summary.shards_run} run, {summary.shards_found} found done")
    table.add_row("time", f"{summary.wall_s:.2f} s")
    table.add_row("throughput", f"{summary.records_per_s:,.0f} records/s")
    phases = summary.phases
    for name, seconds in (
        ("read", phases.read_s),
        ("decode", phases.decode_s),
        ("infer (summed)", phases.infer_s),
        ("encode", phases.encode_s),
        ("write", phases.write_s),
    ):
        table.add_row(f"  {name}", f"{seconds:.2f} s")
    table.add_row("output", output)
    if summary.reason:
        table.add_row("why", summary.reason)
    return table

"""How `inferd perf` shows its figures: a rich table (live while it measures), CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from inferd.tools.perf.measure import PERCENTILES, PerfReport, StepResult, WindowCallback, as_json

CSV_COLUMNS = (
    "mode", "load", "throughput_infer_per_s", "request_rate", "send_rate", "latency_avg_ms",
    *(f"latency_p{p}_ms" for p in PERCENTILES),
    "requests", "errors", "windows", "stable",
    "server_queue_us", "server_compute_input_us", "server_compute_infer_us", "server_compute_output_us",
    "server_batch_size",
)  # fmt: skip


def steps_table(steps: list[StepResult], title: str = "") -> Table:
    mode = steps[0].mode if steps else "concurrency"
    table = Table(title=title or None, title_justify="left")
    table.add_column("concurrency" if mode == "concurrency" else "rate /s", justify="right")
    for name in ("infer/s", "avg ms", *(f"p{p} ms" for p in PERCENTILES), "errors", "queue ms", "compute ms", "batch"):
        table.add_column(name, justify="right")
    table.add_column("stable")
    for step in steps:
        server = step.server
        table.add_row(
            f"{step.load:g}",
            f"{step.throughput:,.1f}",
            f"{step.latency_avg_ms:.2f}",
            *(f"{step.latency_ms[p]:.2f}" for p in PERCENTILES),
            ", ".join(f"{code} {count}" for code, count in sorted(step.errors.items())) or "0",
            f"{server.queue_us / 1000:.2f}" if server else "-",
            f"{(server.compute_input_us + server.compute_infer_us + server.compute_output_us) / 1000:.2f}"
            if server
            else "-",
            f"{server.batch_size:.2f}" if server else "-",
            "yes" if step.stable else "no",
        )
    return table


def summary(report: PerfReport) -> Text:
    errors = sum(report.client_errors.values())
    return Text(
        f"{report.client_requests} requests succeeded ({errors} failed) as the client counts them; "
        f"the server counted {report.server_requests} ({report.server_inferences} inferences)."
    )


def as_csv(report: PerfReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for s in report.steps:
        server = s.server
        writer.writerow(
            [
                s.mode, s.load, round(s.throughput, 3), round(s.request_rate, 3), round(s.send_rate, 3),
                round(s.latency_avg_ms, 4), *(round(s.latency_ms[p], 4) for p in PERCENTILES),
                s.requests, sum(s.errors.values()), s.windows, s.stable,
                *(
                    (round(server.queue_us, 2), round(server.compute_input_us, 2), round(server.compute_infer_us, 2),
                     round(server.compute_output_us, 2), round(server.batch_size, 3))
                    if server else ("", "", "", "", "")
                ),
            ]
        )  # fmt: skip
    return out.getvalue()


def as_json_text(report: PerfReport) -> str:
    return json.dumps(as_json(report), indent=2)


@contextmanager
def live_display(console: Console, title: str) -> Iterator[WindowCallback]:
    """A live view while measuring: the loads done, and the one being measured, window by window."""
    done: list[StepResult] = []
    current: list[StepResult] = []
    status = Text("starting the load...")

    def view() -> Group:
        return Group(steps_table(done + current, title), status)

    with Live(view(), console=console, refresh_per_second=4, transient=True) as live:

        def on_window(load: float, window: int, step: StepResult) -> None:
            if current and current[0].load != load:
                done.append(current.pop())
            current[:] = [step]
            state = "stable" if step.stable else "not stable yet"
            status.plain = f"load {load:g}: window {window}, {step.throughput:,.1f} infer/s, {state}"
            live.update(view())

        yield on_window

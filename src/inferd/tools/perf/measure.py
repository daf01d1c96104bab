"""`run_perf`: a sweep of loads, each measured in windows until stable, as perf_analyzer measures.

Per load: the workers start; every `measurement_interval_s` the parent collects what completed (a
window) and reads the server's statistics; once the last three windows agree within
`stability_percentage` (throughput and latency: the average, or `percentile` when given) the
load's figures are those three windows merged, else after `max_trials` windows the last three,
marked unstable. The server's side of the same three windows (queue, compute, batch size) comes
from the difference of its statistics before and after them. Between loads the workers drain, so
the run's counts can be checked against the server's: every request sent is counted once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inferd.client import Client, ClientTls
from inferd.tools.inputs import file_samples, request_shapes, synthetic_samples
from inferd.tools.perf.load import Completed, Distribution, LoadGenerator, Mode, Target
from inferd.types import ModelStatistics

PERCENTILES = (50, 90, 95, 99)
STABLE_WINDOWS = 3


@dataclass(frozen=True, slots=True)
class PerfSettings:
    url: str
    model: str
    version: str = ""
    binary: bool = True
    mode: Mode = "concurrency"
    loads: tuple[float, ...] = (1,)
    """Concurrencies, or request rates (per second), in the order measured."""
    distribution: Distribution = "constant"
    batch_size: int = 1
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: str = "random"
    """zero, random, or the path of a .json (perf_analyzer's format) or .npz file."""
    measurement_interval_s: float = 5.0
    stability_percentage: float = 10.0
    max_trials: int = 10
    percentile: int | None = None
    """Judge stability (and the latency limit) on this percentile instead of the average."""
    latency_limit_ms: float | None = None
    """Stop the sweep after the first load whose latency is over this."""
    processes: int = 1
    timeout_s: float = 30.0
    tls: ClientTls | None = None
    """The CA (and client certificate) for an https:// or grpcs:// url."""
    token: str | None = None
    """A bearer token sent with every call."""


@dataclass(frozen=True, slots=True)
class ServerSide:
    """The server's view of a load's windows (statistics extension): per-request averages in µs."""

    requests: int
    inferences: int
    executions: int
    request_us: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float

    @property
    def batch_size(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0


@dataclass(frozen=True, slots=True)
class StepResult:
    mode: Mode
    load: float
    throughput: float
    """Inferences a second (requests times the batch size), as perf_analyzer counts them."""
    request_rate: float
    send_rate: float
    latency_avg_ms: float
    latency_ms: dict[int, float]
    """Percentile → latency of the successful requests."""
    requests: int
    errors: dict[str, int]
    windows: int
    stable: bool
    server: ServerSide | None

    def stability_latency_ms(self, percentile: int | None) -> float:
        return self.latency_ms[percentile] if percentile else self.latency_avg_ms


@dataclass(frozen=True, slots=True)
class PerfReport:
    model: str
    url: str
    batch_size: int
    steps: list[StepResult]
    client_requests: int
    """Successful requests over the whole run (every window, and the drains between loads)."""
    client_errors: dict[str, int]
    server_requests: int
    """The server's successful requests for the model over the same run (statistics extension)."""
    server_inferences: int


WindowCallback = Callable[[float, int, StepResult], None]


def run_perf(settings: PerfSettings, on_window: WindowCallback | None = None) -> PerfReport:
    """Measure each load of `settings` in turn. `on_window(load, window, figures so far)` is called
    after each window (the live display)."""
    with Client(
        settings.url, binary=settings.binary, timeout_s=settings.timeout_s, tls=settings.tls, token=settings.token
    ) as client:
        metadata = client.model_metadata(settings.model, settings.version)
        max_batch_size = int(client.model_config(settings.model, settings.version).get("max_batch_size", 0))
        shapes = request_shapes(metadata, max_batch_size, settings.batch_size, settings.shapes)
        if settings.input_data in ("zero", "random"):
            samples = synthetic_samples(metadata, shapes, settings.input_data)
        else:
            samples = file_samples(Path(settings.input_data), metadata, shapes)
        target = Target(
            settings.url,
            settings.model,
            settings.version,
            samples,
            settings.binary,
            (),
            settings.timeout_s,
            tls=settings.tls,
            token=settings.token,
        )

        def statistics() -> list[ModelStatistics]:
            return client.statistics(settings.model, settings.version)

        first = statistics()
        steps: list[StepResult] = []
        total = Completed()
        with LoadGenerator(target, settings.processes) as generator:
            for load in settings.loads:
                step, completed = _measure_load(generator, settings, load, statistics, on_window)
                steps.append(step)
                total = total.merged(completed)
                if (
                    settings.latency_limit_ms
                    and step.stability_latency_ms(settings.percentile) > settings.latency_limit_ms
                ):
                    break
        server = _server_side(first, statistics())
    return PerfReport(
        model=settings.model,
        url=settings.url,
        batch_size=settings.batch_size,
        steps=steps,
        client_requests=len(total.latencies_s),
        client_errors=dict(total.errors),
        server_requests=server.requests,
        server_inferences=server.inferences,
    )


def _measure_load(
    generator: LoadGenerator,
    settings: PerfSettings,
    load: float,
    statistics: Callable[[], list[ModelStatistics]],
    on_window: WindowCallback | None,
) -> tuple[StepResult, Completed]:
    """One load's windows until stable; and everything that completed under it (for the totals)."""
    generator.start(settings.mode, load, settings.distribution)
    everything = Completed()
    windows: list[tuple[Completed, float]] = []
    snapshots = [statistics()]
    started = time.monotonic()
    step: StepResult | None = None
    for trial in range(max(1, settings.max_trials)):
        time.sleep(max(0.0, started + settings.measurement_interval_s - time.monotonic()))
        completed = generator.collect()
        ended = time.monotonic()
        snapshots.append(statistics())
        windows.append((completed, ended - started))
        everything = everything.merged(completed)
        started = ended
        recent = windows[-STABLE_WINDOWS:]
        stable = len(recent) == STABLE_WINDOWS and _agree(
            [_figures(settings, load, [w]) for w in recent], settings.stability_percentage, settings.percentile
        )
        step = _figures(settings, load, recent, stable, _server_side(snapshots[-len(recent) - 1], snapshots[-1]))
        if on_window is not None:
            on_window(load, trial + 1, step)
        if stable:
            break
    everything = everything.merged(generator.stop())
    assert step is not None
    return step, everything


def _figures(
    settings: PerfSettings,
    load: float,
    windows: Sequence[tuple[Completed, float]],
    stable: bool = False,
    server: ServerSide | None = None,
) -> StepResult:
    merged = Completed()
    for completed, _ in windows:
        merged = merged.merged(completed)
    seconds = sum(duration for _, duration in windows) or 1e-9
    latencies_ms = merged.latencies_s * 1000
    ok = len(latencies_ms)
    return StepResult(
        mode=settings.mode,
        load=load,
        throughput=ok * settings.batch_size / seconds,
        request_rate=ok / seconds,
        send_rate=merged.sent / seconds,
        latency_avg_ms=float(latencies_ms.mean()) if ok else 0.0,
        latency_ms={p: float(np.percentile(latencies_ms, p)) if ok else 0.0 for p in PERCENTILES},
        requests=ok,
        errors=dict(merged.errors),
        windows=len(windows),
        stable=stable,
        server=server,
    )


def _agree(steps: list[StepResult], percentage: float, percentile: int | None) -> bool:
    """Whether every window's throughput and latency is within `percentage` of their mean."""

    def within(values: list[float]) -> bool:
        mean = sum(values) / len(values)
        return mean > 0 and all(abs(v - mean) <= mean * percentage / 100 for v in values)

    return within([s.throughput for s in steps]) and within([s.stability_latency_ms(percentile) for s in steps])


def _server_side(before: list[ModelStatistics], after: list[ModelStatistics]) -> ServerSide:
    """What the server did between two statistics readings, summed over the model's versions."""
    totals: Counter[str] = Counter()
    for sign, statistics in ((-1, before), (1, after)):
        for s in statistics:
            totals["requests"] += sign * s.success.count
            totals["request_ns"] += sign * s.success.ns
            totals["inferences"] += sign * s.inference_count
            totals["executions"] += sign * s.execution_count
            for name in ("queue", "compute_input", "compute_infer", "compute_output"):
                totals[f"{name}_ns"] += sign * getattr(s, name).ns
    requests = totals["requests"]

    def per_request_us(key: str) -> float:
        return totals[key] / requests / 1000 if requests else 0.0

    return ServerSide(
        requests=requests,
        inferences=totals["inferences"],
        executions=totals["executions"],
        request_us=per_request_us("request_ns"),
        queue_us=per_request_us("queue_ns"),
        compute_input_us=per_request_us("compute_input_ns"),
        compute_infer_us=per_request_us("compute_infer_ns"),
        compute_output_us=per_request_us("compute_output_ns"),
    )


def as_json(report: PerfReport) -> dict[str, Any]:
    """The report as plain JSON data (`--output json`)."""
    from dataclasses import asdict

    document = asdict(report)
    for step, raw in zip(report.steps, document["steps"], strict=True):
        raw["latency_ms"] = {f"p{p}": v for p, v in step.latency_ms.items()}
        if step.server is not None:
            raw["server"]["batch_size"] = step.server.batch_size
    return document

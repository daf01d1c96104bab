"""Cumulative per-version counts and durations, as Triton's statistics extension reports them
(`GET /v2/models/{m}/stats`, gRPC ModelStatistics), so perf_analyzer can print the server's side."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inferd.types import BatchStatistics, DurationStatistic, ModelStatistics, RequestTiming


@dataclass(slots=True)
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def frozen(self) -> DurationStatistic:
        return DurationStatistic(count=self.count, ns=self.ns)


@dataclass(slots=True)
class _Batch:
    compute_infer: _Duration = field(default_factory=_Duration)


@dataclass(slots=True)
class _Version:
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: _Duration = field(default_factory=_Duration)
    fail: _Duration = field(default_factory=_Duration)
    queue: _Duration = field(default_factory=_Duration)
    compute_input: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    compute_output: _Duration = field(default_factory=_Duration)
    batches: dict[int, _Batch] = field(default_factory=dict)


class StatisticsCollector:
    """A `Metrics` sink. NOTE: called only from the event loop thread, so no locking."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str], _Version] = {}

    def request_finished(
        self, model: str, version: str, outcome: str, duration_s: float, rows: int, timing: RequestTiming
    ) -> None:
        if not version:
            return  # never reached a model version: nothing to count against one
        stats = self._version(model, version)
        if outcome != "success":
            stats.fail.add(duration_s)
            return
        stats.success.add(duration_s)
        stats.queue.add(timing.queue_s + timing.batch_wait_s)
        stats.compute_input.add(timing.compute_input_s)
        stats.compute_infer.add(timing.compute_infer_s)
        stats.compute_output.add(timing.compute_output_s)
        stats.inference_count += rows
        stats.last_inference_ms = int(time.time() * 1000)

    def response_encoded(self, model: str, version: str, encode_s: float) -> None:
        return None

    def batch_executed(self, model: str, version: str, rows: int, compute_infer_s: float) -> None:
        stats = self._version(model, version)
        stats.execution_count += 1
        stats.batches.setdefault(rows, _Batch()).compute_infer.add(compute_infer_s)

    def snapshot(self, model: str, version: str) -> ModelStatistics:
        stats = self._versions.get((model, version)) or _Version()
        return ModelStatistics(
            name=model,
            version=version,
            last_inference_ms=stats.last_inference_ms,
            inference_count=stats.inference_count,
            execution_count=stats.execution_count,
            success=stats.success.frozen(),
            fail=stats.fail.frozen(),
            queue=stats.queue.frozen(),
            compute_input=stats.compute_input.frozen(),
            compute_infer=stats.compute_infer.frozen(),
            compute_output=stats.compute_output.frozen(),
            batches=tuple(
                BatchStatistics(
                    batch_size=size,
                    compute_input=DurationStatistic(),
                    compute_infer=batch.compute_infer.frozen(),
                    compute_output=DurationStatistic(),
                )
                for size, batch in sorted(stats.batches.items())
            ),
        )

    def _version(self, model: str, version: str) -> _Version:
        key = (model, version)
        stats = self._versions.get(key)
        if stats is None:
            stats = self._versions[key] = _Version()
        return stats

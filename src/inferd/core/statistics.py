"""What inferd counts about its work, per model version, recorded once per event and read at
leisure: Triton's statistics extension (`GET /v2/models/{m}/stats`, gRPC ModelStatistics) and the
Prometheus exposition (`server.prometheus`) are both views of these numbers.

Recording an event appends one tuple to a deque (thread-safe, no lock): on a small model the
eight histograms of a request, observed one by one, cost more than its inference. The events are
folded into the numbers in bulk, with numpy, whenever they are read and every FOLD_EVERY events,
under a lock, so a scrape on another thread sees every event recorded before it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.types import BatchStatistics, DurationStatistic, ModelStatistics, RequestTiming

# Latency buckets from 100 us to 10 s: tiny models answer in well under a millisecond.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Events recorded before they are folded in even if nobody reads (bounds the memory they hold).
FOLD_EVERY = 2048


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    # One count per bound and one for +Inf; not cumulative.
    counts: list[int]
    total: float = 0.0

    @classmethod
    def with_bounds(cls, bounds: tuple[float, ...]) -> Histogram:
        return cls(bounds, [0] * (len(bounds) + 1))

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe_many(self, values: np.ndarray[Any, Any]) -> None:
        # Buckets are "less than or equal" (Prometheus' `le`): the first bound >= value.
        buckets = np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.counts))
        for index, count in enumerate(buckets.tolist()):
            self.counts[index] += count
        self.total += float(values.sum())

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total)


def _latency() -> Histogram:
    return Histogram.with_bounds(LATENCY_BUCKETS_S)


@dataclass(slots=True)
class VersionStatistics:
    """Everything counted for one model version."""

    # outcome ("success" or an ErrorCode value) -> requests finished with it
    outcomes: dict[str, int] = field(default_factory=dict)
    # Successful requests, from the start of decoding to a result; and that time split.
    duration: Histogram = field(default_factory=_latency)
    decode: Histogram = field(default_factory=_latency)
    queue: Histogram = field(default_factory=_latency)
    batch_wait: Histogram = field(default_factory=_latency)
    compute: Histogram = field(default_factory=_latency)
    encode: Histogram = field(default_factory=_latency)
    compute_input_s: float = 0.0
    compute_infer_s: float = 0.0
    compute_output_s: float = 0.0
    failed_s: float = 0.0
    inference_count: int = 0
    last_inference_ms: int = 0
    # Executions of the model, by rows, and their durations.
    batch_size: Histogram = field(default_factory=lambda: Histogram.with_bounds(BATCH_SIZE_BUCKETS))
    execution: Histogram = field(default_factory=_latency)
    # rows -> [executions, seconds]
    batches: dict[int, list[float]] = field(default_factory=dict)

    def copy(self) -> VersionStatistics:
        return VersionStatistics(
            outcomes=dict(self.outcomes),
            duration=self.duration.copy(),
            decode=self.decode.copy(),
            queue=self.queue.copy(),
            batch_wait=self.batch_wait.copy(),
            compute=self.compute.copy(),
            encode=self.encode.copy(),
            compute_input_s=self.compute_input_s,
            compute_infer_s=self.compute_infer_s,
            compute_output_s=self.compute_output_s,
            failed_s=self.failed_s,
            inference_count=self.inference_count,
            last_inference_ms=self.last_inference_ms,
            batch_size=self.batch_size.copy(),
            execution=self.execution.copy(),
            batches={rows: list(entry) for rows, entry in self.batches.items()},
        )


class ServingStatistics:
    """The `Metrics` sink the server runs with."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str], VersionStatistics] = {}
        # Recorded events not yet folded in; see the module's docstring.
        self._finished: deque[tuple[str, str, str, float, int, RequestTiming, float]] = deque()
        self._encoded: deque[tuple[str, str, float]] = deque()
        self._executed: deque[tuple[str, str, int, float]] = deque()
        self._fold_lock = threading.Lock()

    def request_finished(
        self, model: str, version: str, outcome: str, duration_s: float, rows: int, timing: RequestTiming
    ) -> None:
        self._finished.append((model, version, outcome, duration_s, rows, timing, time.time()))
        if len(self._finished) >= FOLD_EVERY:
            self._fold()

    def response_encoded(self, model: str, version: str, encode_s: float) -> None:
        self._encoded.append((model, version, encode_s))

    def batch_executed(self, model: str, version: str, rows: int, compute_infer_s: float) -> None:
        self._executed.append((model, version, rows, compute_infer_s))

    def _fold(self) -> None:
        """Fold the recorded events into the numbers (from any thread)."""
        with self._fold_lock:
            # Exactly the events present now: the loop's thread may append meanwhile.
            finished = _take(self._finished)
            encoded = _take(self._encoded)
            executed = _take(self._executed)
            for (model, version), events in _grouped(finished).items():
                self._fold_finished(self._version(model, version), events)
            for (model, version), events in _grouped(encoded).items():
                self._version(model, version).encode.observe_many(np.array([e[2] for e in events]))
            for (model, version), events in _grouped(executed).items():
                self._fold_executed(self._version(model, version), events)

    @staticmethod
    def _fold_finished(stats: VersionStatistics, events: list[tuple[Any, ...]]) -> None:
        successes = []
        for _, _, outcome, duration_s, rows, timing, _ in events:
            stats.outcomes[outcome] = stats.outcomes.get(outcome, 0) + 1
            if outcome != "success":
                stats.failed_s += duration_s
                continue
            successes.append(
                (
                    duration_s,
                    timing.decode_s,
                    timing.queue_s,
                    timing.batch_wait_s,
                    timing.compute_input_s,
                    timing.compute_infer_s,
                    timing.compute_output_s,
                    rows,
                )
            )
        stats.last_inference_ms = int(events[-1][6] * 1000)
        if not successes:
            return
        columns = np.array(successes, dtype=np.float64).T
        duration, decode, queue, batch_wait, compute_input, compute_infer, compute_output, rows = columns
        stats.duration.observe_many(duration)
        stats.decode.observe_many(decode)
        stats.queue.observe_many(queue)
        stats.batch_wait.observe_many(batch_wait)
        stats.compute.observe_many(compute_input + compute_infer + compute_output)
        stats.compute_input_s += float(compute_input.sum())
        stats.compute_infer_s += float(compute_infer.sum())
        stats.compute_output_s += float(compute_output.sum())
        stats.inference_count += int(rows.sum())

    @staticmethod
    def _fold_executed(stats: VersionStatistics, events: list[tuple[Any, ...]]) -> None:
        rows = np.array([e[2] for e in events], dtype=np.int64)
        seconds = np.array([e[3] for e in events], dtype=np.float64)
        stats.batch_size.observe_many(rows)
        stats.execution.observe_many(seconds)
        for size, duration_s in zip(rows.tolist(), seconds.tolist(), strict=True):
            entry = stats.batches.get(size)
            if entry is None:
                entry = stats.batches[size] = [0, 0.0]
            entry[0] += 1
            entry[1] += duration_s

    def snapshot(self) -> dict[tuple[str, str], VersionStatistics]:
        """A copy of every version's numbers (safe to call from another thread)."""
        self._fold()
        with self._fold_lock:
            return {key: stats.copy() for key, stats in self._versions.items()}

    def model_statistics(self, model: str, version: str) -> ModelStatistics:
        """One version's numbers in the shape of Triton's statistics extension."""
        self._fold()
        with self._fold_lock:
            stats = self._versions.get((model, version))
            stats = stats.copy() if stats is not None else VersionStatistics()
        successes = stats.duration.count
        failures = sum(n for outcome, n in stats.outcomes.items() if outcome != "success")
        return ModelStatistics(
            name=model,
            version=version,
            last_inference_ms=stats.last_inference_ms,
            inference_count=stats.inference_count,
            execution_count=stats.execution.count,
            success=_duration(successes, stats.duration.total),
            fail=_duration(failures, stats.failed_s),
            queue=_duration(successes, stats.queue.total + stats.batch_wait.total),
            compute_input=_duration(successes, stats.compute_input_s),
            compute_infer=_duration(successes, stats.compute_infer_s),
            compute_output=_duration(successes, stats.compute_output_s),
            batches=tuple(
                BatchStatistics(
                    batch_size=rows,
                    compute_input=DurationStatistic(),
                    compute_infer=_duration(int(executions), seconds),
                    compute_output=DurationStatistic(),
                )
                for rows, (executions, seconds) in sorted(stats.batches.items())
            ),
        )

    def _version(self, model: str, version: str) -> VersionStatistics:
        key = (model, version)
        stats = self._versions.get(key)
        if stats is None:
            stats = self._versions[key] = VersionStatistics()
        return stats


def _duration(count: int, seconds: float) -> DurationStatistic:
    return DurationStatistic(count=count, ns=int(seconds * 1e9))


def _take(events: deque[Any]) -> list[Any]:
    return [events.popleft() for _ in range(len(events))]


def _grouped(events: list[Any]) -> dict[tuple[str, str], list[Any]]:
    """Events by (model, version), each group in the order recorded."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for event in events:
        key = (event[0], event[1])
        group = groups.get(key)
        if group is None:
            groups[key] = [event]
        else:
            group.append(event)
    return groups

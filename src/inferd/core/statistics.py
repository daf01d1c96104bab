"""What inferd counts about its work, per model version (a request's phases also per door it came
by), recorded once per event and read at leisure: Triton's statistics extension
(`GET /v2/models/{m}/stats`, gRPC ModelStatistics) and the Prometheus exposition
(`server.prometheus`) are both views of these numbers.

Recording is a few integer and float additions and a bisect per histogram (no locks: every event
is recorded on the event loop's thread); snapshots copy before reading, so a scrape on another
thread sees consistent enough numbers without stopping the loop.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from inferd.core.metrics import LOAD, LOAD_CAUSES
from inferd.types import BatchStatistics, DurationStatistic, LoadTimings, ModelStatistics, RequestTiming

# Latency buckets from 100 us to 10 s: tiny models answer in well under a millisecond.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Model loads: from a small model's milliseconds to a large one's minutes.
LOAD_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LOAD_PHASES = ("fetch", "session", "warmup")


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

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total)


def _latency() -> Histogram:
    return Histogram.with_bounds(LATENCY_BUCKETS_S)


@dataclass(slots=True)
class RequestPhases:
    """Successful requests that came by one door: from the start of decoding to a result, and that
    time split."""

    duration: Histogram = field(default_factory=_latency)
    decode: Histogram = field(default_factory=_latency)
    queue: Histogram = field(default_factory=_latency)
    batch_wait: Histogram = field(default_factory=_latency)
    compute: Histogram = field(default_factory=_latency)
    encode: Histogram = field(default_factory=_latency)

    def copy(self) -> RequestPhases:
        return RequestPhases(
            self.duration.copy(),
            self.decode.copy(),
            self.queue.copy(),
            self.batch_wait.copy(),
            self.compute.copy(),
            self.encode.copy(),
        )


@dataclass(slots=True)
class VersionStatistics:
    """Everything counted for one model version."""

    # (protocol, outcome) -> requests that came by that door and finished with that outcome
    # ("success" or an ErrorCode value)
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    # protocol -> its successful requests' phases, made on the door's first request. The doors are
    # a fixed set (`types.PROTOCOLS`), so this stays as small as they are.
    phases: dict[str, RequestPhases] = field(default_factory=dict)
    compute_input_s: float = 0.0
    compute_infer_s: float = 0.0
    compute_output_s: float = 0.0
    failed_s: float = 0.0
    inference_count: int = 0
    last_inference_ms: int = 0
    # The response cache's answers to this version's requests: [count, seconds] of hits and of misses.
    cache_hits: list[float] = field(default_factory=lambda: [0, 0.0])
    cache_misses: list[float] = field(default_factory=lambda: [0, 0.0])
    # Hits that then succeeded (a hit may still fail after the cache: an answer over the limit).
    hit_successes: int = 0
    # Executions of the model, by rows, and their durations: an execution may serve requests of
    # several doors, so these have no protocol.
    batch_size: Histogram = field(default_factory=lambda: Histogram.with_bounds(BATCH_SIZE_BUCKETS))
    execution: Histogram = field(default_factory=_latency)
    # rows -> [executions, seconds]
    batches: dict[int, list[float]] = field(default_factory=dict)

    def copy(self) -> VersionStatistics:
        return VersionStatistics(
            outcomes=dict(self.outcomes),
            phases={protocol: phases.copy() for protocol, phases in list(self.phases.items())},
            compute_input_s=self.compute_input_s,
            compute_infer_s=self.compute_infer_s,
            compute_output_s=self.compute_output_s,
            failed_s=self.failed_s,
            inference_count=self.inference_count,
            last_inference_ms=self.last_inference_ms,
            cache_hits=list(self.cache_hits),
            cache_misses=list(self.cache_misses),
            hit_successes=self.hit_successes,
            batch_size=self.batch_size.copy(),
            execution=self.execution.copy(),
            batches={rows: list(entry) for rows, entry in self.batches.items()},
        )

    def phases_of(self, protocol: str) -> RequestPhases:
        phases = self.phases.get(protocol)
        if phases is None:
            phases = self.phases[protocol] = RequestPhases()
        return phases


class ServingStatistics:
    """The `Metrics` sink the server runs with."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str], VersionStatistics] = {}
        # Requests that resolved to no loaded version (unknown model or version, model not ready):
        # (protocol, ErrorCode value) -> count. No model in the key, so it stays as small as the
        # doors times the ErrorCode enum.
        self.unresolved: dict[tuple[str, str], int] = {}
        # Model management, server-wide (no model label: a fleet of many models adds no series):
        # each version load's time by (cause, phase), loads by outcome, unloads, scale to zero.
        self.load_phases = {
            (cause, phase): Histogram.with_bounds(LOAD_BUCKETS_S) for cause in LOAD_CAUSES for phase in LOAD_PHASES
        }
        self.loads = {"success": 0, "failure": 0}
        self.unloads = 0
        self.evictions = 0
        self.scaled_to_zero = 0
        self.on_demand = {"hit": 0, "miss": 0}
        # The response cache: answers that left it for its byte budget, by model; what it holds now.
        self.cache_evictions: dict[str, int] = {}
        self.cache_bytes = 0
        self.cache_redis_errors = 0
        # Shadows' copies: (endpoint, shadow, outcome) -> count; (endpoint, shadow) -> dropped; (endpoint,
        # shadow, "agree" or "differ") -> count; (endpoint, shadow, output) -> the largest |diff| seen.
        self.shadow_outcomes: dict[tuple[str, str, str], int] = {}
        self.shadow_drops: dict[tuple[str, str], int] = {}
        self.shadow_comparisons: dict[tuple[str, str, str], int] = {}
        self.shadow_max_abs_diff: dict[tuple[str, str, str], float] = {}

    def request_finished(
        self,
        model: str,
        version: str,
        protocol: str,
        outcome: str,
        duration_s: float,
        rows: int,
        timing: RequestTiming,
    ) -> None:
        stats = self._version(model, version)
        key = (protocol, outcome)
        stats.outcomes[key] = stats.outcomes.get(key, 0) + 1
        if outcome != "success":
            stats.failed_s += duration_s
            return
        # The door's phases made by `phases_of` only on its first request (a call every request
        # would pay for otherwise).
        phases = stats.phases.get(protocol) or stats.phases_of(protocol)
        phases.duration.observe(duration_s)
        phases.decode.observe(timing.decode_s)
        if timing.cache_hit:  # never computed: Triton counts the compute phases without hits (queue: 0 s)
            stats.hit_successes += 1
            phases.queue.observe(0.0)
            stats.last_inference_ms = int(time.time() * 1000)
            return
        phases.queue.observe(timing.queue_s)
        phases.batch_wait.observe(timing.batch_wait_s)
        phases.compute.observe(timing.compute_s)
        stats.compute_input_s += timing.compute_input_s
        stats.compute_infer_s += timing.compute_infer_s
        stats.compute_output_s += timing.compute_output_s
        stats.inference_count += rows
        stats.last_inference_ms = int(time.time() * 1000)

    def version_loaded(self, model: str, timings: LoadTimings, cause: str = LOAD) -> None:
        self.loads["success"] += 1
        self.load_phases[(cause, "fetch")].observe(timings.fetch_s)
        self.load_phases[(cause, "session")].observe(timings.session_s)
        self.load_phases[(cause, "warmup")].observe(timings.warmup_s)

    def version_load_failed(self, model: str) -> None:
        self.loads["failure"] += 1

    def model_unloaded(self, model: str) -> None:
        self.unloads += 1

    def model_evicted(self, model: str) -> None:
        self.evictions += 1

    def model_scaled_to_zero(self, model: str) -> None:
        self.scaled_to_zero += 1

    def on_demand_hit(self) -> None:
        self.on_demand["hit"] += 1

    def on_demand_miss(self) -> None:
        self.on_demand["miss"] += 1

    def cache_answered(self, model: str, version: str, hit: bool, duration_s: float) -> None:
        counted = self._version(model, version).cache_hits if hit else self._version(model, version).cache_misses
        counted[0] += 1
        counted[1] += duration_s

    def cache_evicted(self, model: str) -> None:
        self.cache_evictions[model] = self.cache_evictions.get(model, 0) + 1

    def cache_size(self, size_bytes: int) -> None:
        self.cache_bytes = size_bytes

    def cache_redis_failed(self) -> None:
        self.cache_redis_errors += 1

    def request_unresolved(self, protocol: str, outcome: str) -> None:
        key = (protocol, outcome)
        self.unresolved[key] = self.unresolved.get(key, 0) + 1

    def shadow_finished(self, endpoint: str, shadow: str, outcome: str, duration_s: float) -> None:
        key = (endpoint, shadow, outcome)
        self.shadow_outcomes[key] = self.shadow_outcomes.get(key, 0) + 1

    def shadow_dropped(self, endpoint: str, shadow: str) -> None:
        self.shadow_drops[(endpoint, shadow)] = self.shadow_drops.get((endpoint, shadow), 0) + 1

    def shadow_compared(self, endpoint: str, shadow: str, agreed: bool, diffs: Mapping[str, float]) -> None:
        key = (endpoint, shadow, "agree" if agreed else "differ")
        self.shadow_comparisons[key] = self.shadow_comparisons.get(key, 0) + 1
        for output, diff in diffs.items():
            self.shadow_max_abs_diff[(endpoint, shadow, output)] = max(
                diff, self.shadow_max_abs_diff.get((endpoint, shadow, output), 0.0)
            )

    def response_encoded(self, model: str, version: str, protocol: str, encode_s: float) -> None:
        # Made by `_version` and `phases_of` only when new, as in request_finished.
        stats = self._versions.get((model, version)) or self._version(model, version)
        (stats.phases.get(protocol) or stats.phases_of(protocol)).encode.observe(encode_s)

    def batch_executed(self, model: str, version: str, rows: int, compute_infer_s: float) -> None:
        stats = self._version(model, version)
        stats.batch_size.observe(rows)
        stats.execution.observe(compute_infer_s)
        entry = stats.batches.get(rows)
        if entry is None:
            entry = stats.batches[rows] = [0, 0.0]
        entry[0] += 1
        entry[1] += compute_infer_s

    def snapshot(self) -> dict[tuple[str, str], VersionStatistics]:
        """A copy of every version's numbers (safe to read from another thread)."""
        return {key: stats.copy() for key, stats in list(self._versions.items())}

    def model_statistics(self, model: str, version: str) -> ModelStatistics:
        """One version's numbers in the shape of Triton's statistics extension."""
        stats = self._versions.get((model, version))
        stats = stats.copy() if stats is not None else VersionStatistics()
        # Triton's numbers have no door: every door's, added up.
        phases = stats.phases.values()
        successes = sum(door.duration.count for door in phases)
        computed = successes - stats.hit_successes  # the hits were never computed
        failures = sum(n for (_, outcome), n in stats.outcomes.items() if outcome != "success")
        return ModelStatistics(
            name=model,
            version=version,
            last_inference_ms=stats.last_inference_ms,
            inference_count=stats.inference_count,
            execution_count=stats.execution.count,
            success=_duration(successes, sum(door.duration.total for door in phases)),
            fail=_duration(failures, stats.failed_s),
            queue=_duration(successes, sum(door.queue.total + door.batch_wait.total for door in phases)),
            compute_input=_duration(computed, stats.compute_input_s),
            compute_infer=_duration(computed, stats.compute_infer_s),
            compute_output=_duration(computed, stats.compute_output_s),
            batches=tuple(
                BatchStatistics(
                    batch_size=rows,
                    compute_input=DurationStatistic(),
                    compute_infer=_duration(int(executions), seconds),
                    compute_output=DurationStatistic(),
                )
                for rows, (executions, seconds) in sorted(stats.batches.items())
            ),
            cache_hit=_duration(int(stats.cache_hits[0]), stats.cache_hits[1]),
            cache_miss=_duration(int(stats.cache_misses[0]), stats.cache_misses[1]),
        )

    def _version(self, model: str, version: str) -> VersionStatistics:
        key = (model, version)
        stats = self._versions.get(key)
        if stats is None:
            stats = self._versions[key] = VersionStatistics()
        return stats


def _duration(count: int, seconds: float) -> DurationStatistic:
    return DurationStatistic(count=count, ns=int(seconds * 1e9))


def combined_statistics(name: str, version: str, parts: list[ModelStatistics]) -> ModelStatistics:
    """Several versions' statistics as one, under `name` and `version` (an endpoint's: its
    variants', summed), so that a client reading one model's statistics (perf_analyzer) reads the
    endpoint's."""

    def total(field: str) -> DurationStatistic:
        durations = [getattr(part, field) for part in parts]
        return DurationStatistic(sum(d.count for d in durations), sum(d.ns for d in durations))

    batches: dict[int, list[BatchStatistics]] = {}
    for part in parts:
        for batch in part.batches:
            batches.setdefault(batch.batch_size, []).append(batch)
    return ModelStatistics(
        name=name,
        version=version,
        last_inference_ms=max((part.last_inference_ms for part in parts), default=0),
        inference_count=sum(part.inference_count for part in parts),
        execution_count=sum(part.execution_count for part in parts),
        success=total("success"),
        fail=total("fail"),
        queue=total("queue"),
        compute_input=total("compute_input"),
        compute_infer=total("compute_infer"),
        compute_output=total("compute_output"),
        batches=tuple(
            BatchStatistics(
                batch_size=size,
                compute_input=DurationStatistic(),
                compute_infer=DurationStatistic(
                    sum(b.compute_infer.count for b in same), sum(b.compute_infer.ns for b in same)
                ),
                compute_output=DurationStatistic(),
            )
            for size, same in sorted(batches.items())
        ),
        cache_hit=total("cache_hit"),
        cache_miss=total("cache_miss"),
    )

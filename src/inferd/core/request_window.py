"""`RequestWindow`: the last minute of a variant's requests (when each ended, how long it took,
whether it failed), and what it sums up to: what `GET /v2/endpoints/{name}` shows for each variant
and shadow, and what a rollout's judge compares. On an injected clock, so tests move time.

Each request is recorded in one flat array (array.array: raw doubles, no Python object a
request): recording a success is the array's own `fromlist` (C's work, no Python frame), and a
window of a hundred thousand requests leaves nothing for the garbage collector to walk. What is
older than the window is dropped in chunks, so each request pays for its removal once. The same
windows give /metrics its endpoint series: totals of all a window was told, summed from what it
holds and what it dropped.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from inferd.core.statistics import LATENCY_BUCKETS_S
from inferd.types import WINDOW_S

# A window holds this many requests (the newest), an eighth more before it drops the oldest, and
# those recorded by `succeeded` since its last `trim` (the server trims every TRIM_INTERVAL_S): its
# memory is bounded whatever the rate, and a minute at more than this rate is judged on its last
# requests.
WINDOW_MAX_REQUESTS = 100_000
TRIM_INTERVAL_S = 1.0
# Entries (two doubles a request) held before the oldest are dropped, an eighth at a time (by
# `observe` at once, by `trim` for what `succeeded` added).
_MAX_ENTRIES = 2 * (WINDOW_MAX_REQUESTS + WINDOW_MAX_REQUESTS // 8)
SUCCESS = "success"
_BOUNDS = np.asarray(LATENCY_BUCKETS_S, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """A variant's requests over the window: counts, the share that failed, latency percentiles."""

    requests: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class WindowTotals:
    """A window's requests since it was made (not only the last minute's): what /metrics counts."""

    # "success", and each error code, by count.
    outcomes: dict[str, int]
    # The successful requests' seconds: one count per LATENCY_BUCKETS_S bound and one for +Inf
    # (not cumulative), and their sum.
    bucket_counts: list[int]
    seconds_total: float

    @staticmethod
    def sum(parts: Iterable[WindowTotals]) -> WindowTotals:
        outcomes: dict[str, int] = {}
        buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        seconds = 0.0
        for part in parts:
            for outcome, count in part.outcomes.items():
                outcomes[outcome] = outcomes.get(outcome, 0) + count
            buckets = [a + b for a, b in zip(buckets, part.bucket_counts, strict=True)]
            seconds += part.seconds_total
        return WindowTotals(outcomes, buckets, seconds)


class RequestWindow:
    """The last minute of one variant's requests (when each ended, how long it took, whether it
    failed), and the totals of all it was ever told, for /metrics.

    A request is two doubles of a flat array: when it ended, and its seconds, whose sign bit marks a
    failure (-0.0 included). The totals of what the window no longer holds are folded in when it is
    dropped; the rest are summed when asked for. So a success costs the request path one C call
    (`succeeded`), and a failure a call of `observe`, which also counts its error code."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries = array("d")
        self._append = self._entries.append
        # The clock a request's end is read on, for `succeeded`'s callers.
        self.clock = clock
        # A successful request, as [when it ended on `clock`, its seconds]: the array's own
        # `fromlist` (kept: the array is only ever trimmed in place). The dispatcher records every
        # success of an endpoint's request so, with no Python frame: what an endpoint costs a
        # request over its model. Both doubles are added in one C call, under the GIL (the server
        # runs on a build with one), so a reader never finds one without the other; the window's
        # size is not looked at here, but by `trim`.
        self.succeeded: Callable[[list[float]], None] = self._entries.fromlist
        # Failed requests since the window was made, by error code.
        self._failures: dict[str, int] = {}
        # What was dropped, summed (under the lock, which /metrics' thread reads it under too).
        self._lock = threading.Lock()
        self._dropped_requests = 0
        self._dropped_successes = 0
        self._dropped_buckets = np.zeros(len(LATENCY_BUCKETS_S) + 1, dtype=np.int64)
        self._dropped_seconds = 0.0

    def observe(self, latency_s: float, outcome: str) -> None:
        """A request ended `latency_s` after it began, with `outcome` ("success" or an error code)."""
        # Two appends through the bound method (kept: the array is only ever trimmed in place) cost
        # less than building a tuple to extend by: this runs on every request to an endpoint. A
        # reader on another thread may find a time without its seconds yet: seconds are read at the
        # odd places only, so a trailing time is never taken for a request.
        append = self._append
        append(self._clock())
        if outcome == SUCCESS:
            append(latency_s)
        else:
            append(-latency_s)
            self._failures[outcome] = self._failures.get(outcome, 0) + 1
        if len(self._entries) > _MAX_ENTRIES:
            self._drop(len(self._entries) // 2 - WINDOW_MAX_REQUESTS)

    def trim(self) -> None:
        """Hold the window to its bound as `observe` does (what `succeeded` added since the last trim:
        `observe` keeps the bound itself)."""
        if len(self._entries) > _MAX_ENTRIES:
            self._drop(len(self._entries) // 2 - WINDOW_MAX_REQUESTS)

    @property
    def requests_total(self) -> int:
        return self._dropped_requests + len(self._entries) // 2

    @property
    def errors_total(self) -> int:
        return sum(self._failures.values())

    def summary(self, window_s: float = WINDOW_S) -> WindowSummary:
        seconds, failed = self.entries(window_s)
        return _summarize(seconds, failed)

    def entries(self, window_s: float = WINDOW_S) -> tuple[np.ndarray, np.ndarray]:
        """The seconds and failures of the requests of the last `window_s` seconds (at most
        WINDOW_S: what is older is dropped)."""
        now = self._clock()
        flat = np.frombuffer(self._entries[:], dtype=np.float64)  # a copy: the array may grow meanwhile
        ended = flat[0::2]
        stale = int(np.searchsorted(ended, now - WINDOW_S, side="left"))
        if stale:
            self._drop(stale)
        start = int(np.searchsorted(ended, now - min(window_s, WINDOW_S), side="left"))
        signed = flat[2 * start + 1 :: 2]
        return np.abs(signed), np.signbit(signed)

    def totals(self) -> WindowTotals:
        """Every request the window was told of, summed (safe from any thread)."""
        # Each series from what counts it alone, so none can seem to go back between two reads.
        failures = dict(self._failures)
        with self._lock:
            held = np.frombuffer(self._entries[:], dtype=np.float64)[1::2]
            succeeded = held[~np.signbit(held)]
            buckets = self._dropped_buckets + _bucket_counts(succeeded)
            successes = self._dropped_successes + len(succeeded)
            seconds = self._dropped_seconds + float(succeeded.sum())
        return WindowTotals({SUCCESS: successes, **failures}, [int(count) for count in buckets], seconds)

    def _drop(self, count: int) -> None:
        """Forget the `count` oldest requests, their totals kept."""
        with self._lock:
            dropped = np.frombuffer(self._entries[: 2 * count], dtype=np.float64)[1::2]
            succeeded = dropped[~np.signbit(dropped)]
            self._dropped_buckets += _bucket_counts(succeeded)
            self._dropped_requests += len(dropped)
            self._dropped_successes += len(succeeded)
            self._dropped_seconds += float(succeeded.sum())
            del self._entries[: 2 * count]


def _bucket_counts(seconds: np.ndarray) -> np.ndarray:
    """`seconds` counted per LATENCY_BUCKETS_S bound (a value on a bound is in its bucket, as
    Prometheus' `le` says) and +Inf."""
    indices = np.searchsorted(_BOUNDS, seconds, side="left")
    return np.bincount(indices, minlength=len(_BOUNDS) + 1).astype(np.int64)


def combined_summary(windows: Iterable[RequestWindow], window_s: float = WINDOW_S) -> WindowSummary:
    """Several windows' requests summed up as one (an endpoint's variants, as its shadows' baseline)."""
    parts = [window.entries(window_s) for window in windows]
    if not parts:
        return WindowSummary(0, 0, None, None)
    return _summarize(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _summarize(seconds: np.ndarray, failed: np.ndarray) -> WindowSummary:
    if not len(seconds):
        return WindowSummary(0, 0, None, None)
    p50, p99 = np.percentile(seconds, (50, 99)) * 1000
    return WindowSummary(len(seconds), int(failed.sum()), float(p50), float(p99))

"""`RequestWindow`: the last minute of a variant's requests (when each ended, how long it took,
whether it failed), and what it sums up to: what `GET /v2/endpoints/{name}` shows for each variant
and shadow, and what a rollout's judge compares. On an injected clock, so tests move time."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

WINDOW_S = 60.0
# A window holds at most this many requests (the newest): its memory is bounded whatever the rate,
# and a minute at more than this rate is judged on its last requests.
WINDOW_MAX_REQUESTS = 100_000


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


class RequestWindow:
    """The last minute of one variant's requests: when each ended, how long it took, whether it failed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: deque[tuple[float, float, bool]] = deque(maxlen=WINDOW_MAX_REQUESTS)
        self.requests_total = 0
        self.errors_total = 0

    def observe(self, latency_s: float, failed: bool) -> None:
        self._entries.append((self._clock(), latency_s, failed))
        self.requests_total += 1
        self.errors_total += failed

    def summary(self, window_s: float = WINDOW_S) -> WindowSummary:
        return _summarize(self.entries(window_s))

    def entries(self, window_s: float = WINDOW_S) -> list[tuple[float, float, bool]]:
        """(ended at, seconds, failed) of each request of the last `window_s` seconds (at most
        WINDOW_S: what is older is dropped)."""
        now = self._clock()
        entries = self._entries
        while entries and entries[0][0] < now - WINDOW_S:
            entries.popleft()
        if window_s >= WINDOW_S:
            return list(entries)
        since = now - window_s
        return [entry for entry in entries if entry[0] >= since]


def combined_summary(windows: Iterable[RequestWindow], window_s: float = WINDOW_S) -> WindowSummary:
    """Several windows' requests summed up as one (an endpoint's variants, as its shadows' baseline)."""
    return _summarize([entry for window in windows for entry in window.entries(window_s)])


def _summarize(entries: list[tuple[float, float, bool]]) -> WindowSummary:
    if not entries:
        return WindowSummary(0, 0, None, None)
    latencies = np.fromiter((entry[1] for entry in entries), dtype=np.float64, count=len(entries))
    p50, p99 = np.percentile(latencies, (50, 99)) * 1000
    return WindowSummary(len(entries), sum(entry[2] for entry in entries), float(p50), float(p99))

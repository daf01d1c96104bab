"""`RequestWindow`: the last minute of a variant's requests (when each ended, how long it took,
whether it failed), and what it sums up to: what `GET /v2/endpoints/{name}` shows for each variant
and shadow, and what a rollout's judge compares. On an injected clock, so tests move time.

Each request is recorded in three flat arrays (array.array: raw doubles and bytes, no Python
object a request): recording costs a few appends, and a window of a hundred thousand requests
leaves nothing for the garbage collector to walk. What is older than the window is dropped in
chunks, so each request pays for its removal once.
"""

from __future__ import annotations

import time
from array import array
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
        self._ended = array("d")
        self._seconds = array("d")
        self._failed = array("b")
        self.requests_total = 0
        self.errors_total = 0

    def observe(self, latency_s: float, failed: bool) -> None:
        self._ended.append(self._clock())
        self._seconds.append(latency_s)
        self._failed.append(failed)
        self.requests_total += 1
        self.errors_total += failed
        if len(self._ended) > WINDOW_MAX_REQUESTS + WINDOW_MAX_REQUESTS // 8:
            self._drop(len(self._ended) - WINDOW_MAX_REQUESTS)

    def summary(self, window_s: float = WINDOW_S) -> WindowSummary:
        seconds, failed = self.entries(window_s)
        return _summarize(seconds, failed)

    def entries(self, window_s: float = WINDOW_S) -> tuple[np.ndarray, np.ndarray]:
        """The seconds and failures of the requests of the last `window_s` seconds (at most
        WINDOW_S: what is older is dropped)."""
        now = self._clock()
        ended = np.frombuffer(self._ended, dtype=np.float64)
        stale = int(np.searchsorted(ended, now - WINDOW_S, side="left"))
        if stale:
            del ended
            self._drop(stale)
            ended = np.frombuffer(self._ended, dtype=np.float64)
        start = int(np.searchsorted(ended, now - min(window_s, WINDOW_S), side="left"))
        return (
            np.frombuffer(self._seconds, dtype=np.float64)[start:].copy(),
            np.frombuffer(self._failed, dtype=np.int8)[start:].copy(),
        )

    def _drop(self, count: int) -> None:
        del self._ended[:count]
        del self._seconds[:count]
        del self._failed[:count]


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

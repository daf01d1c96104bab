"""A fleet's figures for a rollout's judge: each variant's requests by weight, failures and latency
over a window, summed across every replica, from one of two sources:

Each is a `core.rollout.FleetFigures`. `metrics_source` makes one from a flag.

- `PrometheusSource`: PromQL (`inferd.rollout_queries`) over the Prometheus that scrapes the
  replicas. Its ranges are at least four scrape intervals long (as Grafana's `$__rate_interval`):
  shorter ones may hold a single sample a series, from which `increase()` says nothing.
- `ScrapeSource`: the replicas' own /metrics, read by the controller every `SCRAPE_EVERY_S` and
  kept for a minute, so a window's figures are the differences between successive readings,
  summed. A replica whose counters went back restarted: its requests since then are its counters
  (as Prometheus' `increase()` counts). It knows nothing from before the controller started.

Both give what one server's judge reads from its windows (`core.request_window.WindowSummary`),
with two differences the docs state: percentiles come from the latency histogram's buckets
(interpolated within one, as Prometheus' `histogram_quantile`), and they are of successful requests
only (the histogram counts no failure).
"""

from __future__ import annotations

import asyncio
import bisect
import http.client
import itertools
import json
import logging
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from inferd import rollout_queries as queries
from inferd.core.request_window import WindowSummary
from inferd.core.rollout import FiguresUnavailable, FleetFigures
from inferd.types import ROUTED_BY_WEIGHT, WINDOW_S

# How often the scrape source reads the replicas at most (the rollout controller's tick).
SCRAPE_EVERY_S = 0.5
logger = logging.getLogger(__name__)
SUCCESS = "success"


class MetricsSourceError(FiguresUnavailable):
    """The source could not be read (Prometheus or a replica does not answer, or answers nonsense)."""


# -- Prometheus ------------------------------------------------------------------------------------


class PrometheusSource:
    """The figures by PromQL over Prometheus' HTTP API (`/api/v1/query`)."""

    def __init__(
        self, url: str, scrape_interval_s: float = 15.0, timeout_s: float = 10.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.url = url.rstrip("/")
        self.scrape_interval_s = scrape_interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        # Each variant's requests since this source was made, as increase() counts them (a
        # replica's restart loses none, one that comes back brings only what it counted since):
        # added range by range, each at least four scrapes long, so no query spans the whole rollout.
        self._counted: dict[tuple[str, str], tuple[float, float]] = {}  # -> (requests, counted until)
        self._started = clock()

    def describe(self) -> str:
        return f"Prometheus at {self.url} (scraping every {self.scrape_interval_s:g} s)"

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary:
        selected = queries.matchers(endpoint, variant)
        range_s = queries.judged_range_s(window_s, self.scrape_interval_s)
        requests, errors, p50_s, p99_s = await asyncio.gather(
            self.value(queries.requests_in(selected, range_s)),
            self.value(queries.errors_in(selected, range_s)),
            self.value(queries.quantile_in(0.5, selected, range_s)),
            self.value(queries.quantile_in(0.99, selected, range_s)),
        )
        return WindowSummary(
            requests=round(requests or 0.0),
            errors=round(errors or 0.0),
            p50_ms=None if p50_s is None else p50_s * 1000,
            p99_ms=None if p99_s is None else p99_s * 1000,
        )

    async def requests(self, endpoint: str, variant: str) -> int:
        """Requests since this source was made, up to a range ago at most (a count is conservative:
        behind by less than four scrapes, never ahead)."""
        key = (endpoint, variant)
        counted, until = self._counted.get(key, (0.0, self._started))
        now = self._clock()
        if now - until >= queries.judged_range_s(0.0, self.scrape_interval_s):
            found = await self.value(queries.requests_in(queries.matchers(endpoint, variant), now - until))
            counted, until = counted + (found or 0.0), now
            self._counted[key] = (counted, until)
        return round(counted)

    async def value(self, expression: str) -> float | None:
        """The expression's one value now; None when it has none (an empty vector) or it is NaN."""
        return await asyncio.to_thread(self._value, expression)

    def _value(self, expression: str) -> float | None:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                document = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # Prometheus says why in its body (a query it refuses: 400)
            with exc:
                why = exc.read()[:500].decode("utf-8", "replace")
            raise MetricsSourceError(f"Prometheus at {self.url} answered {exc.code}: {why}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise MetricsSourceError(f"Prometheus at {self.url} did not answer: {exc!r}") from None
        except ValueError as exc:
            raise MetricsSourceError(f"Prometheus at {self.url} answered no JSON: {exc}") from None
        if not isinstance(document, dict) or document.get("status") != "success":
            why = document.get("error", document) if isinstance(document, dict) else document
            raise MetricsSourceError(f"Prometheus refused {expression!r}: {why}")
        try:
            data = document["data"]
            if data["resultType"] == "scalar":
                found = float(data["result"][1])
            else:
                results = data["result"]
                if not results:
                    return None
                if len(results) > 1:
                    raise MetricsSourceError(f"{expression!r} gave {len(results)} series, not one")
                found = float(results[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetricsSourceError(f"Prometheus at {self.url} answered {expression!r} oddly: {exc!r}") from None
        return None if math.isnan(found) else found


# -- the replicas' own /metrics --------------------------------------------------------------------


@dataclass
class VariantCounts:
    """One variant's requests by weight as one replica counted them so far."""

    requests: float = 0.0
    errors: float = 0.0
    # Cumulative counts of the successes' latency histogram, by upper bound (+Inf last).
    buckets: dict[float, float] = field(default_factory=dict)

    def minus(self, earlier: VariantCounts) -> VariantCounts:
        """What was counted since `earlier`; all of it when the counters went back (a restart)."""
        if self.requests < earlier.requests or any(
            self.buckets.get(bound, 0.0) < count for bound, count in earlier.buckets.items()
        ):
            return self
        return VariantCounts(
            self.requests - earlier.requests,
            self.errors - earlier.errors,
            {bound: count - earlier.buckets.get(bound, 0.0) for bound, count in self.buckets.items()},
        )

    def plus(self, other: VariantCounts) -> VariantCounts:
        bounds = set(self.buckets) | set(other.buckets)
        return VariantCounts(
            self.requests + other.requests,
            self.errors + other.errors,
            {bound: self.buckets.get(bound, 0.0) + other.buckets.get(bound, 0.0) for bound in bounds},
        )


Reading = dict[tuple[str, str], VariantCounts]  # (endpoint, variant) -> counts


def parse_metrics(text: str) -> Reading:
    """The endpoint series of one /metrics page (Prometheus' text format), requests by weight only."""
    reading: Reading = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("inferd_endpoint_requests", "inferd_endpoint_request_duration_seconds"):
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("routed") != ROUTED_BY_WEIGHT:
                continue
            counts = reading.setdefault((labels["endpoint"], labels["variant"]), VariantCounts())
            if sample.name == "inferd_endpoint_requests_total":
                counts.requests += sample.value
                if labels.get("outcome") != SUCCESS:
                    counts.errors += sample.value
            elif sample.name == "inferd_endpoint_request_duration_seconds_bucket":
                counts.buckets[float(labels["le"])] = sample.value
    return reading


def histogram_quantile(quantile: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' `histogram_quantile` over cumulative `buckets` (upper bound -> count): linear
    within the bucket the rank falls in, from 0 for the first; the highest finite bound for one
    in +Inf's bucket. None without observations."""
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        return None
    total = buckets[math.inf]
    if total <= 0:
        return None
    rank = quantile * total
    counts = [buckets[bound] for bound in bounds]
    index = bisect.bisect_left(counts, rank)
    if bounds[index] == math.inf:
        return bounds[-2] if len(bounds) > 1 else None
    lower_bound = bounds[index - 1] if index > 0 else 0.0
    lower_count = counts[index - 1] if index > 0 else 0.0
    in_bucket = counts[index] - lower_count
    if in_bucket <= 0:
        return bounds[index]
    return lower_bound + (bounds[index] - lower_bound) * (rank - lower_count) / in_bucket


class ScrapeSource:
    """The figures from the replicas' own /metrics pages, summed."""

    def __init__(
        self, replicas: Sequence[str], timeout_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not replicas:
            raise ValueError("--replicas: name at least one replica's metrics URL")
        self.replicas = [_metrics_url(replica) for replica in replicas]
        self.timeout_s = timeout_s
        self._clock = clock
        # Each replica's readings of the last minute (and one before it), oldest first.
        self._readings: dict[str, list[tuple[float, Reading]]] = {replica: [] for replica in self.replicas}
        self._read_at = -math.inf
        self._lock = asyncio.Lock()
        # The replicas that did not answer at the last reading, with why.
        self.unanswered: dict[str, str] = {}
        # Each variant's requests since this source first read each replica, restarts counted as
        # increase() counts them: a step's requests are a difference of two of these.
        self._counted: dict[tuple[str, str], float] = {}

    def describe(self) -> str:
        count = len(self.replicas)
        return f"the /metrics of {count} replica{'' if count == 1 else 's'} ({', '.join(self.replicas)})"

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary:
        await self.refresh()
        since = VariantCounts()
        start = self._clock() - min(window_s, WINDOW_S)
        for readings in self._readings.values():
            # From the newest reading at or before the window's start (else the oldest), reading
            # by reading, as Prometheus' increase(): a replica's restart in the window loses only
            # what it counted between its last reading and the restart.
            first = max((i for i, (taken, _) in enumerate(readings) if taken <= start), default=0)
            for (_, earlier), (_, later) in itertools.pairwise(readings[first:]):
                key = (endpoint, variant)
                since = since.plus(later.get(key, VariantCounts()).minus(earlier.get(key, VariantCounts())))
        p50, p99 = (histogram_quantile(q, since.buckets) for q in (0.5, 0.99))
        return WindowSummary(
            requests=round(since.requests),
            errors=round(since.errors),
            p50_ms=None if p50 is None else p50 * 1000,
            p99_ms=None if p99 is None else p99 * 1000,
        )

    async def requests(self, endpoint: str, variant: str) -> int:
        await self.refresh()
        return round(self._counted.get((endpoint, variant), 0.0))

    async def refresh(self) -> None:
        """Read every replica, unless they were read less than SCRAPE_EVERY_S ago."""
        async with self._lock:
            now = self._clock()
            if now - self._read_at < SCRAPE_EVERY_S:
                return
            self._read_at = now
            pages = await asyncio.gather(
                *(asyncio.to_thread(self._page, replica) for replica in self.replicas), return_exceptions=True
            )
            unanswered = {}
            for replica, page in zip(self.replicas, pages, strict=True):
                try:
                    if isinstance(page, BaseException):
                        raise page
                    reading = parse_metrics(page)
                except (MetricsSourceError, ValueError) as exc:  # no answer, or not a metrics page
                    # Its last reading stands in for it: what it counted is not lost, and a
                    # replica that is gone counts nothing new.
                    unanswered[replica] = str(exc)
                    continue
                readings = self._readings[replica]
                if readings:
                    for key, counts in reading.items():
                        since = counts.minus(readings[-1][1].get(key, VariantCounts()))
                        self._counted[key] = self._counted.get(key, 0.0) + since.requests
                readings.append((now, reading))
                # Keep one reading at or before the window's start, and the ones after it.
                while len(readings) > 2 and readings[1][0] <= now - WINDOW_S:
                    del readings[0]
            if unanswered.keys() != self.unanswered.keys():
                for replica, why in unanswered.items():
                    logger.warning("replica %s is left out of the figures until it answers: %s", replica, why)
            self.unanswered = unanswered
            if len(unanswered) == len(self.replicas):
                raise MetricsSourceError(f"no replica answered: {unanswered}")

    def _page(self, url: str) -> str:
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                return str(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            exc.close()
            raise MetricsSourceError(f"{url} answered {exc.code}") from None
        except (OSError, http.client.HTTPException, UnicodeDecodeError) as exc:
            raise MetricsSourceError(f"{url} did not answer: {exc!r}") from None


def _metrics_url(replica: str) -> str:
    """A replica's metrics URL: `host:port` or a URL; /metrics when it names no path."""
    url = replica if "://" in replica else f"http://{replica}"
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"--replicas: {replica!r} is not host:port or an http(s) URL")
    return url if parsed.path not in ("", "/") else url.rstrip("/") + "/metrics"


def metrics_source(flag: str, scrape_interval_s: float = 15.0) -> FleetFigures:
    """`prometheus=URL` or `scrape=HOST:PORT,HOST:PORT,...` (a server's --rollout-controller)."""
    kind, _, where = flag.partition("=")
    if kind == "prometheus" and where.strip():
        return PrometheusSource(where.strip(), scrape_interval_s)
    if kind == "scrape" and where.strip():
        return ScrapeSource([replica.strip() for replica in where.split(",") if replica.strip()])
    raise ValueError(f"{flag!r} is not prometheus=URL or scrape=HOST:PORT,HOST:PORT,...")

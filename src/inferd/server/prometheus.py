"""Prometheus metrics on their own port: the adapter behind core's `Metrics` protocol."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inferd.core.registry import ModelState
from inferd.types import RequestTiming

# Latency buckets from 100 us to 10 s: tiny models answer in well under a millisecond.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

ModelStates = Callable[[], list[tuple[str, str, ModelState]]]
QueueDepths = Callable[[], list[tuple[str, str, int]]]


class PrometheusMetrics:
    def __init__(self, model_states: ModelStates, queue_depths: QueueDepths) -> None:
        # The *_created series double the exposition for no use to a scraper.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        labels = ["model", "version"]
        self._requests = Counter(
            "inferd_requests",
            "Inference requests finished, by outcome (success or the error code).",
            [*labels, "outcome"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "inferd_request_duration_seconds",
            "Successful requests: time from a decoded request to its response, in seconds.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._decode = Histogram(
            "inferd_request_decode_duration_seconds",
            "Successful requests: time parsing the request body or message, in seconds.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._queue = Histogram(
            "inferd_request_queue_duration_seconds",
            "Successful requests: time waiting for a free instance, in seconds.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._batch_wait = Histogram(
            "inferd_request_batch_wait_duration_seconds",
            "Successful requests: time waiting, with an instance free, for the batch to fill, in seconds.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._encode = Histogram(
            "inferd_request_encode_duration_seconds",
            "Successful requests: time writing the response body or message, in seconds.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._compute = Histogram(
            "inferd_request_compute_duration_seconds",
            "Successful requests: merging, running and splitting the batch each was part of, in seconds.",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._batch_size = Histogram(
            "inferd_batch_size",
            "Rows per execution of the model (one request or a merged batch).",
            labels,
            buckets=BATCH_SIZE_BUCKETS,
            registry=self.registry,
        )
        self._execution = Histogram(
            "inferd_execution_duration_seconds",
            "Time per execution of the model, in seconds (its count is the number of executions).",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(model_states, queue_depths))
        self._series: dict[tuple[str, str], _VersionSeries] = {}

    def request_finished(
        self, model: str, version: str, outcome: str, duration_s: float, rows: int, timing: RequestTiming
    ) -> None:
        if outcome != "success":
            self._requests.labels(model, version, outcome).inc()
            return
        series = self._series_of(model, version)
        series.successes.inc()
        series.duration.observe(duration_s)
        series.decode.observe(timing.decode_s)
        series.queue.observe(timing.queue_s)
        series.batch_wait.observe(timing.batch_wait_s)
        series.compute.observe(timing.compute_s)

    def response_encoded(self, model: str, version: str, encode_s: float) -> None:
        self._series_of(model, version).encode.observe(encode_s)

    def batch_executed(self, model: str, version: str, rows: int, compute_infer_s: float) -> None:
        series = self._series_of(model, version)
        series.batch_size.observe(rows)
        series.execution.observe(compute_infer_s)

    def _series_of(self, model: str, version: str) -> _VersionSeries:
        # prometheus_client's labels() costs microseconds per call; each request makes several.
        key = (model, version)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _VersionSeries(
                successes=self._requests.labels(model, version, "success"),
                duration=self._duration.labels(model, version),
                decode=self._decode.labels(model, version),
                queue=self._queue.labels(model, version),
                batch_wait=self._batch_wait.labels(model, version),
                compute=self._compute.labels(model, version),
                encode=self._encode.labels(model, version),
                batch_size=self._batch_size.labels(model, version),
                execution=self._execution.labels(model, version),
            )
        return series

    def serve(self, host: str, port: int) -> Any:
        """Start the /metrics listener on a daemon thread; returns the server (has `.shutdown()`)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server


@dataclass(frozen=True, slots=True)
class _VersionSeries:
    """The labelled children of one model version, looked up once."""

    successes: Any
    duration: Any
    decode: Any
    queue: Any
    batch_wait: Any
    compute: Any
    encode: Any
    batch_size: Any
    execution: Any


class _StateCollector(Collector):
    """Gauges read at scrape time: model states and queue depths."""

    def __init__(self, model_states: ModelStates, queue_depths: QueueDepths) -> None:
        self._model_states = model_states
        self._queue_depths = queue_depths

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = GaugeMetricFamily(
            "inferd_model_state", "1 for the state each model version is in.", labels=["model", "version", "state"]
        )
        for model, version, state in self._model_states():
            states.add_metric([model, version, state.value], 1.0)
        yield states
        depths = GaugeMetricFamily(
            "inferd_queue_depth", "Requests waiting in each batching model's queue.", labels=["model", "version"]
        )
        for model, version, depth in self._queue_depths():
            depths.add_metric([model, version], float(depth))
        yield depths

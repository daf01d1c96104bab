"""Prometheus metrics on their own port: the adapter behind core's `Metrics` protocol."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inferd.core.registry import ModelState

# Latency buckets from 100 µs to 10 s: tiny models answer in well under a millisecond.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class PrometheusMetrics:
    def __init__(self, model_states: Callable[[], list[tuple[str, str, ModelState]]]) -> None:
        # The *_created series double the exposition for no use to a scraper.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "inferd_requests",
            "Inference requests finished, by outcome (success or the error code).",
            ["model", "version", "outcome"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "inferd_request_duration_seconds",
            "Time from a decoded request to its response, in seconds.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_ModelStateCollector(model_states))

    def request_finished(self, model: str, version: str, outcome: str, duration_s: float) -> None:
        self._requests.labels(model, version, outcome).inc()
        if outcome == "success":
            self._duration.labels(model, version).observe(duration_s)

    def serve(self, host: str, port: int) -> Any:
        """Start the /metrics listener on a daemon thread; returns the server (has `.shutdown()`)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server


class _ModelStateCollector(Collector):
    def __init__(self, model_states: Callable[[], list[tuple[str, str, ModelState]]]) -> None:
        self._model_states = model_states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "inferd_model_state", "1 for the state each model version is in.", labels=["model", "version", "state"]
        )
        for model, version, state in self._model_states():
            gauge.add_metric([model, version, state.value], 1.0)
        yield gauge

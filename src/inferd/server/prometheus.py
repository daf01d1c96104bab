"""Prometheus exposition on its own port: a view, built at scrape time, of the numbers that
`core.statistics.ServingStatistics` records, plus live gauges (model states, queue depths)."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from inferd.core.async_jobs import Backlog
from inferd.core.registry import ModelState
from inferd.core.request_window import WindowTotals
from inferd.core.statistics import LATENCY_BUCKETS_S, Histogram, RequestPhases, ServingStatistics, VersionStatistics
from inferd.server.tls import TlsFiles

ModelStates = Callable[[], list[tuple[str, str, ModelState]]]
Load = Callable[[], list[tuple[str, str, int, int]]]
Memory = Callable[[], list[tuple[str, int]]]
# (endpoint, variant, the variant's requests since it was set)
EndpointTotals = Callable[[], list[tuple[str, str, str, WindowTotals]]]
AsyncBacklog = Callable[[], list[Backlog]]

# metric name, help, the histogram of one door's requests it shows (labels: model, version, protocol)
_REQUEST_HISTOGRAMS: tuple[tuple[str, str, Callable[[RequestPhases], Histogram]], ...] = (
    (
        "inferd_request_duration_seconds",
        "Successful requests, by the door they came by: from the start of decoding to a result, in seconds.",
        lambda s: s.duration,
    ),
    (
        "inferd_request_decode_duration_seconds",
        "Successful requests, by the door they came by: parsing the body or message, in seconds.",
        lambda s: s.decode,
    ),
    (
        "inferd_request_queue_duration_seconds",
        "Successful requests, by the door they came by: waiting for a free instance, in seconds.",
        lambda s: s.queue,
    ),
    (
        "inferd_request_batch_wait_duration_seconds",
        "Successful requests, by the door they came by: waiting, with an instance free, for the batch to fill, "
        "in seconds.",
        lambda s: s.batch_wait,
    ),
    (
        "inferd_request_compute_duration_seconds",
        "Successful requests, by the door they came by: merging, running and splitting the batch each was part "
        "of, in seconds.",
        lambda s: s.compute,
    ),
    (
        "inferd_request_encode_duration_seconds",
        "Successful requests, by the door they came by: writing the response, in seconds.",
        lambda s: s.encode,
    ),
)
# metric name, help, the VersionStatistics histogram it shows (labels: model, version): an
# execution serves requests of any door, so these have no protocol.
_EXECUTION_HISTOGRAMS: tuple[tuple[str, str, Callable[[VersionStatistics], Histogram]], ...] = (
    ("inferd_batch_size", "Rows per execution of the model (one request or a merged batch).", lambda s: s.batch_size),
    (
        "inferd_execution_duration_seconds",
        "Time per execution of the model, in seconds (its count is the number of executions).",
        lambda s: s.execution,
    ),
)

# Shadows' series, each a ServingStatistics dict of label values -> count or value:
# (family, metric name, help, labels, the dict).
_SHADOW_SERIES: tuple[
    tuple[Any, str, str, tuple[str, ...], Callable[[ServingStatistics], Mapping[Any, float]]], ...
] = (
    (
        CounterMetricFamily,
        "inferd_shadow_requests",
        "Copies of endpoints' requests sent to their shadow variants, by outcome (success or the error code).",
        ("endpoint", "shadow", "outcome"),
        lambda s: s.shadow_outcomes,
    ),
    (
        CounterMetricFamily,
        "inferd_shadow_dropped",
        "Copies not sent because the shadow had as many copies waiting and running as it may.",
        ("endpoint", "shadow"),
        lambda s: s.shadow_drops,
    ),
    (
        CounterMetricFamily,
        "inferd_shadow_comparisons",
        "Shadow answers compared with the primary's, by result: agree (every output within inferd validate's "
        "default tolerances) or differ.",
        ("endpoint", "shadow", "result"),
        lambda s: s.shadow_comparisons,
    ),
    (
        GaugeMetricFamily,
        "inferd_shadow_max_abs_diff",
        "The largest |diff| between a shadow's output and the primary's seen so far, by output.",
        ("endpoint", "shadow", "output"),
        lambda s: s.shadow_max_abs_diff,
    ),
)


def serve_metrics(
    statistics: ServingStatistics,
    model_states: ModelStates,
    load: Load,
    memory: Memory,
    endpoint_totals: EndpointTotals,
    async_backlog: AsyncBacklog,
    host: str,
    port: int,
    *,
    budget_bytes: int | None = None,
    tls: TlsFiles | None = None,
    at_zero: Callable[[], list[str]] = list,
) -> Any:
    """Start the /metrics listener on a daemon thread; returns the server (has `.shutdown()`).
    With `tls`, HTTPS (and client certificates when it names a client CA), as the other ports."""
    registry = CollectorRegistry()
    registry.register(
        _Exposition(statistics, model_states, load, memory, endpoint_totals, async_backlog, budget_bytes, at_zero)
    )
    if tls is None:
        server, _thread = start_http_server(port, addr=host, registry=registry)
        return server
    server, _thread = start_http_server(
        port,
        addr=host,
        registry=registry,
        certfile=str(tls.cert),
        keyfile=str(tls.key),
        client_cafile=str(tls.client_ca) if tls.client_ca is not None else None,
        client_auth_required=tls.client_ca is not None,
        tls_min_version=ssl.TLSVersion.TLSv1_2,
    )
    return server


@dataclass(frozen=True, slots=True)
class MetricDescription:
    """One metric the exposition serves, as /metrics names it (a counter with `_total`)."""

    name: str
    kind: str  # counter, gauge or histogram
    labels: tuple[str, ...]
    documentation: str


def metric_descriptions() -> list[MetricDescription]:
    """Every metric /metrics can serve (`--model-memory-budget`'s gauge included), read from the
    exposition itself over empty statistics: the docs' reference is generated from it, so it cannot
    list a metric the server does not serve, or miss one."""
    empty = _Exposition(ServingStatistics(), list, list, list, list, list, budget_bytes=0)
    return [
        MetricDescription(
            family.name + ("_total" if family.type == "counter" else ""),
            family.type,
            tuple(getattr(family, "_labelnames", ())),
            family.documentation,
        )
        for family in empty.collect()
    ]


class _Exposition(Collector):
    def __init__(
        self,
        statistics: ServingStatistics,
        model_states: ModelStates,
        load: Load,
        memory: Memory,
        endpoint_totals: EndpointTotals,
        async_backlog: AsyncBacklog,
        budget_bytes: int | None,
        at_zero: Callable[[], list[str]] = list,
    ) -> None:
        """`at_zero`: the models scaled to zero now."""
        self._statistics = statistics
        self._at_zero = at_zero
        self._endpoint_totals = endpoint_totals
        self._async_backlog = async_backlog
        self._model_states = model_states
        self._load = load
        self._memory = memory
        self._budget_bytes = budget_bytes

    def collect(self) -> Iterator[Any]:
        snapshot = sorted(self._statistics.snapshot().items())
        requests = CounterMetricFamily(
            "inferd_requests",
            "Inference requests finished, by the door they came by (protocol: kserve_http, kserve_grpc, "
            "tfserving_rest, tfserving_grpc, sagemaker, openai, torchserve; ensemble for an ensemble's steps) "
            "and outcome (success or the error code).",
            labels=["model", "version", "protocol", "outcome"],
        )
        for (model, version), stats in snapshot:
            for (protocol, outcome), count in sorted(stats.outcomes.items()):
                requests.add_metric([model, version, protocol, outcome], count)
        yield requests
        unresolved = CounterMetricFamily(
            "inferd_unresolved_requests",
            "Inference requests that named no loaded model version (an unknown model or version, or one not "
            "ready), by outcome; counted apart from any model so that unknown names add no series.",
            labels=["protocol", "outcome"],
        )
        for (protocol, outcome), count in sorted(dict(self._statistics.unresolved).items()):
            unresolved.add_metric([protocol, outcome], count)
        yield unresolved
        yield from self._endpoints()
        yield from self._response_cache(snapshot)
        yield from self._async_jobs()
        yield from self._model_management()
        for name, documentation, phase_of in _REQUEST_HISTOGRAMS:
            family = HistogramMetricFamily(name, documentation, labels=["model", "version", "protocol"])
            for (model, version), stats in snapshot:
                for protocol, phases in sorted(stats.phases.items()):
                    histogram = phase_of(phases)
                    family.add_metric([model, version, protocol], _cumulative_buckets(histogram), histogram.total)
            yield family
        for name, documentation, histogram_of in _EXECUTION_HISTOGRAMS:
            family = HistogramMetricFamily(name, documentation, labels=["model", "version"])
            for (model, version), stats in snapshot:
                histogram = histogram_of(stats)
                family.add_metric([model, version], _cumulative_buckets(histogram), histogram.total)
            yield family
        states = GaugeMetricFamily(
            "inferd_model_state", "1 for the state each model version is in.", labels=["model", "version", "state"]
        )
        for model, version, state in self._model_states():
            states.add_metric([model, version, state.value], 1.0)
        yield states
        in_flight = GaugeMetricFamily(
            "inferd_requests_in_flight",
            "Requests being served by each model version now (queued, waiting or executing).",
            labels=["model", "version"],
        )
        depths = GaugeMetricFamily(
            "inferd_queue_depth", "Requests waiting in each batching model's queue.", labels=["model", "version"]
        )
        for model, version, active, queued in self._load():
            in_flight.add_metric([model, version], float(active))
            depths.add_metric([model, version], float(queued))
        yield in_flight
        yield depths

    def _response_cache(self, snapshot: list[tuple[tuple[str, str], VersionStatistics]]) -> Iterator[Any]:
        hits = CounterMetricFamily(
            "inferd_cache_hits", "Requests the response cache answered, by model.", labels=["model"]
        )
        misses = CounterMetricFamily(
            "inferd_cache_misses",
            "Requests to models that cache whose answer the response cache did not have (the model ran), by model.",
            labels=["model"],
        )
        by_model: dict[str, list[float]] = {}
        for (model, _), stats in snapshot:
            counts = by_model.setdefault(model, [0, 0])
            counts[0] += stats.cache_hits[0]
            counts[1] += stats.cache_misses[0]
        for model, (hit, missed) in sorted(by_model.items()):
            if hit or missed:
                hits.add_metric([model], hit)
                misses.add_metric([model], missed)
        yield hits
        yield misses
        evictions = CounterMetricFamily(
            "inferd_cache_evictions", "Answers that left the response cache for its byte budget, by model.",
            labels=["model"],
        )  # fmt: skip
        for model, count in sorted(dict(self._statistics.cache_evictions).items()):
            evictions.add_metric([model], count)
        yield evictions
        yield GaugeMetricFamily(
            "inferd_cache_bytes",
            "What the response cache's local entries hold now (outputs, keys and overhead), within its "
            "--cache-config size.",
            value=float(self._statistics.cache_bytes),
        )
        yield CounterMetricFamily(
            "inferd_cache_redis_errors",
            "Commands of the response cache's Redis tier that failed or timed out (each a miss), and entries "
            "there that did not read.",
            value=self._statistics.cache_redis_errors,
        )

    def _endpoints(self) -> Iterator[Any]:
        statistics = self._statistics
        requests = CounterMetricFamily(
            "inferd_endpoint_requests",
            "Inference requests to endpoints, by the variant each was routed to, how (routed: weight, or pinned "
            "by the client) and outcome (success or the error code); each is also counted under its variant's "
            "model in inferd_requests_total.",
            labels=["endpoint", "variant", "routed", "outcome"],
        )
        variants = self._endpoint_totals()
        for endpoint, variant, routed, totals in variants:
            for outcome, count in sorted(totals.outcomes.items()):
                requests.add_metric([endpoint, variant, routed, outcome], count)
        yield requests
        durations = HistogramMetricFamily(
            "inferd_endpoint_request_duration_seconds",
            "Successful requests to endpoints, by variant and how routed: from the start of decoding to a result, "
            "in seconds.",
            labels=["endpoint", "variant", "routed"],
        )
        for endpoint, variant, routed, totals in variants:
            histogram = Histogram(LATENCY_BUCKETS_S, totals.bucket_counts, totals.seconds_total)
            durations.add_metric([endpoint, variant, routed], _cumulative_buckets(histogram), histogram.total)
        yield durations
        for family_kind, name, documentation, labels, series_of in _SHADOW_SERIES:
            family = family_kind(name, documentation, labels=list(labels))
            for key, value in sorted(dict(series_of(statistics)).items()):
                family.add_metric(list(key), value)
            yield family

    def _async_jobs(self) -> Iterator[Any]:
        backlog = GaugeMetricFamily(
            "inferd_async_backlog",
            "Async inference jobs queued or running, by the model (or endpoint) they were submitted to.",
            labels=["model"],
        )
        oldest = GaugeMetricFamily(
            "inferd_async_oldest_age_seconds",
            "How long the oldest async inference job queued or running for the model has waited since its submit.",
            labels=["model"],
        )
        for entry in self._async_backlog():
            backlog.add_metric([entry.model], float(entry.jobs))
            oldest.add_metric([entry.model], entry.oldest_age_s)
        yield backlog
        yield oldest

    def _model_management(self) -> Iterator[Any]:
        statistics = self._statistics
        phases = HistogramMetricFamily(
            "inferd_model_load_duration_seconds",
            "Model version loads that succeeded: seconds per phase (fetch: files to local disk; session: "
            "runtime sessions created; warmup: warm-up samples and placement timing), by cause (load, or "
            "cold_start: the first request after the model was scaled to zero).",
            labels=["phase", "cause"],
        )
        for (cause, phase), histogram in statistics.load_phases.items():
            copied = histogram.copy()
            phases.add_metric([phase, cause], _cumulative_buckets(copied), copied.total)
        yield phases
        loads = CounterMetricFamily("inferd_model_loads", "Model version loads, by outcome.", labels=["outcome"])
        for outcome, count in dict(statistics.loads).items():
            loads.add_metric([outcome], count)
        yield loads
        yield CounterMetricFamily("inferd_model_unloads", "Models unloaded.", value=statistics.unloads)
        yield CounterMetricFamily(
            "inferd_model_evictions", "Models unloaded to make room under the budget.", value=statistics.evictions
        )
        yield CounterMetricFamily(
            "inferd_model_scaled_to_zero",
            "Models unloaded because they stayed idle for their idle_unload_seconds (each also counts as an unload).",
            value=statistics.scaled_to_zero,
        )
        at_zero = GaugeMetricFamily(
            "inferd_model_at_zero",
            "1 for each model scaled to zero now (its next request loads it: a cold start).",
            labels=["model"],
        )
        for model in self._at_zero():
            at_zero.add_metric([model], 1.0)
        yield at_zero
        on_demand = CounterMetricFamily(
            "inferd_model_on_demand_requests",
            "With on-demand loading: requests that found their model loaded (hit) or loaded it (miss).",
            labels=["result"],
        )
        for result, count in dict(statistics.on_demand).items():
            on_demand.add_metric([result], count)
        yield on_demand
        memory = GaugeMetricFamily(
            "inferd_model_memory_bytes",
            "Estimated resident memory of each loaded model (its runtime's estimate from its files).",
            labels=["model"],
        )
        for model, size in self._memory():
            memory.add_metric([model], float(size))
        yield memory
        if self._budget_bytes is not None:
            yield GaugeMetricFamily(
                "inferd_model_memory_budget_bytes", "The --model-memory-budget.", value=float(self._budget_bytes)
            )


def _cumulative_buckets(histogram: Histogram) -> list[tuple[str, float]]:
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    return buckets

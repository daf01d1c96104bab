"""OpenTelemetry traces of inference requests: the spans, and core's tracing hooks implemented.

Imported only when the server traces (`config.tracing`); with tracing off nothing imports this
module, so OpenTelemetry is not even loaded. The one inference call (`server.inference_call`)
begins a request's trace where it arrives, continuing the client's W3C traceparent (HTTP headers,
gRPC metadata: a stream's, for each of its requests), and carries it on the requests' timing;
core reports through `inferd.core.tracing` which request the service took and which execution
served it.

Spans, per traced request:

    infer {model}        SERVER, child of the client's span when it sent a traceparent
      decode             the door reading the body into tensors
      queue              waiting for a free instance
      batch-wait         an instance free, waiting for the batch to fill
      compute            merge, run, split; linked to the execution span
      encode             the door writing the answer
    execute {model}      one execution of the model (a batch, or one request alone): a root span
                         of its own trace, linked to the span of every request it served

The children are made when the request ends, from the `RequestTiming` that metrics and
Server-Timing read (so nothing is timed twice), placed on the wall clock from three anchors: when
the request arrived, when its execution was dispatched and finished, and when the request ended.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from inferd import __version__
from inferd.config.tracing import TraceExporter, TracingSettings
from inferd.types import InferRequest, RequestContext, RequestTiming

logger = logging.getLogger("inferd.tracing")

Attributes = Mapping[str, AttributeValue]

_PROPAGATOR = TraceContextTextMapPropagator()
_EMPTY = Context()  # an execution's span has no parent, whichever span the task is in


@dataclass(frozen=True, slots=True)
class _Execution:
    """The execution that served one request: its span, and when it ran (wall clock, ns)."""

    context: SpanContext
    version: int
    dispatched_ns: int
    finished_ns: int


@dataclass(eq=False, slots=True)
class RequestTrace:
    """One traced request: its span (started when it arrived, ended by the edge), the requests the
    service took for it (one, or several for a door that splits a body, as OpenAI's does) and the
    executions that served them."""

    span: Span
    started_ns: int
    requests: list[InferRequest] = field(default_factory=list)
    executions: list[tuple[RequestTiming, _Execution]] = field(default_factory=list)

    def execution_of(self, timing: RequestTiming) -> _Execution | None:
        for known, execution in self.executions:
            if known is timing:
                return execution
        return None


class Tracing:
    """The server's tracer: implements core's `RequestTracer`, and begins and ends request spans
    for the edges."""

    def __init__(self, provider: TracerProvider, sample_ratio: float = 1.0) -> None:
        """`provider` must sample every root span and follow parents' decisions (see `start`)."""
        self._provider = provider
        self._tracer = provider.get_tracer("inferd", __version__)
        self._sample_ratio = sample_ratio

    @classmethod
    def start(cls, settings: TracingSettings) -> Tracing:
        """A tracer exporting as `settings` say, through a batch span processor (spans leave on
        its own thread, in batches, never on the request's path)."""
        # A client's decision (traceparent's flags) is followed; a request that comes without one
        # is drawn at the ratio by `begin` before any span is made, so that one not sampled costs
        # a random number. Every other root span is an execution serving a sampled request: kept.
        sampler = ParentBased(root=ALWAYS_ON)
        resource = Resource.create({SERVICE_NAME: settings.service_name, SERVICE_VERSION: __version__})
        provider = TracerProvider(resource=resource, sampler=sampler)
        for exporter in settings.exporters:
            processor: SpanProcessor = BatchSpanProcessor(_exporter(exporter, settings))
            provider.add_span_processor(processor)
        logger.info(
            "tracing: exporting to %s, sampling %g of the requests without a traceparent",
            ", ".join(_describe(exporter, settings) for exporter in settings.exporters),
            settings.sample_ratio,
        )
        return cls(provider, settings.sample_ratio)

    def shutdown(self) -> None:
        """Export the spans still queued, then stop (blocking: call off the event loop)."""
        self._provider.shutdown()

    # -- the edges -----------------------------------------------------------------------------

    def begin(
        self, traceparent: str | None, tracestate: str | None, model: str, attributes: Attributes
    ) -> RequestTrace | None:
        """The trace of a request for `model` ("" when the edge cannot tell yet) arriving now,
        continuing the client's `traceparent`; None when it is not sampled (nothing more is then
        spent on it)."""
        started_ns = time.time_ns()
        parent = None
        if traceparent:
            carrier = {"traceparent": traceparent, "tracestate": tracestate or ""}
            parent = _PROPAGATOR.extract(carrier)
            if not trace.get_current_span(parent).get_span_context().is_valid:
                parent = None  # a malformed traceparent is ignored, as W3C says: a trace of its own
        if parent is None and self._sample_ratio < 1.0 and random.random() >= self._sample_ratio:
            return None
        span = self._tracer.start_span(
            f"infer {model}" if model else "infer",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={**attributes, "inferd.model.name": model} if model else attributes,
            start_time=started_ns,
        )
        if not span.is_recording():
            return None
        return RequestTrace(span, started_ns)

    def end(self, request_trace: RequestTrace, attributes: Attributes, error_code: str = "", message: str = "") -> None:
        """The request was answered now (`error_code`: inferd's ErrorCode value when it failed):
        its children are made from its timing, and its span ends."""
        ended_ns = time.time_ns()
        span = request_trace.span
        span.set_attributes(attributes)
        parent = trace.set_span_in_context(span)
        for request in request_trace.requests:
            self._children(request_trace, request.context.timing, parent, ended_ns)
        if request_trace.requests:
            span.update_name(f"infer {request_trace.requests[0].model_name}")
            span.set_attributes(_request_attributes(request_trace))
        if error_code:
            span.set_attribute("inferd.error.code", error_code)
            span.set_attribute("error.type", error_code)
            span.set_status(Status(StatusCode.ERROR, message))
        span.end(end_time=ended_ns)
        # The request and its trace point at each other: part now, so that its tensors are freed
        # when the door drops the request, not at the next garbage collection.
        for request in request_trace.requests:
            request.context.trace = None
        request_trace.requests.clear()
        request_trace.executions.clear()

    # -- core's hooks (inferd.core.tracing) ------------------------------------------------------

    def request_started(self, request: InferRequest) -> None:
        # The call (server.inference_call) put its trace on the context of each request it decoded;
        # an ensemble's step requests have contexts of their own, without one: the ensemble's work.
        request_trace = request.context.trace
        if isinstance(request_trace, RequestTrace):
            request_trace.requests.append(request)

    def executions(self, model: str, version: int) -> _VersionExecutions:
        return _VersionExecutions(self, model, version)

    def execution(
        self, model: str, version: int, traces: Sequence[RequestTrace], rows: int, requests: int, started_ns: int
    ) -> Span:
        links = [Link(t.span.get_span_context()) for t in traces]
        attributes: dict[str, AttributeValue] = {
            "inferd.model.name": model,
            "inferd.model.version": str(version),
            "inferd.batch.size": rows,
            "inferd.batch.requests": requests,
        }
        return self._tracer.start_span(
            f"execute {model}", context=_EMPTY, attributes=attributes, links=links, start_time=started_ns
        )

    # -- a request's children ------------------------------------------------------------------

    def _children(self, request_trace: RequestTrace, timing: RequestTiming, parent: Context, ended_ns: int) -> None:
        started_ns = request_trace.started_ns
        if timing.decode_s:
            self._child("decode", parent, started_ns, started_ns + _ns(timing.decode_s))
        execution = request_trace.execution_of(timing)
        if execution is not None:
            # Queue, then batch-wait, up to the dispatch; compute from the dispatch. What is left
            # of the execution span past compute is the hop to a worker thread and back.
            waited_ns = execution.dispatched_ns - _ns(timing.batch_wait_s)
            self._child("queue", parent, waited_ns - _ns(timing.queue_s), waited_ns)
            self._child("batch-wait", parent, waited_ns, execution.dispatched_ns)
            computed_ns = execution.dispatched_ns + _ns(timing.compute_s)
            self._child("compute", parent, execution.dispatched_ns, computed_ns, [Link(execution.context)])
        elif timing.batch_rows:
            # Served without an execution the tracer saw (a sequence's slot, an ensemble's steps):
            # the split placed just before the encoding.
            computed_ns = ended_ns - _ns(timing.encode_s)
            dispatched_ns = computed_ns - _ns(timing.compute_s)
            waited_ns = dispatched_ns - _ns(timing.batch_wait_s)
            self._child("queue", parent, waited_ns - _ns(timing.queue_s), waited_ns)
            self._child("batch-wait", parent, waited_ns, dispatched_ns)
            self._child("compute", parent, dispatched_ns, computed_ns)
        if timing.encode_s:
            self._child("encode", parent, ended_ns - _ns(timing.encode_s), ended_ns)

    def _child(
        self, name: str, parent: Context, started_ns: int, ended_ns: int, links: list[Link] | None = None
    ) -> None:
        span = self._tracer.start_span(name, context=parent, links=links, start_time=started_ns)
        span.end(end_time=max(started_ns, ended_ns))


@dataclass(frozen=True, slots=True)
class _VersionExecutions:
    """Core's `ExecutionTracer` for one model version."""

    tracing: Tracing
    model: str
    version: int

    def executed(
        self,
        contexts: Sequence[RequestContext],
        rows: int,
        dispatched_ago_s: float,
        finished_ago_s: float,
        failed: bool,
    ) -> None:
        traces: list[RequestTrace] = []
        for context in contexts:
            request_trace = context.trace
            if isinstance(request_trace, RequestTrace) and request_trace not in traces:
                traces.append(request_trace)
        if not traces:
            return
        now_ns = time.time_ns()
        dispatched_ns, finished_ns = now_ns - _ns(dispatched_ago_s), now_ns - _ns(finished_ago_s)
        span = self.tracing.execution(self.model, self.version, traces, rows, len(contexts), dispatched_ns)
        if failed:
            span.set_status(Status(StatusCode.ERROR, "the execution failed"))
        span.end(end_time=finished_ns)
        execution = _Execution(span.get_span_context(), self.version, dispatched_ns, finished_ns)
        for context in contexts:
            if isinstance(context.trace, RequestTrace):
                context.trace.executions.append((context.timing, execution))


def _request_attributes(request_trace: RequestTrace) -> dict[str, AttributeValue]:
    first = request_trace.requests[0]
    attributes: dict[str, AttributeValue] = {
        "inferd.model.name": first.model_name,
        "inferd.protocol": first.context.door,
        "inferd.request.id": first.context.request_id,
        "inferd.request.rows": sum(r.context.timing.rows for r in request_trace.requests),
    }
    execution = request_trace.execution_of(first.context.timing)
    if execution is not None:
        attributes["inferd.model.version"] = str(execution.version)
    elif first.model_version:
        attributes["inferd.model.version"] = first.model_version
    if first.context.timing.batch_rows:
        attributes["inferd.batch.size"] = first.context.timing.batch_rows
    return attributes


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _exporter(kind: TraceExporter, settings: TracingSettings) -> SpanExporter:
    if kind is TraceExporter.CONSOLE:
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.otlp_endpoint)


def _describe(kind: TraceExporter, settings: TracingSettings) -> str:
    if kind is TraceExporter.CONSOLE:
        return "the console"
    return f"OTLP/gRPC {settings.otlp_endpoint or '(from OTEL_EXPORTER_OTLP_*)'}"

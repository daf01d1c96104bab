"""`OtlpReceiver`: a real OTLP/gRPC trace receiver on 127.0.0.1, as a collector is, keeping the spans
it is sent, for the tracing tests and benchmarks (needs the `tracing` extra's opentelemetry-proto)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, ids in lowercase hex as in a traceparent."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    """The OTLP enum: 1 internal, 2 server."""
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    """(trace id, span id) of each linked span."""
    status_code: int
    """The OTLP enum: 0 unset, 1 ok, 2 error."""
    status_message: str
    trace_state: str
    service_name: str


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Started on a free port of 127.0.0.1 when made; `keep=False` only counts the spans (a
    benchmark's long runs)."""

    def __init__(self, keep: bool = True) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.count = 0
        self.exports = 0
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        received: list[ReceivedSpan] = []
        count = 0
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                count += len(scope_spans.spans)
                if self._keep:
                    received.extend(_span(span, service) for span in scope_spans.spans)
        with self._lock:
            self._spans.extend(received)
            self.count += count
            self.exports += 1
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30.0, what: str = "the spans"
    ) -> list[ReceivedSpan]:
        """The spans received once `found(spans)` holds (polled every 10 ms, for `timeout_s` at most)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.name, s.trace_id[:8]) for s in spans})
                raise AssertionError(f"{what} never arrived within {timeout_s} s; received {names}")
            time.sleep(0.01)

    def close(self) -> None:
        self._server.stop(grace=None)

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _span(span: Any, service: str) -> ReceivedSpan:
    return ReceivedSpan(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        name=span.name,
        kind=span.kind,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_attributes(span.attributes),
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
        status_code=span.status.code,
        status_message=span.status.message,
        trace_state=span.trace_state,
        service_name=service,
    )


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None

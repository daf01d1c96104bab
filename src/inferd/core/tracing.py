"""What core tells a tracer, and nothing more: the seam between core and OpenTelemetry.

Core knows no tracing library, no span and no wire header. It calls two hooks, both only when the
server traces (the tracer is None otherwise, and each call site is one `is not None` test):

* `RequestTracer.request_started(request)`: the service took a request. The server's tracer
  finds the trace its edge began for it (the W3C traceparent, the request span) and puts a handle
  on `request.context.trace`, which core carries along without looking inside.
* `ExecutionTracer.executed(...)`: a model version ran one execution for these requests (a batch
  of several, or one alone), with when it was dispatched and when it finished. The tracer makes
  the execution its own span, linked to the spans of the requests it served.

Times are given as "seconds ago" on the caller's own clock (the batcher's injected monotonic
clock, or perf_counter), so that core never converts clocks and the tracer reads the wall clock
once per execution. The time split itself (decode, queue, batch-wait, compute, encode) is the
`RequestTiming` that metrics and Server-Timing already read: nothing is timed twice.

The implementation lives in `inferd.server.tracing`; see docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from inferd.types import InferRequest, RequestContext


class ExecutionTracer(Protocol):
    """The tracer of one model version's executions."""

    def executed(
        self,
        contexts: Sequence[RequestContext],
        rows: int,
        dispatched_ago_s: float,
        finished_ago_s: float,
        failed: bool,
    ) -> None:
        """One execution of `rows` rows served the requests of `contexts` (their timing split
        already written); it was dispatched `dispatched_ago_s` and finished `finished_ago_s` seconds ago;
        `failed`: it answered every request with an error."""
        ...


class RequestTracer(Protocol):
    def request_started(self, request: InferRequest) -> None:
        """The service took `request` (any door, before its model is looked up)."""
        ...

    def executions(self, model: str, version: int) -> ExecutionTracer:
        """The tracer a loaded version's batcher and handle report executions to."""
        ...

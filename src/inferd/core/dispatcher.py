"""`Dispatcher`: a request to the scheduler of the version that serves it, counted. Below the service,
above the schedulers.

Every inference goes through it: the service's requests, whatever door they came by, and each
step of an ensemble, which is a request to its step model made by the `EnsembleHandle` (its
`infer_step` is the dispatcher's `infer`: a call down, never back into the service). A request
finds its handle one way: `lookup`, one dict read of the catalogue's snapshot, and on a miss
`lease`, which loads the model on demand (with a memory budget) or raises the error that says why
nothing serves. The handle is not a stop of its own: the dispatcher counts the request into it
(for drains), validates it into the `Work` every scheduler takes, submits it to the scheduler the
version chose at load and makes the answer from the runtime's outputs; an ensemble's handle runs
its steps, each sent back down to `infer`. It is counted once when it ends: under its model
version (`finished`), or, when it resolved to no version, in one bounded series per door and
error code (`failed`), so names made up by clients cannot grow the statistics. The tracer hears
of it when it starts.

A client's request (a door's, through `server.inference_call`) is `infer`'s with the server's
limits: held to them on the request and the answer, and given the classification it asks for; an
ensemble's step is `infer`'s without (the ensemble's own work). One path for both, so a fix
cannot miss a copy; `shed` refuses a full queue before a door decodes the body.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from inferd.config.model import ModelConfig
from inferd.core import classification
from inferd.core.budget import MemoryBudget
from inferd.core.catalogue import Catalogue
from inferd.core.ensemble import EnsembleHandle
from inferd.core.ensemble_loading import check_steps_serving
from inferd.core.handle import Handle, ModelHandle
from inferd.core.metrics import Metrics
from inferd.core.request_window import SUCCESS
from inferd.core.response_cache import CACHE_CONTROL_PARAMETER, NO_CACHE, ResponseCache, ensemble_key
from inferd.core.scheduler import ADMISSION_PARAMETER, REALTIME_RECENT_S, Admission, prepare_work
from inferd.core.tracing import RequestTracer
from inferd.core.validation import answer
from inferd.errors import InferdError, InvalidRequestError, StreamOnlyModelError
from inferd.limits import RequestLimits, check_request_size, check_response_size
from inferd.types import EndpointRoute, InferRequest, InferResponse, RequestTiming

# Background requests of clients to one model that run at once while real-time requests keep coming.
BACKGROUND_TURNS = 1

# Loads a model a request names when it is in the repository but not loaded (core.lifecycle).
OnDemandLoad = Callable[[str], Awaitable[None]]


class Dispatcher:
    def __init__(
        self,
        catalogue: Catalogue,
        metrics: Metrics,
        tracer: RequestTracer | None = None,
        *,
        budget: MemoryBudget | None = None,
        load_on_demand: OnDemandLoad | None = None,
        resting: Callable[[str], bool] = lambda name: False,
        response_cache: ResponseCache | None = None,
    ) -> None:
        """`metrics`: where requests are counted; `tracer`: hears of every request when the server
        traces; `budget`: given when models load on a request's demand under a memory budget;
        `load_on_demand`: loads a model that a request names and that does not serve, when it may
        (scaled to zero, or under the budget; core.lifecycle); `resting`: whether a model rests (its
        next request loads it); `response_cache`: answers clients' requests to models that cache."""
        self._catalogue = catalogue
        self.response_cache = response_cache
        self._metrics = metrics
        self.tracer = tracer
        self._budget = budget
        self._load_on_demand = load_on_demand
        self._resting = resting
        # When (perf_counter) a real-time request a model serves last began, whichever model:
        # async jobs hold back while they keep coming (core.async_inference).
        self.realtime_started_s = -math.inf
        # While they keep coming, the background requests clients send to a model (a batch job's
        # mini-batches, async jobs' replays) take turns: BACKGROUND_TURNS at a time per model. A
        # background request is the server's work beyond its execution (its body read, decoded,
        # its answer encoded, on the event loop), which the schedulers' background queues do not
        # bound: a batch job of 4 connections raised a tiny model's online p99 1.59x at half load,
        # 1.10-1.28x taking turns (benchmarks/batch_online.py). Per model: one waiting in a busy
        # model's background queue holds up no other model's.
        self._background_turns: dict[str, asyncio.Semaphore] = {}

    # -- the handle for a request ------------------------------------------------------------------

    def lookup(self, name: str, version: str) -> Handle | None:
        """The hot path: the handle serving (name, version) now, or None (then `lease` says why)."""
        handle = self._catalogue.snapshot.serving.get((name, version))
        if handle is not None and self._budget is not None:
            self._budget.touch(name)
            self._metrics.on_demand_hit()
        return handle

    async def lease(self, name: str, version: str) -> Handle:
        """The handle serving (name, version), loading the model first when on-demand loading is on
        and the model is in the repository but not loaded (concurrent callers share the one load);
        else the error that says why there is none."""
        handle = self.lookup(name, version)
        if handle is not None:
            return handle
        if self._load_on_demand is not None:
            await self._load_on_demand(name)
        return self.ready_handle(name, version)

    def ready_handle(self, name: str, version: str) -> Handle:
        """The ready handle serving (name, version) without loading anything, or the error that
        says why there is none (an ensemble: which of its step models does not serve)."""
        found = self._catalogue.ready_handle(name, version)
        # With a budget, a step model that was evicted loads again on the step's demand.
        if isinstance(found, EnsembleHandle) and self._budget is None:
            check_steps_serving(found, self._catalogue.snapshot.serving, self._catalogue.ready_handle, self._resting)
        return found

    # -- a request's count -------------------------------------------------------------------------

    def finished(self, request: InferRequest, handle: Handle, outcome: str, started_s: float) -> None:
        """`request`, served by `handle` since `started_s` (perf_counter), ended with `outcome`
        ("success" or an ErrorCode value). Counted from the start of decoding, as Triton counts
        from the request's arrival."""
        context = request.context
        timing = context.timing
        elapsed_s = time.perf_counter() - started_s + timing.decode_s
        self._metrics.request_finished(
            request.model_name, str(handle.version), context.door, outcome, elapsed_s, timing.rows, timing
        )
        route = context.route
        if route is not None:  # counted under its variant too: its window, which /metrics reads
            if outcome == SUCCESS:  # C's work alone: no Python frame on every request to an endpoint
                route.succeeded([route.clock(), elapsed_s])
            else:
                route.observe(elapsed_s, outcome)

    def failed(self, request: InferRequest, handle: Handle | None, exc: InferdError, started_s: float) -> None:
        """`request` ended with `exc`; `handle` is None when it resolved to no model version."""
        exc.request_id = exc.request_id or request.context.request_id
        if handle is None:
            # Any client can name models that do not exist: such requests share one bounded
            # series, so they cannot grow the statistics (or /metrics) without limit.
            self._metrics.request_unresolved(request.context.door, exc.code.value)
            if request.context.route is not None:  # a variant whose model does not serve
                request.context.route.observe(time.perf_counter() - started_s, exc.code.value)
        else:
            self.finished(request, handle, exc.code.value, started_s)

    # -- the call ----------------------------------------------------------------------------------

    def shed(self, name: str, version: str, protocol: str, route: EndpointRoute | None = None) -> None:
        """Refuse a request to (name, version) whose model's queue is full, before its body is
        decoded: shedding is what an overloaded server does most, so it must cost the least (the
        decoding, at 4x MiniLM's throughput, was a tenth of the event loop). Counted as the same
        refusal after decoding would be. A model not loaded, or one that may admit it, passes."""
        handle = self._catalogue.snapshot.shedding.get((name, version))
        if handle is None:
            return
        refusal = handle.refusal()
        if refusal is None:
            return
        self._metrics.request_finished(name, str(handle.version), protocol, refusal.code.value, 0.0, 0, RequestTiming())
        if route is not None:
            route.observe(0.0, refusal.code.value)
        raise refusal

    async def infer(
        self, request: InferRequest, limits: RequestLimits | None = None, admission: Admission = Admission.REAL_TIME
    ) -> InferResponse:
        """One response to `request` from the handle that serves it, counted. `limits`: a client's
        request (a door's) is held to the server's limits, on the request and on the answer, and
        gets the classification it asks for; an ensemble's step (None) is the ensemble's own work.
        `admission`: BACKGROUND work runs only in the room real-time requests leave (core.scheduler)."""
        started_s = time.perf_counter()
        if self.tracer is not None:
            self.tracer.request_started(request)
        handle = None
        try:
            classes = _client_request(request, limits) if limits is not None else None
            if request.parameters and admission is Admission.REAL_TIME:
                admission = asked_admission(request)
            handle = self.lookup(request.model_name, request.model_version)
            if handle is None:  # not serving: load on demand, or the error that says why
                handle = await self.lease(request.model_name, request.model_version)
            if handle.config.decoupled:
                raise StreamOnlyModelError(request.model_name)
            if admission is Admission.REAL_TIME:  # a request a model serves (not any a client sends)
                self.realtime_started_s = started_s
            if (
                admission is Admission.BACKGROUND
                and limits is not None
                and started_s - self.realtime_started_s < REALTIME_RECENT_S
            ):
                turns = self._background_turns.get(request.model_name)
                if turns is None:  # one per model served (the names that resolve), made once
                    turns = self._background_turns[request.model_name] = asyncio.Semaphore(BACKGROUND_TURNS)
                async with turns:
                    response = await self._cached_answer(handle, request, admission, limits)
            else:
                response = await self._cached_answer(handle, request, admission, limits)
            if limits is not None:
                response = _client_answer(request, response, classes, handle.config, limits)
        except InferdError as exc:
            self.failed(request, handle, exc, started_s)
            raise
        self.finished(request, handle, SUCCESS, started_s)
        return response

    async def infer_stream(self, request: InferRequest, limits: RequestLimits) -> AsyncIterator[InferResponse]:
        """A client's request's responses as the model makes them (a decoupled model's several, any
        other's one), each held to `limits` as `infer`'s answer is; counted once, when the last is
        sent or an error ends them."""
        started_s = time.perf_counter()
        if self.tracer is not None:
            self.tracer.request_started(request)
        handle = None
        counted = False
        try:
            classes = _client_request(request, limits)
            handle = self.lookup(request.model_name, request.model_version)
            if handle is None:
                handle = await self.lease(request.model_name, request.model_version)
            self.realtime_started_s = started_s
            if isinstance(handle, ModelHandle) and handle.config.decoupled:
                async for response in handle.stream(request):
                    yield _client_answer(request, response, classes, handle.config, limits)
            else:
                response = await self._cached_answer(handle, request, Admission.REAL_TIME, limits)
                yield _client_answer(request, response, classes, handle.config, limits)
        except InferdError as exc:
            counted = True
            self.failed(request, handle, exc, started_s)
            raise
        finally:
            if handle is not None and not counted:  # the last response sent, or the stream left
                self.finished(request, handle, SUCCESS, started_s)

    def _cached_answer(
        self, handle: Handle, request: InferRequest, admission: Admission, limits: RequestLimits | None
    ) -> Awaitable[InferResponse]:
        """`_answer`, through the response cache for a client's request to a model that caches."""
        cache = self.response_cache
        if cache is None or limits is None or not handle.config.response_cache:  # (a step's is its ensemble's)
            return self._answer(handle, request, admission)
        key = self._content_key(handle)
        if key is None:  # a step that does not serve now: run as if there were no cache
            return self._answer(handle, request, admission)
        bypass = request.context.cache_bypass or request.parameters.get(CACHE_CONTROL_PARAMETER) == NO_CACHE
        # An ensemble's answer is kept only if its steps were still the versions it started with.
        unchanged = (lambda: self._content_key(handle) == key) if isinstance(handle, EnsembleHandle) else None
        return cache.answer(
            key, str(handle.version), request, lambda: self._answer(handle, request, admission), bypass, unchanged,
            admission.value,
        )  # fmt: skip

    def _content_key(self, handle: Handle) -> bytes | None:
        """What `handle`'s answers follow: a model's files and config (its `content_key`); an
        ensemble's own config and, step by step, what its steps' serving versions follow now.
        None when a step does not serve."""
        if isinstance(handle, ModelHandle):
            return handle.content_key
        assert isinstance(handle, EnsembleHandle)
        parts = [handle.content_key]
        for planned in handle.plan.steps:
            step = self._catalogue.snapshot.serving.get((planned.step.model_name, planned.step.version_label))
            part = self._content_key(step) if step is not None else None
            if part is None:
                return None
            parts.append(part)
        return ensemble_key(parts)

    @staticmethod
    async def _answer(handle: Handle, request: InferRequest, admission: Admission) -> InferResponse:
        """The one answer of `handle` to `request`, the request counted in and out of the handle
        (a drain waits for it): an ensemble runs its steps, sending each back down to `infer`;
        any other model's request, validated into `Work`, is submitted to the scheduler its
        version chose at load and answered from the runtime's outputs."""
        handle.enter()
        try:
            if isinstance(handle, EnsembleHandle):
                return await handle.infer(request, admission)
            assert isinstance(handle, ModelHandle)
            work = prepare_work(handle.config, request, admission)
            results = await handle.scheduler.submit(work)
            return answer(handle.config, handle.version, request, results, work.output_names, work.rows)
        finally:
            handle.leave()


def asked_admission(request: InferRequest) -> Admission:
    """The admission class a client's request asks with the `inferd_admission` parameter: a
    client may always lower its own (`background`: a batch job's, run only in the room real-time
    requests leave); nothing else raises it."""
    asked = request.parameters.get(ADMISSION_PARAMETER)
    if asked is None or asked == Admission.REAL_TIME.value:
        return Admission.REAL_TIME
    if asked == Admission.BACKGROUND.value:
        return Admission.BACKGROUND
    raise InvalidRequestError(
        f"request parameter '{ADMISSION_PARAMETER}' is {asked!r}: it is "
        f"'{Admission.BACKGROUND.value}' or '{Admission.REAL_TIME.value}'"
    )


# What a client's request asks beyond the model's own outputs (Triton's classification extension),
# and the limits it is held to: one path for `infer` and `infer_stream`, so a stream honours what a
# unary call does.
def _client_request(request: InferRequest, limits: RequestLimits) -> dict[str, int]:
    check_request_size(request.inputs, limits)
    return classification.requested_counts(request) if request.outputs else {}


def _client_answer(
    request: InferRequest,
    response: InferResponse,
    classes: dict[str, int] | None,
    config: ModelConfig,
    limits: RequestLimits,
) -> InferResponse:
    if classes:
        response = classification.classify(response, classes, config)
    check_response_size(request.model_name, response.outputs, limits)
    return response

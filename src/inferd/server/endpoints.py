"""The endpoints API (`/v2/endpoints...`) and its JSON: what `PUT /v2/endpoints/{name}` takes (and
the state directory keeps), and what `GET /v2/endpoints[/{name}]` answers.

    {"variants": [{"name": "blue", "model": "m", "version": "1", "weight": 90},
                  {"name": "green", "model": "m", "version": "2", "weight": 10}],
     "sticky": "X-User-Id"}

Read with pydantic, strictly: an unknown field is a 400 naming it, as is a weight that is not a
number (a typo must not be a silently ignored setting).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from inferd.core.endpoint_control import EndpointControl
from inferd.core.endpoints import Endpoint, EndpointSpec, Shadow, Variant, spec_document
from inferd.core.request_window import WindowSummary, combined_summary
from inferd.core.rollout import Decision, Guards, Rollout, parse_duration
from inferd.core.service import InferenceService
from inferd.core.shadow import ShadowState
from inferd.errors import NotFoundError
from inferd.server.auth import Access
from inferd.server.http import json_response
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.routes import READ, Params, Route
from inferd.server.strict_json import decode_strict


def _integer_as_text(value: Any) -> Any:
    # "2" and 2 alike, as Triton's own APIs take a version.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _integer_as_number(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class _VariantBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    model: str
    version: Annotated[str, BeforeValidator(_integer_as_text)] = ""
    weight: Annotated[float, BeforeValidator(_integer_as_number)] = 1.0


class _ShadowBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    model: str
    version: Annotated[str, BeforeValidator(_integer_as_text)] = ""
    sample: Annotated[float, BeforeValidator(_integer_as_number)] = 1.0
    log: bool = False


class _EndpointBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    variants: list[_VariantBody]
    sticky: str = ""
    shadow: list[_ShadowBody] = []


def decode_endpoint(name: str, body: bytes) -> EndpointSpec:
    """The endpoint a PUT body sets; a 400 saying which field is wrong."""
    parsed = decode_strict(_EndpointBody, f"endpoint '{name}'", body)
    variants = tuple(Variant(v.name, v.model, v.version, v.weight) for v in parsed.variants)
    shadows = tuple(Shadow(s.name, s.model, s.version, s.sample, s.log) for s in parsed.shadow)
    return EndpointSpec(name, variants, parsed.sticky, shadows)


def endpoint_json(endpoint: Endpoint) -> dict[str, Any]:
    """`GET /v2/endpoints/{name}`: the spec; each variant's requests since it was set and over the
    last minute (count, errors, error rate, p50/p99 in milliseconds); each shadow's likewise, with
    its comparisons with the primary answers and its last minute against the variants'."""
    document = spec_document(endpoint.spec)
    for variant in document["variants"]:
        window = endpoint.windows[variant["name"]]
        variant["requests_total"] = window.requests_total
        variant["errors_total"] = window.errors_total
        variant["last_minute"] = _summary_json(window.summary())
    if endpoint.shadows:
        primary = combined_summary(endpoint.windows.values())
        pairs = zip(document["shadow"], endpoint.shadows, strict=True)
        document["shadow"] = [_shadow_json(shadow, state, primary) for shadow, state in pairs]
    return document


def _summary_json(summary: WindowSummary) -> dict[str, Any]:
    return {
        "requests": summary.requests,
        "errors": summary.errors,
        "error_rate": summary.error_rate,
        "p50_ms": summary.p50_ms,
        "p99_ms": summary.p99_ms,
    }


def _shadow_json(document: dict[str, Any], state: ShadowState, primary: WindowSummary) -> dict[str, Any]:
    mine = state.window.summary()

    def delta(a: float | None, b: float | None) -> float | None:
        return a - b if a is not None and b is not None else None

    return {
        **document,
        "state": "off" if state.off_reason else "on",
        "reason": state.off_reason,
        "requests_total": state.window.requests_total,
        "errors_total": state.window.errors_total,
        "dropped_total": state.dropped,
        "compared": state.compared,
        "agreed": state.agreed,
        "agreement": state.agreed / state.compared if state.compared else None,
        "max_abs_diff": dict(state.max_abs_diff),
        "last_minute": _summary_json(mine),
        "against_variants": {
            "error_rate_delta": mine.error_rate - primary.error_rate if mine.requests and primary.requests else None,
            "p50_ms_delta": delta(mine.p50_ms, primary.p50_ms),
            "p99_ms_delta": delta(mine.p99_ms, primary.p99_ms),
        },
        "log": str(state.log.name) if state.log is not None else None,
    }


class EndpointsApi:
    """`/v2/endpoints`: list, read, set (`PUT`, 201 when new) and delete endpoints: the management
    API's, as the repository API is (a management token when tokens are on). Setting and deleting
    change where clients' requests go; reading shows every variant's traffic and errors, which is
    the operator's to see (SageMaker's DescribeEndpoint is a control-plane call too)."""

    def __init__(self, service: InferenceService) -> None:
        self._service = service

    @property
    def _control(self) -> EndpointControl:
        return self._service.endpoints

    def routes(self) -> tuple[Route, ...]:
        return (
            Route("/v2/endpoints", READ, self._list, Access.MANAGEMENT),
            Route("/v2/endpoints/{endpoint}", (*READ, "PUT", "DELETE"), self._one, Access.MANAGEMENT),
        )

    async def _list(self, request: HttpRequest, params: Params) -> HttpResponse:
        return json_response({"endpoints": [endpoint_json(e) for e in self._control.endpoints.by_name.values()]})

    async def _one(self, request: HttpRequest, params: Params) -> HttpResponse:
        name = params["endpoint"]
        if request.method in READ:
            document = endpoint_json(self._control.get(name))
            rollout = self._control.rollouts.current(name)  # the running one, else the last
            document["rollout"] = rollout_json(rollout) if rollout is not None else None
            return json_response(document)
        if request.method == "DELETE":
            await self._control.delete(name)
            return HttpResponse(200)
        endpoint, created = await self._control.set(decode_endpoint(name, request.body))
        return json_response(endpoint_json(endpoint), status=201 if created else 200)


class _RolloutBody(BaseModel):
    """`POST /v2/endpoints/{e}/rollout`; durations as seconds or "5m", "90s", "20ms"."""

    model_config = ConfigDict(extra="forbid", strict=True)

    to: str
    strategy: str = "canary:10"
    bake: str | Annotated[float, BeforeValidator(_integer_as_number)] = 300.0
    min_requests: int = 100
    max_error_rate_delta: Annotated[float, BeforeValidator(_integer_as_number)] = 0.05
    max_p99_ratio: Annotated[float, BeforeValidator(_integer_as_number)] = 1.5
    min_p99_delta: str | Annotated[float, BeforeValidator(_integer_as_number)] = "20ms"
    max_drift: Annotated[float, BeforeValidator(_integer_as_number)] | None = None
    webhook: str = ""


def rollout_json(rollout: Rollout) -> dict[str, Any]:
    """A rollout as the API shows it: its decisions' times in UTC (ISO 8601)."""
    document = rollout.document()
    document["decisions"] = [decision_json(decision) for decision in rollout.decisions]
    document["step"] += 1  # 1-based, as the decisions say it
    document["step_started"] = datetime.fromtimestamp(rollout.step_started, UTC).isoformat(timespec="milliseconds")
    return document


def decision_json(decision: Decision) -> dict[str, Any]:
    """A rollout's decision as the API shows it: its time in UTC (ISO 8601)."""
    return {**asdict(decision), "at": datetime.fromtimestamp(decision.at, UTC).isoformat(timespec="milliseconds")}


class RolloutsApi:
    """`/v2/endpoints/{e}/rollout...`: start, read, promote, abort, history (the management API's)."""

    def __init__(self, service: InferenceService) -> None:
        self._service = service

    def routes(self) -> tuple[Route, ...]:
        return (
            Route("/v2/endpoints/{endpoint}/rollout", (*READ, "POST"), self._rollout, Access.MANAGEMENT),
            Route("/v2/endpoints/{endpoint}/rollout/promote", ("POST",), self._promote, Access.MANAGEMENT),
            Route("/v2/endpoints/{endpoint}/rollout/abort", ("POST",), self._abort, Access.MANAGEMENT),
            Route("/v2/endpoints/{endpoint}/rollout/history", READ, self._history, Access.MANAGEMENT),
        )

    async def _rollout(self, request: HttpRequest, params: Params) -> HttpResponse:
        control = self._service.endpoints
        name = params["endpoint"]
        control.get(name)
        if request.method in READ:
            current = control.rollouts.current(name)
            if current is None:
                raise NotFoundError(
                    f"endpoint '{name}' has had no rollout (POST /v2/endpoints/{name}/rollout starts one)"
                )
            return json_response(rollout_json(current))
        body = decode_strict(_RolloutBody, f"endpoint '{name}'", request.body)
        delta = body.min_p99_delta
        delta_ms = parse_duration(delta) * 1000 if isinstance(delta, str) else delta
        guards = Guards(body.min_requests, body.max_error_rate_delta, body.max_p99_ratio, delta_ms, body.max_drift)
        rollout = await control.start_rollout(
            name, body.to, body.strategy, parse_duration(body.bake), guards, body.webhook
        )
        return json_response(rollout_json(rollout))

    async def _promote(self, request: HttpRequest, params: Params) -> HttpResponse:
        return json_response(rollout_json(await self._service.endpoints.rollouts.promote(params["endpoint"])))

    async def _abort(self, request: HttpRequest, params: Params) -> HttpResponse:
        return json_response(rollout_json(await self._service.endpoints.rollouts.abort(params["endpoint"])))

    async def _history(self, request: HttpRequest, params: Params) -> HttpResponse:
        name = params["endpoint"]
        self._service.endpoints.get(name)
        return json_response({"rollouts": [rollout_json(r) for r in self._service.endpoints.rollouts.history(name)]})

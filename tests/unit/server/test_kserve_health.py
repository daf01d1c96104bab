"""The KServe door's health answers through `HttpApp`: a server that is not ready says so with a
503 whose body carries UNAVAILABLE and the reason (it had no body, so a client could not tell a
starting server from a proxy's 503; found by the OpenAPI conformance test's "no 5xx without a
code" rule)."""

from __future__ import annotations

from typing import cast

import orjson

from inferd.core.service import InferenceService
from inferd.limits import RequestLimits
from inferd.server.http import HttpApp
from inferd.server.http11 import HttpRequest
from inferd.server.kserve import KServeDoor
from inferd.server.routes import Router


class StartingService:
    """What the health routes ask of the service, while the models still load."""

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return False


class ReadyService(StartingService):
    def ready(self) -> bool:
        return True


def health_app(service: StartingService) -> HttpApp:
    group = KServeDoor(cast(InferenceService, service), limits=RequestLimits()).routes()
    return HttpApp(Router([group], fallback=group), max_request_bytes=1024)


async def test_not_ready_is_a_503_with_a_code_and_live_stays_200() -> None:
    app = health_app(StartingService())
    ready = await app(HttpRequest("GET", "/v2/health/ready", b"", {}, b""))
    assert ready.status == 503
    body = orjson.loads(ready.body)
    assert body["code"] == "UNAVAILABLE" and "not ready" in body["error"]
    assert (await app(HttpRequest("GET", "/v2/health/live", b"", {}, b""))).status == 200


async def test_live_and_ready_answer_the_open_inference_protocol_s_bodies() -> None:
    """`{"live": true}` / `{"ready": true}`, which KServe's SDK reads (an empty body raised
    JSONDecodeError there); tritonclient reads the 200."""
    app = health_app(ReadyService())
    for path, body in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True})):
        answer = await app(HttpRequest("GET", path, b"", {}, b""))
        assert answer.status == 200 and orjson.loads(answer.body) == body, path
        assert (b"content-type", b"application/json") in answer.headers

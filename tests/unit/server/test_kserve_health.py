"""The KServe door's health answers through `HttpApp`: a server that is not ready says so with a
503 whose body carries UNAVAILABLE and the reason (it had no body, so a client could not tell a
starting server from a proxy's 503; found by the OpenAPI conformance test's "no 5xx without a
code" rule)."""

from __future__ import annotations

from typing import cast

import orjson

from inferd.core.service import InferenceService
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


async def test_not_ready_is_a_503_with_a_code_and_live_stays_200() -> None:
    group = KServeDoor(cast(InferenceService, StartingService())).routes()
    app = HttpApp(Router([group], fallback=group), max_request_bytes=1024)
    ready = await app(HttpRequest("GET", "/v2/health/ready", b"", {}, b""))
    assert ready.status == 503
    body = orjson.loads(ready.body)
    assert body["code"] == "UNAVAILABLE" and "not ready" in body["error"]
    assert (await app(HttpRequest("GET", "/v2/health/live", b"", {}, b""))).status == 200

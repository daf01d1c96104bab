"""TorchServe's inference API (`POST /predictions/{m}[/{version}]` on the HTTP port, `GET /ping` is
SageMaker's door's) and its management API's read side (`GET /models`, `GET /models/{m}[/{v}|/all]`)
on a port of its own (`--torchserve-management-port`), with errors in TorchServe's shape.

See `protocol.codecs.torchserve` for how a body becomes the model's inputs.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from inferd.core.service import InferenceService
from inferd.errors import MalformedRequestError, NotFoundError
from inferd.limits import RequestLimits
from inferd.protocol import torchserve
from inferd.protocol.codecs.base import Target
from inferd.protocol.codecs.kserve import KServeHttpCodec
from inferd.protocol.codecs.torchserve import TorchServeCodec
from inferd.server.http import json_response
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.inference_call import InferenceCall
from inferd.server.openapi import MANAGEMENT_DOCUMENT_PATH
from inferd.server.routes import READ, Params, Route, RouteGroup
from inferd.server.shared_memory import SharedMemoryRegions
from inferd.types import Door

_JSON = b"application/json"


class TorchServeDoor:
    def __init__(
        self,
        service: InferenceService,
        call: InferenceCall | None = None,
        regions: SharedMemoryRegions | None = None,
        *,
        limits: RequestLimits,
    ) -> None:
        """`call`: the server's one inference call (None on the management port, which infers nothing);
        `limits`: the server's, what one request may hold."""
        self._service = service
        self._call = call
        self._codec = TorchServeCodec(KServeHttpCodec(limits, Door.TORCHSERVE, regions))
        # The management port's OpenAPI document, set by whoever assembles that port
        # (server.app.build_management_router) once its routes are known.
        self.management_document: bytes | None = None

    def inference_routes(self) -> RouteGroup:
        return RouteGroup(
            protocol=Door.TORCHSERVE,
            roots=("predictions",),
            encode_error=torchserve.encode_error,
            routes=(
                Route("/predictions/{model}", ("POST", "PUT"), self._predict),
                Route("/predictions/{model}/{version}", ("POST", "PUT"), self._predict),
            ),
        )

    def management_routes(self) -> RouteGroup:
        return RouteGroup(
            protocol=Door.TORCHSERVE,
            roots=("models", MANAGEMENT_DOCUMENT_PATH.strip("/")),
            encode_error=torchserve.encode_error,
            routes=(
                Route(MANAGEMENT_DOCUMENT_PATH, READ, self._api_description),
                Route("/models", READ, self._list),
                Route("/models/{model}", READ, self._describe),
                Route("/models/{model}/{version}", READ, self._describe),
            ),
        )

    async def _api_description(self, request: HttpRequest, params: Params) -> HttpResponse:
        if self.management_document is None:
            raise NotFoundError("this port serves no API description")
        return HttpResponse(200, self.management_document, [(b"content-type", _JSON)])

    async def _predict(self, request: HttpRequest, params: Params) -> HttpResponse:
        assert self._call is not None, "the inference routes are served with a call"
        return await self._call.http(self._codec, request, Target(params["model"], params.get("version", "")))

    async def _list(self, request: HttpRequest, params: Params) -> HttpResponse:
        query = parse_qs(request.query.decode("latin-1"))
        limit = _query_int(query, "limit", 100)
        limit = 100 if not 0 < limit <= 100 else limit
        offset = _query_int(query, "next_page_token", 0)
        names = sorted({model for model, _, _ in self._service.model_states()})
        return json_response(torchserve.models_page([(name, name) for name in names], limit, max(offset, 0)))

    async def _describe(self, request: HttpRequest, params: Params) -> HttpResponse:
        model, wanted = params["model"], params.get("version", "")
        versions = self._service.model_versions(model, "" if wanted == "all" else wanted)
        if not wanted:  # the default version only, as TorchServe describes a model
            versions = [v for v in versions if v[1].value == "READY"][-1:] or versions[-1:]
        return json_response(
            [self._description(model, version, state.value == "READY") for version, state, _ in versions]
        )

    def _description(self, model: str, version: str, ready: bool) -> dict[str, Any]:
        try:
            config = self._service.model_config(model, version)
        except Exception:  # a version that is not serving: described from what is known
            return torchserve.model_description(
                model, version, url=model, runtime="", instances=0, max_batch_size=0, max_batch_delay_ms=0, ready=False
            )
        batching = config.dynamic_batching
        return torchserve.model_description(
            model,
            version,
            url=model,
            runtime=config.platform or config.backend,
            instances=sum(group.count for group in config.instance_groups) or 1,
            max_batch_size=config.max_batch_size,
            max_batch_delay_ms=batching.max_queue_delay_us / 1000 if batching else 0,
            ready=ready,
        )


def _query_int(query: dict[str, list[str]], name: str, default: int) -> int:
    values = query.get(name)
    if not values:
        return default
    try:
        return int(values[-1])
    except ValueError:
        raise MalformedRequestError(f"query parameter {name}={values[-1]!r} is not an integer") from None

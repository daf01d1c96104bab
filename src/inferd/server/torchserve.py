"""TorchServe's inference API (`POST /predictions/{m}[/{version}]` on the HTTP port, `GET /ping` is
SageMaker's door's) and its management API's read side (`GET /models`, `GET /models/{m}[/{v}|/all]`)
on a port of its own (`--torchserve-management-port`), with errors in TorchServe's shape.

See `protocol.torchserve` for how a body becomes the model's inputs.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

import numpy as np

from inferd.config.model import ModelConfig, TensorConfig
from inferd.core.service import InferenceService
from inferd.errors import InvalidRequestError, MalformedRequestError, NotFoundError
from inferd.protocol import json_v2, sagemaker, tfserving_json, torchserve
from inferd.server.http import door_request, json_response, response_headers
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.kserve import KServeDoor
from inferd.server.openapi import MANAGEMENT_DOCUMENT_PATH
from inferd.server.routes import READ, Params, Route, RouteGroup
from inferd.types import DataType, Tensor

# The model config parameter naming the BYTES input a raw (non-JSON) body goes to.
BODY_INPUT_PARAMETER = "torchserve_body_input"
_JSON = b"application/json"


class TorchServeDoor:
    def __init__(self, service: InferenceService, kserve: KServeDoor) -> None:
        self._service = service
        self._kserve = kserve
        # The management port's OpenAPI document, set by whoever assembles that port
        # (server.app.build_management_router) once its routes are known.
        self.management_document: bytes | None = None

    def inference_routes(self) -> RouteGroup:
        return RouteGroup(
            protocol="torchserve",
            roots=("predictions",),
            encode_error=torchserve.encode_error,
            routes=(
                Route("/predictions/{model}", ("POST", "PUT"), self._predict, inference=True),
                Route("/predictions/{model}/{version}", ("POST", "PUT"), self._predict, inference=True),
            ),
        )

    def management_routes(self) -> RouteGroup:
        return RouteGroup(
            protocol="torchserve",
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

    async def _predict(self, http_request: HttpRequest, params: Params) -> HttpResponse:
        model, version = params["model"], params.get("version", "")
        self._service.shed(model, version, "torchserve")
        started = time.perf_counter()
        # The model first: an unknown one is a 404 whatever its body holds (a body curl -T sends
        # was a 400 "not valid JSON" for a model that does not exist).
        config = await self._service.serving_config(model, version)
        body_input = _body_input(config)
        content_type = http_request.headers.get(b"content-type")
        # TorchServe's documented `curl -T file` (a PUT) and `requests.post(url, data=...)` send no
        # Content-Type, and TorchServe hands such a body to the handler as bytes: so does inferd,
        # to the model's body input; only a model without one reads it as JSON.
        as_json = sagemaker.media_type(content_type)[0] == sagemaker.JSON if content_type else body_input is None
        if as_json:
            document = json_v2.load_json(http_request.body)
            if sagemaker.is_v2_body(document):  # the v2 codec reads the raw body (binary parts, large data)
                return await self._kserve.infer(http_request, model, version, "torchserve")
            inputs = tfserving_json.decode_columns(document, await self._service.serving_metadata(model, version))
        else:
            inputs = (_raw_body(http_request.body, config, body_input),)
        request = door_request(http_request, model, version, inputs, "torchserve", started)
        response = await self._service.infer(request)
        payload = torchserve.encode_outputs(response.outputs)
        return HttpResponse(200, payload, [(b"content-type", _JSON), *response_headers(http_request, request)])

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


def _body_input(config: ModelConfig) -> TensorConfig | None:
    """The BYTES input a raw body goes to: the one the model has, or the one its
    `torchserve_body_input` parameter names; None when that names no single input."""
    named = config.parameters.get(BODY_INPUT_PARAMETER, "")
    candidates = [t for t in config.inputs if t.datatype is DataType.BYTES and (not named or t.name == named)]
    return candidates[0] if len(candidates) == 1 else None


def _raw_body(body: bytes, config: ModelConfig, tensor: TensorConfig | None) -> Tensor:
    """The body, unread, as one element of the model's body input (one row when it batches)."""
    if tensor is None:
        raise InvalidRequestError(
            f"model '{config.name}' takes no raw body: send application/json, or give the model one BYTES "
            f"input (or name it in the '{BODY_INPUT_PARAMETER}' parameter)"
        )
    shape = (*((1,) if config.max_batch_size > 0 else ()), *(1 for _ in tensor.dims))
    data = np.empty(1, dtype=object)
    data[0] = body
    return Tensor(tensor.name, DataType.BYTES, shape, data.reshape(shape))


def _query_int(query: dict[str, list[str]], name: str, default: int) -> int:
    values = query.get(name)
    if not values:
        return default
    try:
        return int(values[-1])
    except ValueError:
        raise MalformedRequestError(f"query parameter {name}={values[-1]!r} is not an integer") from None

"""The TF Serving REST door: `/v1/models/...` (status, metadata, `:predict`), by `protocol.tfserving_json`.

Versions are named as in TF Serving: by number (`/versions/3`), by label (`/labels/stable`, from
the model's `version_labels` parameter, e.g. "stable:1,canary:2"), or not at all (the newest ready).
"""

from __future__ import annotations

from inferd.core.service import InferenceService
from inferd.errors import InferdError, UnsupportedError
from inferd.protocol import tfserving_json
from inferd.protocol.codecs.base import Target
from inferd.protocol.codecs.tfserving import TfServingRestCodec
from inferd.protocol.status import TFSERVING_HTTP_STATUS
from inferd.protocol.tf_types import tf_state
from inferd.server.http import json_response
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.inference_call import InferenceCall
from inferd.server.routes import READ, Params, Route, RouteGroup
from inferd.types import Door

_JSON = b"application/json"


def encode_error(error: InferdError, request_id: str) -> tuple[int, bytes, bytes]:
    return TFSERVING_HTTP_STATUS[error.code], tfserving_json.encode_error(error, request_id), _JSON


class TfServingDoor:
    def __init__(self, service: InferenceService, call: InferenceCall) -> None:
        self._service = service
        self._call = call
        self._codec = TfServingRestCodec()

    def routes(self) -> RouteGroup:
        routes: list[Route] = []
        for where in ("", "/versions/{version}", "/labels/{label}"):
            model = "/v1/models/{model}" + where
            routes += [
                Route(model, READ, self._status),
                Route(model + "/metadata", READ, self._metadata),
                Route(model + ":predict", ("POST",), self._predict),
                Route(model + ":classify", ("POST",), self._unsupported),
                Route(model + ":regress", ("POST",), self._unsupported),
            ]
        return RouteGroup(
            protocol=Door.TFSERVING_REST, roots=("v1",), routes=tuple(routes), encode_error=encode_error, verbs=True
        )

    async def _status(self, request: HttpRequest, params: Params) -> HttpResponse:
        # As in TF Serving, a label is not resolved here: the status of every version answers.
        versions = self._service.model_versions(params["model"], params.get("version", ""))
        return json_response(
            tfserving_json.model_status_json(
                [(v, tf_state(state.value), reason) for v, state, reason in reversed(versions)]
            )
        )

    async def _metadata(self, request: HttpRequest, params: Params) -> HttpResponse:
        label = params.get("label")
        model = params["model"]
        version = params.get("version", "") if label is None else await self._call.label_version(model, label)
        metadata = self._service.model_metadata(model, version)
        return json_response(tfserving_json.metadata_json(metadata, version or metadata.versions[-1]))

    async def _predict(self, request: HttpRequest, params: Params) -> HttpResponse:
        target = Target(params["model"], params.get("version", ""), params.get("label", ""))
        return await self._call.http(self._codec, request, target)

    async def _unsupported(self, request: HttpRequest, params: Params) -> HttpResponse:
        verb = request.path.rpartition(":")[2]
        raise UnsupportedError(
            f"'{verb}' is not supported: inferd serves predict only (POST /v1/models/{params['model']}:predict); "
            "classify and regress need TensorFlow's Example-based signatures"
        )

"""The TF Serving REST door: `/v1/models/...` (status, metadata, `:predict`), by `protocol.tfserving_json`.

Versions are named as in TF Serving: by number (`/versions/3`), by label (`/labels/stable`, from
the model's `version_labels` parameter, e.g. "stable:1,canary:2"), or not at all (the newest ready).
"""

from __future__ import annotations

import time
from typing import Any

from inferd.core.service import InferenceService
from inferd.errors import InferdError, InvalidRequestError, UnsupportedError
from inferd.protocol import json_v2, tfserving_json
from inferd.protocol.status import TFSERVING_HTTP_STATUS
from inferd.protocol.tf_types import tf_state
from inferd.server.http import door_request, json_response, response_headers
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.routes import READ, Params, Route, RouteGroup

# The model config parameter that names versions, as TF Serving's `version_labels` does.
VERSION_LABELS_PARAMETER = "version_labels"
_JSON = b"application/json"


def encode_error(error: InferdError, request_id: str) -> tuple[int, bytes, bytes]:
    return TFSERVING_HTTP_STATUS[error.code], tfserving_json.encode_error(error, request_id), _JSON


class TfServingDoor:
    def __init__(self, service: InferenceService) -> None:
        self._service = service

    def routes(self) -> RouteGroup:
        routes: list[Route] = []
        for where in ("", "/versions/{version}", "/labels/{label}"):
            model = "/v1/models/{model}" + where
            routes += [
                Route(model, READ, self._status),
                Route(model + "/metadata", READ, self._metadata),
                Route(model + ":predict", ("POST",), self._predict, inference=True),
                Route(model + ":classify", ("POST",), self._unsupported),
                Route(model + ":regress", ("POST",), self._unsupported),
            ]
        return RouteGroup(
            protocol="tfserving_rest", roots=("v1",), routes=tuple(routes), encode_error=encode_error, verbs=True
        )

    async def version(self, params: Params) -> str:
        """The version a path names: a number, a label's number, or "" for the newest ready one."""
        label = params.get("label")
        if label is None:
            return params.get("version", "")
        return await label_version(self._service, params["model"], label)

    async def _status(self, request: HttpRequest, params: Params) -> HttpResponse:
        # As in TF Serving, a label is not resolved here: the status of every version answers.
        versions = self._service.model_versions(params["model"], params.get("version", ""))
        return json_response(
            tfserving_json.model_status_json(
                [(v, tf_state(state.value), reason) for v, state, reason in reversed(versions)]
            )
        )

    async def _metadata(self, request: HttpRequest, params: Params) -> HttpResponse:
        version = await self.version(params)
        metadata = self._service.model_metadata(params["model"], version)
        return json_response(tfserving_json.metadata_json(metadata, version or metadata.versions[-1]))

    async def _predict(self, http_request: HttpRequest, params: Params) -> HttpResponse:
        return await self.predict(http_request, params["model"], await self.version(params), "tfserving_rest")

    async def predict(
        self, http_request: HttpRequest, model: str, version: str, protocol: str, document: Any = None
    ) -> HttpResponse:
        """A `:predict` body, by any door that takes TF Serving bodies (SageMaker's /invocations,
        which passes the `document` it parsed already)."""
        self._service.shed(model, version, protocol)
        decode_started = time.perf_counter()
        signature = await self._service.serving_metadata(model, version)
        if document is None:
            document = json_v2.load_json(http_request.body)
        body = tfserving_json.decode_predict(document, signature)
        request = door_request(http_request, model, version, body.inputs, protocol, decode_started)
        response = await self._service.infer(request)
        encode_started = time.perf_counter()
        payload = tfserving_json.encode_predict(response.outputs, row_format=body.row_format)
        request.timing.encode_s = time.perf_counter() - encode_started
        self._service.response_encoded(response, request.timing.encode_s)
        return HttpResponse(200, payload, [(b"content-type", _JSON), *response_headers(http_request, request)])

    async def _unsupported(self, request: HttpRequest, params: Params) -> HttpResponse:
        verb = request.path.rpartition(":")[2]
        raise UnsupportedError(
            f"'{verb}' is not supported: inferd serves predict only (POST /v1/models/{params['model']}:predict); "
            "classify and regress need TensorFlow's Example-based signatures"
        )


async def label_version(service: InferenceService, model: str, label: str) -> str:
    """The version `label` names in the model's `version_labels` parameter."""
    config = await service.serving_config(model)
    labels = parse_version_labels(config.parameters.get(VERSION_LABELS_PARAMETER, ""))
    if label not in labels:
        known = ", ".join(sorted(labels)) or f"none (set the '{VERSION_LABELS_PARAMETER}' parameter)"
        raise InvalidRequestError(f"Unrecognized servable version label: {label} (model '{model}' labels: {known})")
    return labels[label]


def parse_version_labels(text: str) -> dict[str, str]:
    """ "stable:1,canary:2" -> {"stable": "1", "canary": "2"}; malformed entries are skipped."""
    labels: dict[str, str] = {}
    for entry in text.split(","):
        label, _, version = entry.strip().partition(":")
        if label and version.strip().isascii() and version.strip().isdigit():
            labels[label.strip()] = version.strip()
    return labels

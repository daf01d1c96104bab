"""The OpenAI-compatible embeddings door: `POST /openai/v1/embeddings`, `GET /openai/v1/models[/{m}]`
(the client's `base_url` is `http://host:8000/openai/v1`; TF Serving owns `/v1/models`).

Which models serve embeddings, and how a body becomes their requests: `protocol.codecs.openai`.
"""

from __future__ import annotations

import time

from inferd.config.parameters import EMBEDDING_INPUT
from inferd.core.service import InferenceService
from inferd.errors import InferdError, InvalidRequestError
from inferd.limits import RequestLimits
from inferd.protocol import openai_embeddings
from inferd.protocol.codecs.openai import OpenAiEmbeddingsCodec, embedding_spec
from inferd.server.http import json_response
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.inference_call import InferenceCall
from inferd.server.routes import READ, Params, Route, RouteGroup
from inferd.types import Door


class OpenAiDoor:
    def __init__(self, service: InferenceService, call: InferenceCall, limits: RequestLimits) -> None:
        """`limits`: the server's, what one request may hold."""
        self._service = service
        self._call = call
        self._codec = OpenAiEmbeddingsCodec(limits)
        self._started = int(time.time())

    def routes(self) -> RouteGroup:
        return RouteGroup(
            protocol=Door.OPENAI,
            roots=("openai",),
            encode_error=openai_embeddings.encode_error,
            routes=(
                Route("/openai/v1/embeddings", ("POST",), self._embeddings),
                Route("/openai/v1/models", READ, self._models),
                Route("/openai/v1/models/{model}", READ, self._model),
            ),
        )

    async def _embeddings(self, request: HttpRequest, params: Params) -> HttpResponse:
        return await self._call.http(self._codec, request, self._codec.target)

    async def _models(self, request: HttpRequest, params: Params) -> HttpResponse:
        names = sorted({model for model, _, state in self._service.model_states() if state.value == "READY"})
        serving = [name for name in names if self._serves_embeddings(name)]
        return json_response(openai_embeddings.models_json([(name, self._started) for name in serving]))

    async def _model(self, request: HttpRequest, params: Params) -> HttpResponse:
        name = params["model"]
        if embedding_spec(self._service.model_config(name)) is None:
            raise InvalidRequestError(
                f"model '{name}' does not serve embeddings (no '{EMBEDDING_INPUT.name}' parameter)"
            )
        return json_response(openai_embeddings.models_json([(name, self._started)])["data"][0])

    def _serves_embeddings(self, name: str) -> bool:
        try:
            return embedding_spec(self._service.model_config(name)) is not None
        except InferdError:  # not ready meanwhile, or a misdeclared model: not listed
            return False

"""The OpenAI-compatible embeddings door: `POST /openai/v1/embeddings`, `GET /openai/v1/models[/{m}]`
(the client's `base_url` is `http://host:8000/openai/v1`; TF Serving owns `/v1/models`).

A model (or ensemble) serves embeddings when its config says which tensors hold the text and the
vector, by parameters:

    embedding_input        the BYTES input that takes one text per row (required)
    embedding_output       the FP32 output with one vector per row (default: the only output)
    embedding_token_count  an integer output with each text's tokens, for `usage` (default: none, 0)
    embedding_dimensions   "truncate": `dimensions` below the model's keeps the first ones and
                           re-normalizes (Matryoshka-trained models); otherwise only the model's own

A request's texts go to the model as one batch (in chunks of its max_batch_size), so they batch
with every other door's traffic to the same model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig
from inferd.core.service import InferenceService
from inferd.errors import InferdError, InvalidRequestError, ModelOutputError
from inferd.protocol import openai_embeddings
from inferd.server.http import deadline, json_response, response_headers
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.logging import current_request_id
from inferd.server.routes import READ, Params, Route, RouteGroup
from inferd.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor, new_request_id

EMBEDDING_INPUT = "embedding_input"
EMBEDDING_OUTPUT = "embedding_output"
EMBEDDING_TOKEN_COUNT = "embedding_token_count"
EMBEDDING_DIMENSIONS = "embedding_dimensions"
_JSON = b"application/json"


@dataclass(frozen=True, slots=True)
class EmbeddingSpec:
    input: str
    # Every input is one text per row: the shape of one row, all ones.
    row_shape: tuple[int, ...]
    output: str
    token_count: str
    truncatable: bool
    max_batch_size: int


def embedding_spec(config: ModelConfig) -> EmbeddingSpec | None:
    """How `config`'s model serves embeddings; None when it declares no `embedding_input`."""
    parameters = config.parameters
    name = parameters.get(EMBEDDING_INPUT)
    if not name:
        return None
    tensor = config.input(name)
    if tensor is None or tensor.datatype is not DataType.BYTES:
        raise InvalidRequestError(f"model '{config.name}': {EMBEDDING_INPUT} '{name}' is not one of its BYTES inputs")
    output = parameters.get(EMBEDDING_OUTPUT) or (config.outputs[0].name if len(config.outputs) == 1 else "")
    if config.output(output) is None:
        raise InvalidRequestError(
            f"model '{config.name}': set {EMBEDDING_OUTPUT} to the output that holds the vector "
            f"(one of {[t.name for t in config.outputs]})"
        )
    return EmbeddingSpec(
        input=name,
        row_shape=tuple(1 for _ in tensor.dims),
        output=output,
        token_count=parameters.get(EMBEDDING_TOKEN_COUNT, ""),
        truncatable=parameters.get(EMBEDDING_DIMENSIONS, "") == "truncate",
        max_batch_size=config.max_batch_size,
    )


class OpenAiDoor:
    def __init__(self, service: InferenceService) -> None:
        self._service = service
        self._started = int(time.time())

    def routes(self) -> RouteGroup:
        return RouteGroup(
            protocol="openai",
            roots=("openai",),
            encode_error=openai_embeddings.encode_error,
            routes=(
                Route("/openai/v1/embeddings", ("POST",), self._embeddings, inference=True),
                Route("/openai/v1/models", READ, self._models),
                Route("/openai/v1/models/{model}", READ, self._model),
            ),
        )

    async def _embeddings(self, http_request: HttpRequest, params: Params) -> HttpResponse:
        started = time.perf_counter()
        body = openai_embeddings.decode_request(http_request.body)
        spec = embedding_spec(await self._service.serving_config(body.model))
        if spec is None:
            raise InvalidRequestError(
                f"model '{body.model}' does not serve embeddings: its config declares no '{EMBEDDING_INPUT}' "
                "parameter (GET /openai/v1/models lists the models that do)"
            )
        request_id = current_request_id.get() or new_request_id()
        current_request_id.set(request_id)
        deadline_s = deadline(http_request.headers)
        chunk = spec.max_batch_size if spec.max_batch_size > 0 else 1
        requests = [
            _request(body.model, spec, body.texts[start : start + chunk], request_id, deadline_s)
            for start in range(0, len(body.texts), chunk)
        ]
        requests[0].timing.decode_s = time.perf_counter() - started
        responses = await asyncio.gather(*(self._service.infer(request) for request in requests))
        vectors, tokens = _vectors(spec, responses)
        vectors = _dimensions(spec, body.model, vectors, body.dimensions)
        payload = openai_embeddings.encode_response(body.model, vectors, tokens, as_base64=body.base64)
        return HttpResponse(200, payload, [(b"content-type", _JSON), *response_headers(http_request, requests[0])])

    async def _models(self, request: HttpRequest, params: Params) -> HttpResponse:
        names = sorted({model for model, _, state in self._service.model_states() if state.value == "READY"})
        serving = [name for name in names if self._serves_embeddings(name)]
        return json_response(openai_embeddings.models_json([(name, self._started) for name in serving]))

    async def _model(self, request: HttpRequest, params: Params) -> HttpResponse:
        name = params["model"]
        if embedding_spec(self._service.model_config(name)) is None:
            raise InvalidRequestError(f"model '{name}' does not serve embeddings (no '{EMBEDDING_INPUT}' parameter)")
        return json_response(openai_embeddings.models_json([(name, self._started)])["data"][0])

    def _serves_embeddings(self, name: str) -> bool:
        try:
            return embedding_spec(self._service.model_config(name)) is not None
        except InferdError:  # not ready meanwhile, or a misdeclared model: not listed
            return False


def _request(
    model: str, spec: EmbeddingSpec, texts: Sequence[bytes], request_id: str, deadline_s: float | None
) -> InferRequest:
    array = np.empty(len(texts), dtype=object)
    array[:] = list(texts)
    batch = (len(texts),) if spec.max_batch_size > 0 else ()
    shape = (*batch, *spec.row_shape)
    outputs = [RequestedOutput(spec.output)]
    if spec.token_count:
        outputs.append(RequestedOutput(spec.token_count))
    return InferRequest(
        model_name=model,
        model_version="",
        request_id=request_id,
        inputs=(Tensor(spec.input, DataType.BYTES, shape, array.reshape(shape)),),
        outputs=tuple(outputs),
        deadline_s=deadline_s,
        protocol="openai",
    )


def _vectors(spec: EmbeddingSpec, responses: Sequence[InferResponse]) -> tuple[np.ndarray[Any, Any], int]:
    vectors, tokens = [], 0
    for response in responses:
        found = {tensor.name: tensor for tensor in response.outputs}
        vector = found[spec.output]
        rows = vector.shape[0] if vector.shape else 1
        vectors.append(np.asarray(vector.data, dtype=np.float32).reshape(rows, -1))
        if spec.token_count:
            tokens += int(np.asarray(found[spec.token_count].data).sum())
    return np.concatenate(vectors), tokens


def _dimensions(
    spec: EmbeddingSpec, model: str, vectors: np.ndarray[Any, Any], wanted: int | None
) -> np.ndarray[Any, Any]:
    size = vectors.shape[1]
    if wanted is None or wanted == size:
        return vectors
    if not spec.truncatable:
        raise InvalidRequestError(
            f"model '{model}' makes {size}-dimension embeddings and cannot shorten them "
            f'(its config does not set {EMBEDDING_DIMENSIONS}: "truncate")',
            tensor="dimensions",
        )
    if wanted > size:
        raise InvalidRequestError(f"model '{model}' makes {size}-dimension embeddings; 'dimensions' {wanted} is more")
    shortened = vectors[:, :wanted]
    norms = np.linalg.norm(shortened, axis=1, keepdims=True)
    if not np.all(np.isfinite(norms)):
        raise ModelOutputError(f"model '{model}' returned embeddings that are not finite")
    normalized: np.ndarray[Any, Any] = shortened / np.maximum(norms, 1e-12)
    return normalized

"""OpenAI's embeddings codec: `{"model", "input", ...}` in, `{"data": [{"embedding"}...], "usage"}` out.

A model (or ensemble) serves embeddings when its config says which tensors hold the text and the
vector, by parameters:

    embedding_input        the BYTES input that takes one text per row (required)
    embedding_output       the FP32 output with one vector per row (default: the only output)
    embedding_token_count  an integer output with each text's tokens, for `usage` (default: none, 0)
    embedding_dimensions   "truncate": `dimensions` below the model's keeps the first ones and
                           re-normalizes (Matryoshka-trained models); otherwise only the model's own

A body's texts become one request per chunk of the model's max_batch_size, so they batch with every
other door's traffic to the same model. The body names its model: `target` reads only that, so a
full queue sheds the request before the texts are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig
from inferd.config.parameters import EMBEDDING_DIMENSIONS, EMBEDDING_INPUT, EMBEDDING_OUTPUT, EMBEDDING_TOKEN_COUNT
from inferd.errors import InvalidRequestError, ModelOutputError
from inferd.limits import RequestLimits
from inferd.protocol import openai_embeddings
from inferd.protocol.codecs.base import Decoded, HttpAnswer, HttpBody, Signature, Target
from inferd.types import DataType, Door, InferResponse, RequestContext, RequestedOutput, RequestTiming, Tensor

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
    name = parameters.get(EMBEDDING_INPUT.name)
    if not name:
        return None
    tensor = config.input(name)
    if tensor is None or tensor.datatype is not DataType.BYTES:
        raise InvalidRequestError(
            f"model '{config.name}': {EMBEDDING_INPUT.name} '{name}' is not one of its BYTES inputs"
        )
    output = parameters.get(EMBEDDING_OUTPUT.name) or (config.outputs[0].name if len(config.outputs) == 1 else "")
    if config.output(output) is None:
        raise InvalidRequestError(
            f"model '{config.name}': set {EMBEDDING_OUTPUT.name} to the output that holds the vector "
            f"(one of {[t.name for t in config.outputs]})"
        )
    return EmbeddingSpec(
        input=name,
        row_shape=tuple(1 for _ in tensor.dims),
        output=output,
        token_count=parameters.get(EMBEDDING_TOKEN_COUNT.name, ""),
        truncatable=parameters.get(EMBEDDING_DIMENSIONS.name, "") == "truncate",
        max_batch_size=config.max_batch_size,
    )


@dataclass(frozen=True, slots=True)
class _Asked:
    """What the answer needs of the body: its model, spec, encoding and dimensions."""

    model: str
    spec: EmbeddingSpec
    base64: bool
    dimensions: int | None


@dataclass(frozen=True, slots=True)
class OpenAiEmbeddingsCodec:
    # The server's: what one request may hold, checked as the body is decoded (before allocating).
    limits: RequestLimits
    door: Door = Door.OPENAI

    @staticmethod
    def target(raw: HttpBody) -> Target:
        document = openai_embeddings.read_document(raw.body)
        return Target(document["model"], preread=document)

    reads_signature = True

    def decode(
        self, raw: HttpBody, target: Target, context: RequestContext, signature: Signature | None
    ) -> Decoded[_Asked]:
        assert signature is not None, "reads_signature"
        document = target.preread if target.preread is not None else openai_embeddings.read_document(raw.body)
        body = openai_embeddings.decode_document(document, self.limits)
        spec = embedding_spec(signature.config)
        if spec is None:
            raise InvalidRequestError(
                f"model '{body.model}' does not serve embeddings: its config declares no '{EMBEDDING_INPUT.name}' "
                "parameter (GET /openai/v1/models lists the models that do)"
            )
        chunk = spec.max_batch_size if spec.max_batch_size > 0 else 1
        requests = []
        for start in range(0, len(body.texts), chunk):
            texts = body.texts[start : start + chunk]
            # The first chunk carries the call's timing (Server-Timing, the trace); the others their own.
            chunk_context = context
            if start:
                chunk_context = RequestContext(
                    context.request_id, context.deadline_s, context.door, RequestTiming(), context.trace, context.route
                )
            # The target's model: an endpoint named in the body is resolved to its variant's.
            requests.append(chunk_context.request(target.model, target.version, (_texts(spec, texts),), _outputs(spec)))
        return Decoded(tuple(requests), _Asked(body.model, spec, body.base64, body.dimensions))

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[_Asked]) -> HttpAnswer:
        asked = decoded.state
        vectors, tokens = _vectors(asked.spec, responses)
        vectors = _dimensions(asked.spec, asked.model, vectors, asked.dimensions)
        payload = openai_embeddings.encode_response(asked.model, vectors, tokens, as_base64=asked.base64)
        return HttpAnswer(payload, [(b"content-type", _JSON)])


def _texts(spec: EmbeddingSpec, texts: Sequence[bytes]) -> Tensor:
    array = np.empty(len(texts), dtype=object)
    array[:] = list(texts)
    batch = (len(texts),) if spec.max_batch_size > 0 else ()
    shape = (*batch, *spec.row_shape)
    return Tensor(spec.input, DataType.BYTES, shape, array.reshape(shape))


def _outputs(spec: EmbeddingSpec) -> tuple[RequestedOutput, ...]:
    if spec.token_count:
        return (RequestedOutput(spec.output), RequestedOutput(spec.token_count))
    return (RequestedOutput(spec.output),)


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
            f'(its config does not set {EMBEDDING_DIMENSIONS.name}: "truncate")',
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

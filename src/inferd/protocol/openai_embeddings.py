"""OpenAI's embeddings API bodies (POST /embeddings, GET /models), both ways, as the official
`openai` client sends and reads them: `input` a string or a list of strings; `encoding_format`
"float" (JSON numbers) or "base64" (little-endian float32 bytes, what the client asks for by
default); `dimensions`; errors as `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from inferd.errors import InferdError, MalformedRequestError
from inferd.limits import RequestLimits, text_bytes
from inferd.protocol import json_v2
from inferd.protocol.status import HTTP_STATUS
from inferd.protocol.tensor_bytes import check_text_size

# The most texts one request may carry (OpenAI's own limit is 2048).
MAX_INPUTS = 2048


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    texts: tuple[bytes, ...]
    base64: bool
    dimensions: int | None


def decode_request(body: bytes, limits: RequestLimits) -> EmbeddingsRequest:
    return decode_document(read_document(body), limits)


def read_document(body: bytes) -> dict[str, Any]:
    """The body parsed, and its `model` checked: all a server reads before it may shed the request."""
    document = json_v2.load_json(body, non_finite=False)  # OpenAI's API reads strict JSON
    if not isinstance(document, dict):
        raise MalformedRequestError("request body must be a JSON object with 'model' and 'input'")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise MalformedRequestError("'model' must name a model (GET /openai/v1/models lists them)")
    return document


def decode_document(document: dict[str, Any], limits: RequestLimits) -> EmbeddingsRequest:
    """The rest of a body `read_document` parsed; its texts held to `limits` (the server's)."""
    texts = _texts(document.get("input"), limits)
    encoding = document.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise MalformedRequestError(f"'encoding_format' must be 'float' or 'base64', not {encoding!r}")
    dimensions = document.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise MalformedRequestError(f"'dimensions' must be a positive integer, not {dimensions!r}")
    user = document.get("user")
    if user is not None and not isinstance(user, str):
        raise MalformedRequestError("'user' must be a string")
    return EmbeddingsRequest(model=document["model"], texts=texts, base64=encoding == "base64", dimensions=dimensions)


def encode_response(model: str, vectors: np.ndarray[Any, Any], prompt_tokens: int, *, as_base64: bool) -> bytes:
    """`vectors`: [texts, dimensions] float32, one row per input text in order."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": base64.b64encode(row.tobytes()).decode("ascii") if as_base64 else row,
        }
        for index, row in enumerate(rows)
    ]
    document = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def models_json(models: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """GET /models: (name, created as a Unix time) of each model that serves embeddings."""
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "inferd"} for name, created in models],
    }


def encode_error(error: InferdError, request_id: str) -> tuple[int, bytes, bytes]:
    """OpenAI's error object; `code` is inferd's ErrorCode, `param` the field at fault where known."""
    status = HTTP_STATUS[error.code]
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 503:
        kind = "service_unavailable"
    body = {
        "error": {"message": error.message, "type": kind, "param": error.tensor, "code": error.code.value},
        "request_id": request_id,
    }
    return status, json_v2.encode_json(body), json_v2.JSON_CONTENT_TYPE


def _texts(value: Any, limits: RequestLimits) -> tuple[bytes, ...]:
    # OpenAI's API refuses an empty text, alone or in a list (400 invalid_request_error), so a
    # client written against it never sends one on purpose: refusing it here too keeps a bug in
    # the caller's chunking from turning into an embedding of nothing.
    if isinstance(value, str):
        if not value:
            raise MalformedRequestError("'input' must not be an empty string", tensor="input")
        value = [value]
    if not isinstance(value, list) or not value:
        raise MalformedRequestError("'input' must be a string or a non-empty list of strings")
    if len(value) > MAX_INPUTS:
        raise MalformedRequestError(f"'input' holds {len(value)} texts; at most {MAX_INPUTS} per request")
    if not all(isinstance(text, str) for text in value):
        if all(isinstance(item, (int, list)) for item in value):
            raise MalformedRequestError(
                "'input' as token ids is not supported: send the text, which the model tokenizes"
            )
        raise MalformedRequestError("'input' must be a string or a list of strings")
    if not all(value):
        raise MalformedRequestError(
            f"'input' must not hold an empty string (text {value.index('')} is empty)", tensor="input"
        )
    texts = tuple(text.encode("utf-8") for text in value)
    # The request's texts together (the door sends them to the model in batches, each checked again).
    check_text_size("input", text_bytes(texts), limits)
    return texts

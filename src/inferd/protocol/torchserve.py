"""TorchServe's inference and management API bodies: its error object, the model descriptions of the
management API, and how a /predictions body becomes the model's inputs.

A body reaches the model as its config declares: JSON (a v2 request, or a value / an object naming
inputs, read as TF Serving's columnar "inputs" are), or any other content type as raw bytes to the
model's BYTES input (the one it has, or the one its `torchserve_body_input` parameter names), one
body per row, as TorchServe hands each request's body to its handler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from inferd.errors import ErrorCode, InferdError
from inferd.protocol import json_v2
from inferd.protocol.status import HTTP_STATUS
from inferd.types import Tensor

# TorchServe's exception names (frontend/server/.../http/*Exception.java), by inferd error code.
_EXCEPTION_TYPES = {
    ErrorCode.MODEL_NOT_FOUND: "ModelNotFoundException",
    ErrorCode.VERSION_NOT_FOUND: "ModelVersionNotFoundException",
    ErrorCode.NOT_FOUND: "ResourceNotFoundException",
    ErrorCode.METHOD_NOT_ALLOWED: "MethodNotAllowedException",
    ErrorCode.ALREADY_EXISTS: "ConflictStatusException",
}


def encode_error(error: InferdError, request_id: str) -> tuple[int, bytes, bytes]:
    """`{"code": status, "type": "...Exception", "message": ...}`, with inferd's code as `error_code`."""
    status = HTTP_STATUS[error.code]
    kind = _EXCEPTION_TYPES.get(error.code)
    if kind is None:
        if status == 503:
            kind = "ServiceUnavailableException"
        elif status >= 500:
            kind = "InternalServerException"
        else:
            kind = "BadRequestException"
    body = {"code": status, "type": kind, "message": error.message, "error_code": error.code.value}
    body["request_id"] = request_id
    return status, orjson.dumps(body, option=orjson.OPT_INDENT_2), json_v2.JSON_CONTENT_TYPE


def encode_outputs(outputs: Sequence[Tensor]) -> bytes:
    """A single output as its value (nested lists); several as an object naming each. NaN and ±inf
    as TorchServe's Python handlers write them (json.dumps: NaN, Infinity, -Infinity)."""
    document = _value(outputs[0]) if len(outputs) == 1 else {t.name: _value(t) for t in outputs}
    return json_v2.encode_tensor_json(document)


def _value(tensor: Tensor) -> Any:
    if tensor.data.dtype.kind != "O":
        return tensor.data
    flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in tensor.data.reshape(-1)]
    return np.array(flat, dtype=object).reshape(tensor.data.shape).tolist()


def model_description(
    name: str,
    version: str,
    *,
    url: str,
    runtime: str,
    instances: int,
    max_batch_size: int,
    max_batch_delay_ms: float,
    ready: bool,
) -> dict[str, Any]:
    """One entry of `GET /models/{m}` in TorchServe's shape (inferd's instances as its workers)."""
    status = "READY" if ready else "UNLOADING"
    return {
        "modelName": name,
        "modelVersion": version,
        "modelUrl": url,
        "runtime": runtime,
        "minWorkers": instances,
        "maxWorkers": instances,
        "batchSize": max(max_batch_size, 1),
        "maxBatchDelay": max_batch_delay_ms,
        "loadedAtStartup": True,
        "workers": [{"id": str(index), "status": status, "gpu": False} for index in range(instances)],
    }


def models_page(names: Sequence[tuple[str, str]], limit: int, offset: int) -> dict[str, Any]:
    """`GET /models?limit=&next_page_token=`: names sorted, a page of them, and the next page's token."""
    page = names[offset : offset + limit]
    document: dict[str, Any] = {"models": [{"modelName": name, "modelUrl": url} for name, url in page]}
    if offset + limit < len(names):
        document["nextPageToken"] = str(offset + limit)
    return document

"""ErrorCode ⇄ status, for every door: HTTP, gRPC, and TF Serving's REST statuses (derived from the
gRPC codes as TF Serving derives them). The only such tables in inferd.

gRPC codes are named here, not imported: an HTTP-only client reads these tables without grpc
installed. `grpc_status()` turns a name into grpc's enum for the servers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferd.errors import ErrorCode, InferdError, error_from_code
from inferd.types import Door

if TYPE_CHECKING:
    import grpc

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.MALFORMED_REQUEST: 400,
    ErrorCode.INVALID_TENSOR_DATA: 400,
    ErrorCode.UNKNOWN_TENSOR: 400,
    ErrorCode.MISSING_INPUT: 400,
    ErrorCode.DATATYPE_MISMATCH: 400,
    ErrorCode.SHAPE_MISMATCH: 400,
    ErrorCode.BATCH_SIZE: 400,
    ErrorCode.INVALID_ARGUMENT: 400,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.LOAD_REQUEST_FAILED: 400,
    ErrorCode.UNSUPPORTED: 400,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.NOT_ACCEPTABLE: 406,
    ErrorCode.ALREADY_EXISTS: 409,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.MODEL_TOO_LARGE: 507,
    ErrorCode.TOO_MANY_MODELS: 507,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.VERSION_NOT_FOUND: 404,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.MODEL_NOT_READY: 503,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.DEADLINE_UNREACHABLE: 503,
    ErrorCode.MODEL_LOAD_FAILED: 503,
    ErrorCode.MODEL_CONFIG_INVALID: 503,
    ErrorCode.MODEL_RAISED: 400,
    ErrorCode.MODEL_OUTPUT_INVALID: 500,
    ErrorCode.INTERNAL: 500,
}

GRPC_STATUS: dict[ErrorCode, str] = {
    ErrorCode.MALFORMED_REQUEST: "INVALID_ARGUMENT",
    ErrorCode.INVALID_TENSOR_DATA: "INVALID_ARGUMENT",
    ErrorCode.UNKNOWN_TENSOR: "INVALID_ARGUMENT",
    ErrorCode.MISSING_INPUT: "INVALID_ARGUMENT",
    ErrorCode.DATATYPE_MISMATCH: "INVALID_ARGUMENT",
    ErrorCode.SHAPE_MISMATCH: "INVALID_ARGUMENT",
    ErrorCode.BATCH_SIZE: "INVALID_ARGUMENT",
    ErrorCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
    ErrorCode.METHOD_NOT_ALLOWED: "UNIMPLEMENTED",
    ErrorCode.LOAD_REQUEST_FAILED: "INVALID_ARGUMENT",
    ErrorCode.UNSUPPORTED: "UNIMPLEMENTED",
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: "INVALID_ARGUMENT",
    ErrorCode.NOT_ACCEPTABLE: "INVALID_ARGUMENT",
    ErrorCode.ALREADY_EXISTS: "ALREADY_EXISTS",
    ErrorCode.UNAUTHENTICATED: "UNAUTHENTICATED",
    ErrorCode.PERMISSION_DENIED: "PERMISSION_DENIED",
    ErrorCode.REQUEST_TOO_LARGE: "RESOURCE_EXHAUSTED",
    ErrorCode.MODEL_TOO_LARGE: "RESOURCE_EXHAUSTED",
    ErrorCode.TOO_MANY_MODELS: "RESOURCE_EXHAUSTED",
    ErrorCode.MODEL_NOT_FOUND: "NOT_FOUND",
    ErrorCode.VERSION_NOT_FOUND: "NOT_FOUND",
    ErrorCode.NOT_FOUND: "NOT_FOUND",
    ErrorCode.MODEL_NOT_READY: "UNAVAILABLE",
    ErrorCode.UNAVAILABLE: "UNAVAILABLE",
    ErrorCode.OVERLOADED: "UNAVAILABLE",
    ErrorCode.DEADLINE_UNREACHABLE: "UNAVAILABLE",
    ErrorCode.MODEL_LOAD_FAILED: "UNAVAILABLE",
    ErrorCode.MODEL_CONFIG_INVALID: "UNAVAILABLE",
    ErrorCode.MODEL_RAISED: "INVALID_ARGUMENT",
    ErrorCode.MODEL_OUTPUT_INVALID: "INTERNAL",
    ErrorCode.INTERNAL: "INTERNAL",
}


# TF Serving's ToHTTPStatusCode (model_servers/http_server.cc): its HTTP status of each gRPC code.
_TF_HTTP_OF_GRPC: dict[str, int] = {
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}
# Where HTTP itself has the answer, inferd keeps it: a 405 carries its Allow header, and a body
# refused for its size is 413 (TF Serving would say 429, which invites a retry of the same body).
_HTTP_LEVEL = {
    ErrorCode.METHOD_NOT_ALLOWED,
    ErrorCode.REQUEST_TOO_LARGE,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    ErrorCode.NOT_ACCEPTABLE,
}
TFSERVING_HTTP_STATUS: dict[ErrorCode, int] = {
    code: HTTP_STATUS[code] if code in _HTTP_LEVEL else _TF_HTTP_OF_GRPC[grpc_code]
    for code, grpc_code in GRPC_STATUS.items()
}


def http_status(door: Door, code: ErrorCode) -> int:
    """The HTTP status `door` answers an error of `code` with (TF Serving's REST door has its own)."""
    return (TFSERVING_HTTP_STATUS if door is Door.TFSERVING_REST else HTTP_STATUS)[code]


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status a server aborts a call with for an error of this code."""
    import grpc

    return grpc.StatusCode[GRPC_STATUS[code]]


# What a server that sends no inferd code (Triton, a proxy) meant, by its status.
_CODE_OF_HTTP: dict[int, ErrorCode] = {
    400: ErrorCode.INVALID_ARGUMENT,
    401: ErrorCode.UNAUTHENTICATED,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    406: ErrorCode.NOT_ACCEPTABLE,
    409: ErrorCode.ALREADY_EXISTS,
    413: ErrorCode.REQUEST_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    429: ErrorCode.OVERLOADED,
    501: ErrorCode.UNSUPPORTED,
    507: ErrorCode.MODEL_TOO_LARGE,
}
_CODE_OF_GRPC: dict[str, ErrorCode] = {
    "INVALID_ARGUMENT": ErrorCode.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": ErrorCode.INVALID_ARGUMENT,
    "OUT_OF_RANGE": ErrorCode.INVALID_ARGUMENT,
    "NOT_FOUND": ErrorCode.NOT_FOUND,
    "ALREADY_EXISTS": ErrorCode.ALREADY_EXISTS,
    "RESOURCE_EXHAUSTED": ErrorCode.REQUEST_TOO_LARGE,
    "UNIMPLEMENTED": ErrorCode.UNSUPPORTED,
    "UNAUTHENTICATED": ErrorCode.UNAUTHENTICATED,
    "PERMISSION_DENIED": ErrorCode.PERMISSION_DENIED,
    "UNAVAILABLE": ErrorCode.UNAVAILABLE,
    "DEADLINE_EXCEEDED": ErrorCode.UNAVAILABLE,
    "CANCELLED": ErrorCode.UNAVAILABLE,
}


def error_from_http(status: int, code: str | None, message: str, **fields: Any) -> InferdError:
    """A server's HTTP error as inferd's typed error: by its `code` when it sent one (inferd does),
    else by its status (Triton sends only a message)."""
    fallback = _CODE_OF_HTTP.get(status) or (ErrorCode.UNAVAILABLE if status in (502, 503, 504) else ErrorCode.INTERNAL)
    return error_from_code(_known(code) or fallback, message, **fields)


def error_from_grpc(status_name: str, code: str | None, message: str, **fields: Any) -> InferdError:
    """A server's gRPC error (its status's name, as grpc.StatusCode names it) as inferd's typed error."""
    return error_from_code(_known(code) or _CODE_OF_GRPC.get(status_name, ErrorCode.INTERNAL), message, **fields)


def _known(code: str | None) -> ErrorCode | None:
    try:
        return ErrorCode(code) if code else None
    except ValueError:  # a code from a newer server: fall back on its status
        return None

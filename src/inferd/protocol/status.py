"""ErrorCode → status, for every door: HTTP, gRPC, and TF Serving's REST statuses (derived from the
gRPC codes as TF Serving derives them). The only such tables in inferd."""

from __future__ import annotations

import grpc

from inferd.errors import ErrorCode

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
    ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.MODEL_TOO_LARGE: 507,
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

GRPC_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.MALFORMED_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_TENSOR_DATA: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_TENSOR: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.MISSING_INPUT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.DATATYPE_MISMATCH: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.SHAPE_MISMATCH: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.BATCH_SIZE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.METHOD_NOT_ALLOWED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.LOAD_REQUEST_FAILED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_ACCEPTABLE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.REQUEST_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.MODEL_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.MODEL_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.VERSION_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.MODEL_NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.OVERLOADED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.DEADLINE_UNREACHABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.MODEL_LOAD_FAILED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.MODEL_CONFIG_INVALID: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.MODEL_RAISED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.MODEL_OUTPUT_INVALID: grpc.StatusCode.INTERNAL,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}


# TF Serving's ToHTTPStatusCode (model_servers/http_server.cc): its HTTP status of each gRPC code.
_TF_HTTP_OF_GRPC: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
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

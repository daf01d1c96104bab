"""The REST edge: `HttpApp` serves every door's routes (`server.routes`) on the one HTTP port, with
what they share: request ids, the body limit, deadlines, Server-Timing, and errors logged and
answered in each door's own shape.

No web framework: matching a table of fixed paths costs less than a framework's router, and every
microsecond here is paid by every request. Each door's inference routes hand the request to
`server.inference_call.InferenceCall` with their codec (`protocol.codecs`); their other routes
call `InferenceService` and encode with `protocol/`.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from inferd.errors import (
    InferdError,
    InternalError,
    MalformedRequestError,
    MethodNotAllowedError,
    RequestTooLargeError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedEncodingError,
)
from inferd.protocol import json_v2, server_timing
from inferd.protocol.endpoint_headers import VARIANT_HEADER
from inferd.protocol.request_id import REQUEST_ID_HEADER as _REQUEST_ID_HEADER
from inferd.protocol.request_id import check_request_id, header_value
from inferd.protocol.status import HTTP_STATUS
from inferd.server.auth import AUTHORIZATION_HEADER, WWW_AUTHENTICATE, AccessPolicy
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.logging import RequestErrorLog, current_request_id
from inferd.server.routes import RouteGroup, Router
from inferd.types import new_request_id

logger = logging.getLogger("inferd.http")
_errors_log = RequestErrorLog(logger)

REQUEST_ID_HEADER = _REQUEST_ID_HEADER.encode()
# How long the client will wait, in milliseconds; a request that cannot make it is refused at once.
TIMEOUT_HEADER = json_v2.TIMEOUT_HEADER.encode()
_JSON_HEADERS = [(b"content-type", json_v2.JSON_CONTENT_TYPE)]
_AUTHORIZATION = AUTHORIZATION_HEADER.encode()
_SERVER_TIMING_REQUEST = server_timing.REQUEST_HEADER.encode()
_SERVER_TIMING_RESPONSE = server_timing.RESPONSE_HEADER.encode()


class HttpApp:
    """Every front door on one port: `server.http11.HttpServer` hands each complete request to
    `__call__`, which finds its route in the `Router` and answers errors in its door's shape."""

    def __init__(self, router: Router, *, max_request_bytes: int, access: AccessPolicy | None = None) -> None:
        self._router = router
        self._max_request_bytes = max_request_bytes
        # None when no tokens are configured: then no request pays for the check.
        self._access = access

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = ""
        token = current_request_id.set(request_id)
        parts = request.path.strip("/").split("/")
        group = self._router.group(parts)
        try:
            raw_id = request.headers.get(REQUEST_ID_HEADER)
            if raw_id:
                request_id = check_request_id(header_text(raw_id), "X-Request-ID")
                current_request_id.set(request_id)
            if request.oversized:
                raise self._too_large(request)
            route, params = group.match(request, parts)
            if self._access is not None:
                self._access.check(route.access, request.headers.get(_AUTHORIZATION))
            return await route.handler(request, params)
        except InferdError as exc:
            return self._error(request, group, exc, exc.request_id or request_id or new_request_id())
        except Exception:
            request_id = request_id or new_request_id()
            current_request_id.set(request_id)
            logger.exception("unexpected error serving %s %s", request.method, request.path)
            return self._error(request, group, InternalError("internal error; see the server log"), request_id)
        finally:
            current_request_id.reset(token)

    def _too_large(self, request: HttpRequest) -> RequestTooLargeError:
        limit, setting = request.limit if request.limit[1] else (self._max_request_bytes, "--max-request-bytes")
        return RequestTooLargeError(
            f"request body of {request.oversized} bytes or more exceeds the server's limit of {limit} bytes "
            f"({setting})",
            expected=f"<= {limit} bytes",
        )

    def _error(self, request: HttpRequest, group: RouteGroup, error: InferdError, request_id: str) -> HttpResponse:
        status, body, content_type = group.encode_error(error, request_id)
        # A server fault is an error in the log; a client's mistake or an overload a warning.
        _errors_log.log(
            HTTP_STATUS[error.code] == 500,
            (group.protocol, error.code),
            "%s %s -> %d %s: %s",
            request.method,
            request.path,
            status,
            error.code.value,
            error.logged,
            extra={"request_id": request_id, "status": status, "protocol": group.protocol},
        )
        headers = [(b"content-type", content_type), (REQUEST_ID_HEADER, header_value(request_id).encode("ascii"))]
        if error.variant is not None:
            headers.append((VARIANT_HEADER.encode(), error.variant.encode()))
        if isinstance(error, UnavailableError) and error.retry_after_s is not None:
            headers.append((b"retry-after", str(max(1, math.ceil(error.retry_after_s))).encode()))
        elif isinstance(error, MethodNotAllowedError):
            headers.append((b"allow", ", ".join(error.allowed).encode()))
        elif isinstance(error, UnsupportedEncodingError):
            headers.append((b"accept-encoding", error.accepted.encode()))
        elif isinstance(error, UnauthenticatedError):
            headers.append((b"www-authenticate", WWW_AUTHENTICATE.encode()))
        return HttpResponse(status, body, headers)


def json_response(document: Any, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> HttpResponse:
    return HttpResponse(status, json_v2.encode_json(document), [*_JSON_HEADERS, *(headers or ())])


def deadline(headers: dict[bytes, bytes]) -> float | None:
    """`Inferd-Timeout-Ms: N`: the client waits N milliseconds; the deadline on the monotonic clock."""
    raw = headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        timeout_ms = float(raw)
    except ValueError:
        timeout_ms = -1.0
    if not timeout_ms > 0 or math.isinf(timeout_ms):
        raise MalformedRequestError(f"Inferd-Timeout-Ms {raw.decode('latin-1')!r} must be a positive number")
    return time.monotonic() + timeout_ms / 1000


def header_text(raw: bytes) -> str:
    # Header bytes are UTF-8 from most clients; anything else is read as Latin-1, as HTTP once was.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def kserve_error(error: InferdError, request_id: str) -> tuple[int, bytes, bytes]:
    """KServe v2's error body, `{"error": message}`, with inferd's fields: every door's default."""
    return HTTP_STATUS[error.code], json_v2.encode_error(error, request_id), json_v2.JSON_CONTENT_TYPE

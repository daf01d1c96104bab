"""KServe v2 over REST: the routes, served by `server.http11.HttpServer`.

No web framework: routing a handful of fixed paths by splitting on "/" costs less than a router,
and every microsecond here is paid by every request. Each handler decodes with `protocol.json_v2`,
calls `InferenceService`, and encodes; errors become `{"error", "code", ..., "request_id"}` with
the status from `protocol.status`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from inferd.core.service import InferenceService
from inferd.errors import (
    InferdError,
    InternalError,
    MalformedRequestError,
    MethodNotAllowedError,
    NotFoundError,
    RequestTooLargeError,
    UnavailableError,
)
from inferd.protocol import json_v2, model_config, server_timing
from inferd.protocol.request_id import REQUEST_ID_HEADER as _REQUEST_ID_HEADER
from inferd.protocol.request_id import check_request_id, header_value
from inferd.protocol.status import HTTP_STATUS
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.logging import current_request_id
from inferd.types import new_request_id

logger = logging.getLogger("inferd.http")

REQUEST_ID_HEADER = _REQUEST_ID_HEADER.encode()
# How long the client will wait, in milliseconds; a request that cannot make it is refused at once.
TIMEOUT_HEADER = json_v2.TIMEOUT_HEADER.encode()
_HEADER_LENGTH = json_v2.HEADER_LENGTH_HEADER.encode()
# HEAD is GET without the body (server.http11 leaves it out), as RFC 9110 asks of every server.
_READ_METHODS = ("GET", "HEAD")
_JSON_HEADERS = [(b"content-type", json_v2.JSON_CONTENT_TYPE)]
_SERVER_TIMING_REQUEST = server_timing.REQUEST_HEADER.encode()
_SERVER_TIMING_RESPONSE = server_timing.RESPONSE_HEADER.encode()


class HttpApp:
    """The routes; `server.http11.HttpServer` hands each complete request to `__call__`."""

    def __init__(self, service: InferenceService, *, max_request_bytes: int) -> None:
        self._service = service
        self._max_request_bytes = max_request_bytes

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = ""
        token = current_request_id.set(request_id)
        try:
            raw_id = request.headers.get(REQUEST_ID_HEADER)
            if raw_id:
                request_id = check_request_id(_header_text(raw_id), "X-Request-ID")
                current_request_id.set(request_id)
            if request.oversized:
                raise self._too_large(request.oversized)
            return await self._route(request)
        except InferdError as exc:
            return self._error(request, exc, exc.request_id or request_id or new_request_id())
        except Exception:
            request_id = request_id or new_request_id()
            current_request_id.set(request_id)
            logger.exception("unexpected error serving %s %s", request.method, request.path)
            return self._error(request, InternalError("internal error; see the server log"), request_id)
        finally:
            current_request_id.reset(token)

    async def _route(self, request: HttpRequest) -> HttpResponse:
        path, method = request.path, request.method
        parts = path.strip("/").split("/")
        if parts[0] != "v2":
            raise NotFoundError(f"no route for {method} {path}")
        if len(parts) == 1:
            return self._get(request, lambda: json_v2.server_metadata_json(self._service.server_metadata()))
        if parts[1] == "repository":
            return await self._repository(request, parts[2:])
        if parts[1] == "health" and len(parts) == 3 and parts[2] in ("live", "ready"):
            _allow(request, _READ_METHODS)
            ok = self._service.live() if parts[2] == "live" else self._service.ready()
            return HttpResponse(200 if ok else 503)
        if parts[1] != "models" or len(parts) < 3:
            raise NotFoundError(f"no route for {method} {path}")
        if len(parts) == 3 and parts[2] == "stats":
            return self._get(request, lambda: json_v2.statistics_json(self._service.model_statistics()))
        model, version, rest = parts[2], "", parts[3:]
        if rest[:1] == ["versions"]:
            if len(rest) < 2:
                raise NotFoundError(f"no route for {method} {path}")
            version, rest = rest[1], rest[2:]
        action = rest[0] if len(rest) == 1 else ("" if not rest else None)
        if action == "infer":
            _allow(request, ("POST",))
            return await self._infer(model, version, request)
        if action == "":
            return self._get(request, lambda: json_v2.model_metadata_json(self._service.model_metadata(model, version)))
        if action == "ready":
            _allow(request, _READ_METHODS)
            return HttpResponse(200 if self._service.model_ready(model, version) else 503)
        if action == "stats":
            return self._get(request, lambda: json_v2.statistics_json(self._service.model_statistics(model, version)))
        if action == "config":
            return self._get(request, lambda: model_config.to_json(self._service.model_config(model, version)))
        raise NotFoundError(f"no route for {method} {path}")

    async def _repository(self, request: HttpRequest, parts: list[str]) -> HttpResponse:
        """Triton's repository extension: index, load, unload."""
        if parts == ["index"]:
            _allow(request, ("POST",))
            entries = await self._service.repository_index(ready_only=json_v2.decode_index_request(request.body))
            return HttpResponse(200, json_v2.encode_json(json_v2.repository_index_json(entries)), list(_JSON_HEADERS))
        if len(parts) == 3 and parts[0] == "models" and parts[2] in ("load", "unload"):
            _allow(request, ("POST",))
            if parts[2] == "load":
                config, files = json_v2.decode_load_request(request.body)
                await self._service.load_model(parts[1], config_json=config, files=files)
            else:
                dependents = json_v2.decode_unload_request(request.body)
                await self._service.unload_model(parts[1], unload_dependents=dependents)
            return HttpResponse(200, b"", list(_JSON_HEADERS))
        raise NotFoundError(f"no route for {request.method} {request.path}")

    def _get(self, request: HttpRequest, document: Callable[[], dict[str, Any]]) -> HttpResponse:
        _allow(request, _READ_METHODS)
        return HttpResponse(200, json_v2.encode_json(document()), list(_JSON_HEADERS))

    async def _infer(self, model: str, version: str, http_request: HttpRequest) -> HttpResponse:
        headers = http_request.headers
        decode_started = time.perf_counter()
        request = json_v2.decode_request(
            http_request.body,
            model_name=model,
            model_version=version,
            header_length=_header_length(headers),
            request_id=current_request_id.get(),
            deadline_s=_deadline(headers),
        )
        request.timing.decode_s = time.perf_counter() - decode_started
        current_request_id.set(request.request_id)
        # NOTE: if the client disconnects meanwhile, HttpServer cancels this task; a request still
        # queued in a batcher is then dropped unrun.
        response = await self._service.infer(request)
        encode_started = time.perf_counter()
        payload, json_length = json_v2.encode_response(response, request)
        request.timing.encode_s = time.perf_counter() - encode_started
        self._service.response_encoded(response, request.timing.encode_s)
        response_headers = [(REQUEST_ID_HEADER, header_value(request.request_id).encode("ascii"))]
        if server_timing.wanted(headers.get(_SERVER_TIMING_REQUEST)):
            response_headers.append((_SERVER_TIMING_RESPONSE, server_timing.encode(request.timing).encode()))
        if json_length is None:
            response_headers.extend(_JSON_HEADERS)
        else:
            response_headers.append((b"content-type", json_v2.BINARY_CONTENT_TYPE))
            response_headers.append((_HEADER_LENGTH, str(json_length).encode()))
        return HttpResponse(200, payload, response_headers)

    def _too_large(self, size: int) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"request body of {size} bytes or more exceeds the server's limit of {self._max_request_bytes} bytes "
            "(--max-request-bytes)",
            expected=f"<= {self._max_request_bytes} bytes",
        )

    def _error(self, request: HttpRequest, error: InferdError, request_id: str) -> HttpResponse:
        status = HTTP_STATUS[error.code]
        log = logger.error if status == 500 else logger.warning
        log(
            "%s %s -> %d %s: %s",
            request.method,
            request.path,
            status,
            error.code.value,
            error.message,
            extra={"request_id": request_id, "status": status},
        )
        headers = [*_JSON_HEADERS, (REQUEST_ID_HEADER, header_value(request_id).encode("ascii"))]
        if isinstance(error, UnavailableError) and error.retry_after_s is not None:
            headers.append((b"retry-after", str(max(1, math.ceil(error.retry_after_s))).encode()))
        elif isinstance(error, MethodNotAllowedError):
            headers.append((b"allow", ", ".join(error.allowed).encode()))
        return HttpResponse(status, json_v2.encode_error(error, request_id), headers)


def _deadline(headers: dict[bytes, bytes]) -> float | None:
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


def _header_text(raw: bytes) -> str:
    # Header bytes are UTF-8 from most clients; anything else is read as Latin-1, as HTTP once was.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _header_length(headers: dict[bytes, bytes]) -> int | None:
    raw = headers.get(_HEADER_LENGTH)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise MalformedRequestError(
            f"Inference-Header-Content-Length {raw.decode('latin-1')!r} is not an integer"
        ) from None


def _allow(request: HttpRequest, methods: tuple[str, ...]) -> None:
    if request.method not in methods:
        raise MethodNotAllowedError(
            f"{request.method} is not allowed on {request.path}; use {' or '.join(methods)}", allowed=methods
        )

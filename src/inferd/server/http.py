"""KServe v2 over REST as a bare ASGI application.

No web framework: routing a handful of fixed paths by splitting on "/" costs less than a router,
and every microsecond here is paid by every request. Each handler decodes with `protocol.json_v2`,
calls `InferenceService`, and encodes; errors become `{"error", "code", ..., "request_id"}` with
the status from `protocol.status`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
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
from inferd.protocol.status import HTTP_STATUS
from inferd.server.logging import current_request_id
from inferd.types import new_request_id

logger = logging.getLogger("inferd.http")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

REQUEST_ID_HEADER = b"x-request-id"
# How long the client will wait, in milliseconds; a request that cannot make it is refused at once.
TIMEOUT_HEADER = b"inferd-timeout-ms"
_HEADER_LENGTH = json_v2.HEADER_LENGTH_HEADER.encode()
_JSON_HEADERS = [(b"content-type", json_v2.JSON_CONTENT_TYPE)]
_SERVER_TIMING_REQUEST = server_timing.REQUEST_HEADER.encode()
_SERVER_TIMING_RESPONSE = server_timing.RESPONSE_HEADER.encode()
# An oversized body is drained up to this many times the limit before the connection is dropped.
_DISCARD_FACTOR = 4


class _ClientGone(Exception):
    """The client disconnected before its body arrived; there is no one to answer."""


class HttpApp:
    def __init__(self, service: InferenceService, *, max_request_bytes: int) -> None:
        self._service = service
        self._max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        request_id = headers.get(REQUEST_ID_HEADER, b"").decode("latin-1")
        token = current_request_id.set(request_id)
        try:
            await self._route(scope, headers, receive, send)
        except _ClientGone:
            return
        except InferdError as exc:
            await self._send_error(send, exc, exc.request_id or request_id or new_request_id(), scope)
        except Exception:
            request_id = request_id or new_request_id()
            current_request_id.set(request_id)
            logger.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            await self._send_error(send, InternalError("internal error; see the server log"), request_id, scope)
        finally:
            current_request_id.reset(token)

    async def _route(self, scope: Scope, headers: dict[bytes, bytes], receive: Receive, send: Send) -> None:
        parts = scope["path"].strip("/").split("/")
        method = scope["method"]
        if parts[0] != "v2":
            raise NotFoundError(f"no route for {method} {scope['path']}")
        if len(parts) == 1:
            return await self._get(method, send, lambda: json_v2.server_metadata_json(self._service.server_metadata()))
        if parts[1] == "health" and len(parts) == 3 and parts[2] in ("live", "ready"):
            ok = self._service.live() if parts[2] == "live" else self._service.ready()
            return await _send(send, 200 if ok else 503, b"", [])
        if parts[1] != "models" or len(parts) < 3:
            raise NotFoundError(f"no route for {method} {scope['path']}")
        if len(parts) == 3 and parts[2] == "stats":
            return await self._get(method, send, lambda: json_v2.statistics_json(self._service.model_statistics()))
        model, version, rest = parts[2], "", parts[3:]
        if rest[:1] == ["versions"]:
            if len(rest) < 2:
                raise NotFoundError(f"no route for {method} {scope['path']}")
            version, rest = rest[1], rest[2:]
        action = rest[0] if len(rest) == 1 else ("" if not rest else None)
        if action == "infer":
            if method != "POST":
                raise _method_not_allowed(method, scope["path"], "POST")
            return await self._infer(model, version, headers, receive, send)
        if action == "":
            return await self._get(
                method, send, lambda: json_v2.model_metadata_json(self._service.model_metadata(model, version))
            )
        if action == "ready":
            ready = self._service.model_ready(model, version)
            return await _send(send, 200 if ready else 503, b"", [])
        if action == "stats":
            return await self._get(
                method, send, lambda: json_v2.statistics_json(self._service.model_statistics(model, version))
            )
        if action == "config":
            return await self._get(
                method, send, lambda: model_config.to_json(self._service.model_config(model, version))
            )
        raise NotFoundError(f"no route for {method} {scope['path']}")

    async def _get(self, method: str, send: Send, document: Callable[[], dict[str, Any]]) -> None:
        if method != "GET":
            raise _method_not_allowed(method, "", "GET")
        await _send(send, 200, json_v2.encode_json(document()), _JSON_HEADERS)

    async def _infer(self, model: str, version: str, headers: dict[bytes, bytes], receive: Receive, send: Send) -> None:
        body = await self._read_body(headers, receive)
        decode_started = time.perf_counter()
        header_length = _header_length(headers)
        request = json_v2.decode_request(
            body,
            model_name=model,
            model_version=version,
            header_length=header_length,
            request_id=current_request_id.get(),
            deadline_s=_deadline(headers),
        )
        request.timing.decode_s = time.perf_counter() - decode_started
        current_request_id.set(request.request_id)
        if self._service.queues(request):
            with _DisconnectWatch(receive):
                response = await self._service.infer(request)
        else:
            response = await self._service.infer(request)
        encode_started = time.perf_counter()
        payload, json_length = json_v2.encode_response(response, request)
        request.timing.encode_s = time.perf_counter() - encode_started
        self._service.response_encoded(response, request.timing.encode_s)
        response_headers = [(REQUEST_ID_HEADER, request.request_id.encode("latin-1"))]
        if server_timing.wanted(headers.get(_SERVER_TIMING_REQUEST)):
            response_headers.append((_SERVER_TIMING_RESPONSE, server_timing.encode(request.timing).encode()))
        if json_length is None:
            response_headers.extend(_JSON_HEADERS)
        else:
            response_headers.append((b"content-type", json_v2.BINARY_CONTENT_TYPE))
            response_headers.append((_HEADER_LENGTH, str(json_length).encode()))
        await _send(send, 200, payload, response_headers)

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_request_bytes:
            await self._discard_body(receive)
            raise self._too_large(f"request body of {int(declared)} bytes")
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            received += len(chunk)
            more = message.get("more_body", False)
            if received > self._max_request_bytes:
                if more:
                    await self._discard_body(receive)
                raise self._too_large("request body")
            chunks.append(chunk)
            if not more:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _discard_body(self, receive: Receive) -> None:
        """Read and drop an oversized body (bounded), so the client is reading when the 413 comes.

        Answering while the client still sends makes its socket reset before it sees the answer.
        """
        budget = _DISCARD_FACTOR * self._max_request_bytes
        while budget > 0:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            budget -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    def _too_large(self, what: str) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"{what} exceeds the server's limit of {self._max_request_bytes} bytes (--max-request-bytes)",
            expected=f"<= {self._max_request_bytes} bytes",
        )

    async def _send_error(self, send: Send, error: InferdError, request_id: str, scope: Scope) -> None:
        status = HTTP_STATUS[error.code]
        log = logger.error if status == 500 else logger.warning
        log(
            "%s %s -> %d %s: %s",
            scope["method"],
            scope["path"],
            status,
            error.code.value,
            error.message,
            extra={"request_id": request_id, "status": status},
        )
        headers = [*_JSON_HEADERS, (REQUEST_ID_HEADER, request_id.encode("latin-1"))]
        if isinstance(error, UnavailableError) and error.retry_after_s is not None:
            headers.append((b"retry-after", str(max(1, math.ceil(error.retry_after_s))).encode()))
        if isinstance(error, RequestTooLargeError):
            # The unread rest of the body would otherwise be parsed as the next request.
            headers.append((b"connection", b"close"))
        await _send(send, status, json_v2.encode_error(error, request_id), headers)


class _DisconnectWatch:
    """Cancels the current request's task if its client disconnects while it waits, so a request
    queued in a batcher is dropped before it costs compute.

    Watching costs a task; most requests finish within WATCH_AFTER_S, so the watch starts only
    when a request is still waiting then. Use as `with _DisconnectWatch(receive): ...`.
    """

    WATCH_AFTER_S = 0.005

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task = asyncio.current_task()
        self._timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.client_gone = False

    def __enter__(self) -> _DisconnectWatch:
        self._timer = asyncio.get_running_loop().call_later(self.WATCH_AFTER_S, self._start)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
        if self.client_gone:
            # The cancellation was ours (or raced the result): the client left, nobody is there to
            # answer. The request ends here without another await, so a pending cancel is moot.
            if self._task is not None and isinstance(error, asyncio.CancelledError):
                self._task.uncancel()
            raise _ClientGone

    def _start(self) -> None:
        self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        message = await self._receive()
        if message["type"] == "http.disconnect" and self._task is not None:
            self.client_gone = True
            self._task.cancel()


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


def _method_not_allowed(method: str, path: str, allowed: str) -> MethodNotAllowedError:
    return MethodNotAllowedError(f"{method} is not allowed on {path or 'this path'}; use {allowed}")


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})

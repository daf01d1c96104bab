"""An asyncio KServe v2 HTTP/1.1 transport: every endpoint of the protocol and its extensions
(health, metadata, config, statistics, repository), tensors in binary (the default) or JSON.

HTTP/1.1 carries one request at a time per connection, so each request in flight holds a
connection of its own: they are opened as requests need them, at most `max_in_flight`, and kept
alive for the next ones (other requests wait for one within their own deadline). Every call has a
deadline, sent to the server as `Inferd-Timeout-Ms`, which it honours. A server's error comes back
as inferd's typed error (`protocol.status.error_from_http`); a server down or slow as an
UnavailableError that names it.

It imports no grpc: an HTTP-only client needs none. Why a transport of its own rather than an
HTTP library: inferd's HTTP server and this client spend less of the two processes' time per call
than grpc.aio does (about 30% of the front process's event-loop time in the split
sentence-similarity pipeline at one client went to grpc.aio's call machinery).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import orjson

from inferd.errors import InferdError, UnavailableError
from inferd.protocol import json_v2
from inferd.protocol.request_id import REQUEST_ID_HEADER, header_value
from inferd.types import InferRequest, InferResponse, ModelIndexEntry, ModelMetadata, ModelStatistics, ServerMetadata

_HEAD_END = b"\r\n\r\n"
# A response head longer than this is not a KServe server's.
_MAX_HEAD_BYTES = 64 * 1024


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.used = False

    def close(self) -> None:
        self.writer.close()


class HttpInferenceClient:
    def __init__(
        self,
        url: str,
        *,
        max_in_flight: int = 64,
        binary: bool = True,
        tls: ssl.SSLContext | None = None,
        authorization: str | None = None,
    ) -> None:
        """`url`: host:port of the server's HTTP endpoint. `binary`: tensors as raw bytes both
        ways (the binary extension), else as JSON. `tls`: speak HTTPS with this context.
        `authorization`: an Authorization header value every request carries."""
        self._tls = tls
        self._authorization = authorization
        self.url = url
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"url {url!r} must be host:port")
        self._host, self._port = host.strip("[]"), int(port)
        self._max_in_flight = max(1, max_in_flight)
        self._binary = binary
        self._idle: list[_Connection] = []
        self._slots: asyncio.Semaphore | None = None

    async def infer(self, request: InferRequest, *, timeout_s: float) -> InferResponse:
        """The server's response, within `timeout_s` seconds (waiting for a connection included)."""
        body, header_length = json_v2.encode_request(request, binary=self._binary)
        headers = [("Content-Type", "application/octet-stream" if header_length is not None else "application/json")]
        if header_length is not None:
            headers.append((json_v2.HEADER_LENGTH_HEADER, str(header_length)))
        request_id = request.context.request_id
        if request_id:
            headers.append((REQUEST_ID_HEADER, header_value(request_id)))
        path = _model_path(request.model_name, request.model_version, "infer")
        response_headers, payload = await self._ok("POST", path, body, timeout_s, headers)
        raw_length = response_headers.get(json_v2.HEADER_LENGTH_HEADER)
        try:
            return json_v2.decode_response(
                payload, header_length=int(raw_length) if raw_length else None, request_id=request_id
            )
        except (InferdError, ValueError) as exc:
            raise UnavailableError(f"server {self.url} sent a response that is not KServe v2: {exc}") from None

    async def submit_async(
        self, request: InferRequest | None, location: Mapping[str, Any] | None, query: str, *, timeout_s: float
    ) -> Any:
        """Keep an async job: `request` inline (as `infer` sends it), or the `location` form; the
        202's JSON."""
        if request is not None:
            body, header_length = json_v2.encode_request(request, binary=self._binary)
            content_type = "application/octet-stream" if header_length is not None else "application/json"
            headers = [("Content-Type", content_type)]
            if header_length is not None:
                headers.append((json_v2.HEADER_LENGTH_HEADER, str(header_length)))
            path = _model_path(request.model_name, request.model_version, "infer_async")
        else:
            assert location is not None
            body, headers = json.dumps(location["body"]).encode(), [("Content-Type", "application/json")]
            path = _model_path(location["model"], location.get("version", ""), "infer_async")
        return json.loads((await self._ok("POST", path + query, body, timeout_s, headers))[1])

    async def server_live(self, *, timeout_s: float) -> bool:
        return await self._status("GET", "/v2/health/live", timeout_s) == 200

    async def server_ready(self, *, timeout_s: float) -> bool:
        return await self._status("GET", "/v2/health/ready", timeout_s) == 200

    async def model_ready(self, name: str, version: str = "", *, timeout_s: float) -> bool:
        return await self._status("GET", _model_path(name, version, "ready"), timeout_s) == 200

    async def server_metadata(self, *, timeout_s: float) -> ServerMetadata:
        return json_v2.decode_server_metadata(await self._json("GET", "/v2", b"", timeout_s))

    async def model_metadata(self, name: str, version: str = "", *, timeout_s: float) -> ModelMetadata:
        return json_v2.decode_model_metadata(await self._json("GET", _model_path(name, version), b"", timeout_s))

    async def model_config(self, name: str, version: str = "", *, timeout_s: float) -> dict[str, Any]:
        document = orjson.loads(await self._json("GET", _model_path(name, version, "config"), b"", timeout_s))
        return dict(document)

    async def statistics(self, name: str = "", version: str = "", *, timeout_s: float) -> list[ModelStatistics]:
        path = _model_path(name, version, "stats") if name else "/v2/models/stats"
        return json_v2.decode_statistics(await self._json("GET", path, b"", timeout_s))

    async def repository_index(self, ready: bool = False, *, timeout_s: float) -> list[ModelIndexEntry]:
        body = json_v2.encode_index_request(ready)
        return json_v2.decode_repository_index(await self._json("POST", "/v2/repository/index", body, timeout_s))

    async def load_model(
        self, name: str, config_json: str = "", files: Mapping[str, bytes] | None = None, *, timeout_s: float
    ) -> None:
        body = json_v2.encode_load_request(config_json, files)
        await self._json("POST", f"/v2/repository/models/{_quote(name)}/load", body, timeout_s)

    async def unload_model(self, name: str, unload_dependents: bool = False, *, timeout_s: float) -> None:
        body = json_v2.encode_unload_request(unload_dependents)
        await self._json("POST", f"/v2/repository/models/{_quote(name)}/unload", body, timeout_s)

    async def call_json(self, method: str, path: str, document: Any, *, timeout_s: float) -> Any:
        """A JSON call of an API the typed methods do not cover (endpoints, rollouts): its answer
        read as JSON (None when empty); an error answer raised typed, as the others are."""
        body = json.dumps(document).encode() if document is not None else b""
        payload = await self._json(method, path, body, timeout_s)
        return json.loads(payload) if payload else None

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        # A TLS connection closes with a handshake of its own: wait for it (bounded), so that its
        # socket is closed when the caller's loop stops.
        for connection in idle:
            try:
                await asyncio.wait_for(connection.writer.wait_closed(), 1.0)
            except (TimeoutError, OSError):
                connection.writer.transport.abort()

    async def _json(self, method: str, path: str, body: bytes, timeout_s: float) -> bytes:
        headers = [("Content-Type", "application/json")] if body else []
        return (await self._ok(method, path, body, timeout_s, headers))[1]

    async def _status(self, method: str, path: str, timeout_s: float) -> int:
        return (await self._call(method, path, [], b"", timeout_s))[0]

    async def _ok(
        self, method: str, path: str, body: bytes, timeout_s: float, headers: list[tuple[str, str]]
    ) -> tuple[dict[str, str], bytes]:
        """The response's headers and body; its error, typed, when it is not a 2xx (a 201 made, a 202
        kept for later)."""
        status, response_headers, payload = await self._call(method, path, headers, body, timeout_s)
        if not 200 <= status < 300:
            raise json_v2.decode_error_response(status, payload, retry_after=response_headers.get("retry-after"))
        return response_headers, payload

    async def _call(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes, timeout_s: float
    ) -> tuple[int, dict[str, str], bytes]:
        deadline = time.monotonic() + timeout_s
        if self._slots is None:  # on the loop that will use it
            self._slots = asyncio.Semaphore(self._max_in_flight)
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._slots.acquire()  # returns at once, without a timer, when one is free
                try:
                    return await self._exchange(method, path, headers, body, deadline)
                finally:
                    self._slots.release()
        except TimeoutError:
            raise UnavailableError(
                f"server {self.url} did not answer within {timeout_s * 1000:.0f} ms", retry_after_s=timeout_s
            ) from None
        except (OSError, asyncio.IncompleteReadError, _ProtocolError) as exc:
            raise UnavailableError(f"server {self.url} is unavailable: {exc!r}") from None

    async def _exchange(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes, deadline: float
    ) -> tuple[int, dict[str, str], bytes]:
        """One request and its response on a kept-alive connection. A connection the server closed
        while it sat idle fails before any answer: the request then goes once more on a new one."""
        timeout_ms = max(1, int((deadline - time.monotonic()) * 1000))
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.url}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers]
        if self._authorization is not None:
            lines.append(f"Authorization: {self._authorization}")
        lines.append(f"{json_v2.TIMEOUT_HEADER}: {timeout_ms}")
        message = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        for attempt in range(2):
            connection = (self._idle_connection() if attempt == 0 else None) or await self._open()
            reused = connection.used
            try:
                connection.writer.write(message)
                status, response_headers, payload = await _read_response(connection.reader)
            except (OSError, asyncio.IncompleteReadError) as exc:
                connection.close()
                if reused and attempt == 0 and _nothing_read(exc):
                    continue
                raise
            except BaseException:  # timed out or cancelled mid-exchange: the connection's state is unknown
                connection.close()
                raise
            connection.used = True
            if response_headers.get("connection", "").lower() == "close":
                connection.close()
            else:
                self._idle.append(connection)
            return status, response_headers, payload
        raise AssertionError("unreachable")

    def _idle_connection(self) -> _Connection | None:
        """A kept-alive connection the server has not closed yet (as far as this side knows)."""
        while self._idle:
            connection = self._idle.pop()
            if not connection.reader.at_eof():
                return connection
            connection.close()
        return None

    async def _open(self) -> _Connection:
        reader, writer = await asyncio.open_connection(
            self._host,
            self._port,
            limit=_MAX_HEAD_BYTES,
            ssl=self._tls,
            server_hostname=self._host if self._tls is not None else None,
        )
        return _Connection(reader, writer)


class _ProtocolError(Exception):
    """The server's bytes are not an HTTP/1.1 response inferd can read."""


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    try:
        head = await reader.readuntil(_HEAD_END)
    except asyncio.LimitOverrunError:
        raise _ProtocolError(f"response head longer than {_MAX_HEAD_BYTES} bytes") from None
    status_line, *header_lines = head[: -len(_HEAD_END)].decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise _ProtocolError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length", "0")
    if not length.isdigit():
        raise _ProtocolError(f"response without a usable Content-Length ({length!r})")
    return int(parts[1]), headers, await reader.readexactly(int(length))


def _nothing_read(exc: BaseException) -> bool:
    """Whether the connection failed before any of the response came (the server had closed it)."""
    return not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial


def _model_path(name: str, version: str, *tail: str) -> str:
    path = f"/v2/models/{_quote(name)}"
    if version:
        path += f"/versions/{_quote(version)}"
    return "/".join((path, *tail))


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")

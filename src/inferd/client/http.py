"""An asyncio KServe v2 HTTP client with the binary tensor extension, for server-to-server calls
(the `remote` runtime's `protocol: "http"`).

HTTP/1.1 carries one request at a time per connection, so each request in flight holds a
connection of its own: they are opened as requests need them, at most `max_in_flight`, and kept
alive for the next ones (other requests wait for one within their own deadline). Tensors travel
as raw bytes both ways (no JSON numbers). Every call has a deadline, sent to the server as
`Inferd-Timeout-Ms`, which it honours. The server's answer comes back as inferd's own errors, as
in the gRPC client: a 4xx stays the request's fault (400); a server down, slow or failing is a 503
that says which server and why.

Why a second transport: inferd's HTTP server and this client spend less of the two processes'
time per call than grpc.aio does (about 30% of the front process's event-loop time in the split
sentence-similarity pipeline at one client went to grpc.aio's call machinery).
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse

from inferd.errors import InferdError, InvalidRequestError, UnavailableError
from inferd.protocol import json_v2
from inferd.protocol.request_id import REQUEST_ID_HEADER, header_value
from inferd.types import InferRequest, InferResponse, ModelMetadata

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
    def __init__(self, url: str, *, max_in_flight: int = 64) -> None:
        """`url`: host:port of the server's HTTP endpoint."""
        self.url = url
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"url {url!r} must be host:port")
        self._host, self._port = host.strip("[]"), int(port)
        self._max_in_flight = max(1, max_in_flight)
        self._idle: list[_Connection] = []
        self._slots: asyncio.Semaphore | None = None

    async def infer(self, request: InferRequest, *, timeout_s: float) -> InferResponse:
        """The server's response, within `timeout_s` seconds (waiting for a connection included)."""
        deadline = time.monotonic() + timeout_s
        where = f"remote model server {self.url} (model '{request.model_name}')"
        body, header_length = json_v2.encode_request(request)
        version = f"/versions/{urllib.parse.quote(request.model_version, safe='')}" if request.model_version else ""
        path = f"/v2/models/{urllib.parse.quote(request.model_name, safe='')}{version}/infer"
        headers = [
            ("Content-Type", "application/octet-stream"),
            (json_v2.HEADER_LENGTH_HEADER, str(header_length)),
        ]
        if request.request_id:
            headers.append((REQUEST_ID_HEADER, header_value(request.request_id)))
        status, response_headers, payload = await self._call("POST", path, headers, body, deadline, where, timeout_s)
        if status != 200:
            raise _error(status, payload, where)
        raw_length = response_headers.get(json_v2.HEADER_LENGTH_HEADER)
        try:
            return json_v2.decode_response(
                payload, header_length=int(raw_length) if raw_length else None, request_id=request.request_id
            )
        except (InferdError, ValueError) as exc:
            raise UnavailableError(f"{where} sent a response that is not KServe v2: {exc}") from None

    async def model_metadata(self, name: str, version: str = "", *, timeout_s: float) -> ModelMetadata:
        where = f"remote model server {self.url} (model '{name}')"
        path = f"/v2/models/{urllib.parse.quote(name, safe='')}"
        if version:
            path += f"/versions/{urllib.parse.quote(version, safe='')}"
        status, _, payload = await self._call("GET", path, [], b"", time.monotonic() + timeout_s, where, timeout_s)
        if status != 200:
            raise _error(status, payload, where)
        try:
            return json_v2.decode_model_metadata(payload)
        except InferdError as exc:
            raise UnavailableError(f"{where} sent model metadata that is not KServe v2: {exc.message}") from None

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def _call(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        deadline: float,
        where: str,
        timeout_s: float,
    ) -> tuple[int, dict[str, str], bytes]:
        if self._slots is None:  # on the loop that will use it
            self._slots = asyncio.Semaphore(self._max_in_flight)
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._slots.acquire()  # returns at once, without a timer, when one is free
                try:
                    return await self._exchange(method, path, headers, body, deadline)
                finally:
                    self._slots.release()
        except TimeoutError:
            raise UnavailableError(
                f"{where} did not answer within {timeout_s * 1000:.0f} ms", retry_after_s=timeout_s
            ) from None
        except (OSError, asyncio.IncompleteReadError, _ProtocolError) as exc:
            raise UnavailableError(f"{where} is unavailable: {exc!r}") from None

    async def _exchange(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes, deadline: float
    ) -> tuple[int, dict[str, str], bytes]:
        """One request and its response on a kept-alive connection. A connection the server closed
        while it sat idle fails before any answer: the request then goes once more on a new one."""
        timeout_ms = max(1, int((deadline - time.monotonic()) * 1000))
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.url}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers]
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
        reader, writer = await asyncio.open_connection(self._host, self._port, limit=_MAX_HEAD_BYTES)
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


def _error(status: int, payload: bytes, where: str) -> InferdError:
    message = json_v2.decode_error(payload)
    if 400 <= status < 500 and status not in (404, 408, 429):
        return InvalidRequestError(f"{where} refused the request: {message}")
    if status == 503:
        return UnavailableError(f"{where} is unavailable: {message}")
    return UnavailableError(f"{where} failed: HTTP {status} {message}")

"""HTTP/1.1 connections on asyncio: inferd's own server for its REST endpoints.

Why not uvicorn: on the tiny models inferd must serve at the hardware's limit, uvicorn's
per-request work (an ASGI scope and message dicts, a task and an event per request, the headers
and the body written in two system calls) cost more than inferd's whole inference path. This
module does the same job with less: httptools parses, a request is handed over once its body is
complete, and each response goes out in one write. What a client may rely on is kept:

* keep-alive (HTTP/1.1 default, HTTP/1.0 on request) and pipelining: requests on one connection
  are answered one at a time, in order; reading pauses while parsed requests wait;
* `Expect: 100-continue` is answered before the body is read, or refused at once with 413 when
  the declared length is over the limit;
* a body over `max_request_bytes` is read and dropped (bounded), then answered with 413 and the
  connection closed; request heads over `max_head_bytes` get 431;
* a client that disconnects cancels the task of its request, wherever it waits (a batcher's
  queue then drops the request unrun);
* writes pause while the client does not read (transport flow control);
* idle connections close after `keep_alive_s`; `shutdown` stops listening, closes idle
  connections, lets the requests in flight finish, then closes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast

import httptools

logger = logging.getLogger("inferd.http")

# How many times the limit an oversized body may be read (and dropped) before the connection is
# simply closed: the client then sees its 413 instead of a reset while it still sends.
DISCARD_FACTOR = 4
# Bodies larger than this are written without being copied into one buffer with the head.
_COPY_LIMIT = 64 * 1024


@dataclass(slots=True)
class HttpRequest:
    method: str
    # Percent-decoded.
    path: str
    query: bytes
    # Names lower-cased; a repeated header keeps its last value.
    headers: dict[bytes, bytes]
    body: bytes
    # Bytes declared or seen when the body was over the limit (and dropped); 0 otherwise.
    oversized: int = 0
    keep_alive: bool = True


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    # Close the connection once this response is sent.
    close: bool = False


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class _Rejected(Exception):
    """Raised from a parser callback: the request cannot be read; answer `status` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    return f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")


_STATUS_LINES = {status.value: _status_line(status.value) for status in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class HttpServer:
    """Serves `handler` on one listening socket."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_request_bytes: int,
        max_head_bytes: int = 64 * 1024,
        keep_alive_s: float = 5.0,
    ) -> None:
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.max_head_bytes = max_head_bytes
        self.keep_alive_s = keep_alive_s
        self.connections: set[_Connection] = set()
        # Requests read and not yet answered, on every connection.
        self.in_flight = 0
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._all_closed = asyncio.Event()
        self.stopping = False

    async def start(self, host: str, port: int, *, backlog: int = 2048) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, backlog=backlog, reuse_address=True
        )
        self._sweeper = loop.create_task(self._close_idle_connections())

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def shutdown(self, timeout_s: float) -> None:
        """Stop accepting; answer what is in flight (up to `timeout_s`), then close everything."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for connection in list(self.connections):
            connection.close_when_done()
        if self.connections:
            self._all_closed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), timeout_s)
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()

    def connection_closed(self, connection: _Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self._all_closed.set()

    async def _close_idle_connections(self) -> None:
        # One sweep a second instead of a timer per request: keep-alive costs requests nothing.
        while True:
            await asyncio.sleep(min(1.0, self.keep_alive_s))
            idle_since = time.monotonic() - self.keep_alive_s
            for connection in list(self.connections):
                if connection.idle and connection.last_active < idle_since:
                    connection.close_when_done()


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs them one at a time, writes the answers."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self.last_active = time.monotonic()
        # The request being parsed.
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._head_bytes = 0
        self._chunks: list[bytes] = []
        self._body_bytes = 0
        self._oversized = 0
        # Set when a request was answered from its head (an `Expect` refused): the rest is ignored.
        self._answered_early = False
        # Parsed requests waiting for the one in flight, and the task running them.
        self._pending: deque[HttpRequest] = deque()
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._closing = False

    @property
    def idle(self) -> bool:
        return self._task is None and not self._pending and not self._url

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # NOTE: uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)
        if self._server.stopping:
            self.close_when_done()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self.last_active = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            rejected = exc.__context__
            if isinstance(rejected, _Rejected):
                self._reject(rejected.status, rejected.message)
            else:  # a bug in a callback below
                logger.exception("failed to read an HTTP request")
                self._reject(500, "internal error reading the request")
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._reject(400, f"invalid HTTP request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._drop_pending()
        if self._task is not None:
            # The client is gone: whatever its request waits for (a batcher's queue, an instance)
            # is dropped rather than computed for nobody.
            self._task.cancel()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._server.connection_closed(self)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._head_bytes = 0
        self._chunks = []
        self._body_bytes = 0
        self._oversized = 0
        self._answered_early = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value
        self._count_head(len(name) + len(value))

    def on_headers_complete(self) -> None:
        declared = self._headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._server.max_request_bytes:
            self._oversized = int(declared)
        if self._headers.get(b"expect", b"").lower() == b"100-continue":
            if self._oversized:
                # The client waits before sending the body: refuse now, and never read it.
                self._finish_request()
                self._answered_early = True
            elif self._task is None and not self._pending:
                self._write(_CONTINUE)
            # NOTE: behind pipelined requests the 100 is not sent; the client sends its body after
            # its own timeout, as RFC 9110 allows.

    def on_body(self, body: bytes) -> None:
        if self._answered_early:
            return
        self._body_bytes += len(body)
        if self._oversized:
            if self._body_bytes > DISCARD_FACTOR * self._server.max_request_bytes:
                raise _Rejected(413, f"request body exceeds {DISCARD_FACTOR}x the server's limit; closing")
            return
        if self._body_bytes > self._server.max_request_bytes:
            self._oversized = self._body_bytes
            self._chunks = []
            return
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if not self._answered_early:
            self._finish_request()

    # -- serving --------------------------------------------------------------------------------

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._server.max_head_bytes:
            raise _Rejected(431, f"request head exceeds {self._server.max_head_bytes} bytes")

    def _finish_request(self) -> None:
        parsed = httptools.parse_url(self._url)
        path = parsed.path.decode("latin-1")
        if "%" in path:
            path = urllib.parse.unquote(path)
        chunks = self._chunks
        request = HttpRequest(
            method=self._parser.get_method().decode("ascii"),
            path=path,
            query=parsed.query or b"",
            headers=self._headers,
            body=chunks[0] if len(chunks) == 1 else b"".join(chunks),
            oversized=self._oversized,
            # After an oversized body the stream cannot be trusted to be at a request's start.
            keep_alive=self._parser.should_keep_alive() and not self._oversized,
        )
        self._url = b""
        self._chunks = []
        self._pending.append(request)
        self._server.in_flight += 1
        if self._task is None:
            self._task = self._loop.create_task(self._serve())
        elif not self._reading_paused and self._transport is not None:
            # Pipelined: hold further requests in the socket until these are answered.
            self._transport.pause_reading()
            self._reading_paused = True

    async def _serve(self) -> None:
        try:
            while self._pending and not self._transport_gone():
                request = self._pending[0]
                try:
                    response = await self._server.handler(request)
                except Exception:
                    logger.exception("unhandled error serving %s %s", request.method, request.path)
                    response = HttpResponse(500, b"internal error; see the server log", close=True)
                finally:
                    # Answered, or cancelled because the client left (which dropped it already).
                    if self._pending and self._pending[0] is request:
                        self._pending.popleft()
                        self._server.in_flight -= 1
                keep_alive = request.keep_alive and not response.close and not self._closing
                self._send(response, request.method, keep_alive)
                self.last_active = time.monotonic()
                if not keep_alive:
                    self._close()
                    return
                if self._writable is not None and not self._writable.done():
                    await self._writable
                if self._reading_paused and len(self._pending) <= 1 and self._transport is not None:
                    self._transport.resume_reading()
                    self._reading_paused = False
        finally:
            self._task = None
            if self._closing and not self._transport_gone():
                self._close()

    def _send(self, response: HttpResponse, method: str, keep_alive: bool) -> None:
        status_line = _STATUS_LINES.get(response.status) or _status_line(response.status)
        parts = [status_line]
        for name, value in response.headers:
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"content-length: %d\r\n" % len(response.body))
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if method == "HEAD" or not response.body:
            self._write(b"".join(parts))
        elif len(response.body) <= _COPY_LIMIT:
            parts.append(response.body)
            self._write(b"".join(parts))
        else:
            self._write(b"".join(parts))
            self._write(response.body)

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _reject(self, status: int, message: str) -> None:
        """Answer a request that could not be read, after those before it, and close."""
        self._closing = True
        body = message.encode("utf-8", errors="replace")
        headers = [(b"content-type", b"text/plain; charset=utf-8")]
        rejection = HttpResponse(status, body, headers, close=True)
        if self._task is None:
            self._send(rejection, "", keep_alive=False)
            self._close()
        else:
            # Answered by _serve's `finally` closing the connection after the one in flight.
            self._drop_pending(keep=1)
            logger.warning("closing a connection after its request in flight: %s", message)

    def _drop_pending(self, keep: int = 0) -> None:
        """Forget the requests read but not answered, but for the first `keep` (the one in flight
        is `_pending[0]`)."""
        while len(self._pending) > keep:
            self._pending.pop()
            self._server.in_flight -= 1

    def close_when_done(self) -> None:
        """Close now if idle, else after the requests already read are answered."""
        self._closing = True
        if self._task is None and not self._pending:
            self._close()

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()

    def _close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def _transport_gone(self) -> bool:
        return self._transport is None or self._transport.is_closing()

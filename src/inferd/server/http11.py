"""HTTP/1.1 connections on asyncio: inferd's own server for its REST endpoints.

Why not uvicorn: on the tiny models inferd must serve at the hardware's limit, uvicorn's
per-request work (an ASGI scope and message dicts, a task and an event per request, the headers
and the body written in two system calls) cost more than inferd's whole inference path. This
module does the same job with less: httptools parses, a request is handed over once its body is
complete, and each response goes out in one write. What a client may rely on is kept, and what
a slow or hostile client may try is bounded (`HttpLimits`):

* keep-alive (HTTP/1.1 default, HTTP/1.0 on request) and pipelining: requests on one connection
  are answered one at a time, in order; reading pauses while parsed requests wait, and more than
  `max_pipelined` parsed and unanswered requests close the connection (after those before);
* `Expect: 100-continue` is answered before the body is read;
* a body declared (or, chunked, seen) over `max_request_bytes` is refused at once with 413, never
  read: the handler answers from the head, then the connection lingers (write side shut, what
  still arrives read and dropped, for at most `linger_s`) so the client reads its 413 instead of
  a reset; the same for a request that cannot be parsed (400) or whose head is over
  `max_head_bytes` (431), an unterminated header line included;
* a request must arrive at a usable pace: its head within `read_timeout_s` of its first byte,
  its body at `min_body_bytes_per_s` on average after `read_timeout_s` of grace; else 408;
* a client that does not read its responses for `write_timeout_s` is disconnected;
* at most `max_connections` at once: one more is answered 503 (Retry-After: 1) and closed;
* a client that disconnects cancels the task of its request, wherever it waits (a batcher's
  queue then drops the request unrun);
* idle connections close after `keep_alive_s`; `shutdown` stops listening, closes idle
  connections, lets the requests in flight finish, then closes the rest.
All time limits are enforced by one sweep over the connections (a few times a second), not by
a timer per request, so they cost requests nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import BinaryIO, cast

import httptools

from inferd.server.auth import is_loopback_host

logger = logging.getLogger("inferd.http")

# Bodies larger than this are written without being copied into one buffer with the head.
_COPY_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one connection may cost the server. Defaults are nginx's and Kestrel's order of magnitude."""

    max_request_bytes: int = 64 * 1024 * 1024
    """Largest body accepted, declared or chunked."""
    max_head_bytes: int = 64 * 1024
    """Largest request line plus headers (431 above it)."""
    max_header_count: int = 100
    """Header fields at most (431 above it), as Apache's LimitRequestFields and Envoy's default."""
    keep_alive_s: float = 5.0
    """An idle connection (no request started) closes after this long."""
    read_timeout_s: float = 10.0
    """A request head must arrive within this long of its first byte; a body gets it as grace."""
    min_body_bytes_per_s: float = 1024.0
    """After the grace, a body must have arrived at this average rate (408 below it)."""
    write_timeout_s: float = 30.0
    """A client that reads none of its response for this long is disconnected."""
    max_connections: int = 4096
    """Open connections at most; one more gets 503 and is closed."""
    max_pipelined: int = 128
    """Requests parsed and not yet answered on one connection at most."""
    linger_s: float = 2.0
    """After a refusal, how long unread request bytes are still read and dropped before closing."""
    spool: BodySpool | None = None
    """Routes whose bodies are written to disk as they arrive, never held in memory (async submits)."""
    discard_bytes_per_s: float = 1024 * 1024
    """How fast bytes are read and dropped after a refusal (past a first `DISCARD_BURST_BYTES`):
    enough for what a client had in flight; a client streaming a huge body is held back by TCP
    instead of costing the server a core of reads (an oversized-body flood's whole cost)."""


@dataclass(frozen=True, slots=True)
class BodySpool:
    """Bodies of POSTs to paths ending in `suffix` (`/infer_async`): up to `max_bytes` (not the
    server's body limit). One past `memory_bytes` is written to a file in `folder` as it arrives and
    handed over as the request's `body_file` (the handler takes the file, or it is removed once
    answered); a smaller one is read as any body, with no file made for it."""

    folder: Path
    max_bytes: int
    memory_bytes: int = 256 * 1024
    suffix: bytes = b"/infer_async"
    # The setting that sets `max_bytes`, named when a body is refused for exceeding it.
    setting: str = "--max-async-request-bytes"

    def open(self) -> tuple[BinaryIO, Path]:
        """A new file in the folder for a body, open for writing, and its path: both edges' one way."""
        self.folder.mkdir(parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=self.folder, prefix=".body-")
        return os.fdopen(descriptor, "wb"), Path(name)


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
    # The limit it was over, and the setting that sets it (the async routes have their own).
    limit: tuple[int, str] = (0, "")
    keep_alive: bool = True
    # The client is on this host (a loopback peer): what only such a client may do (shared memory).
    local_peer: bool = False
    # A spooled body (HttpLimits.spool): its file, `body` then empty.
    body_file: Path | None = None


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    # Close the connection once this response is sent.
    close: bool = False


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class _StopParsing(Exception):
    """Raised from a parser callback once a request was answered from its head: parse no further."""


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
_TEXT_HEADERS = ((b"content-type", b"text/plain; charset=utf-8"),)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
DISCARD_BURST_BYTES = 256 * 1024


class HttpServer:
    """Serves `handler` on one listening socket."""

    def __init__(self, handler: Handler, limits: HttpLimits | None = None) -> None:
        self.handler = handler
        self.limits = limits or HttpLimits()
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._all_closed = asyncio.Event()
        self.stopping = False

    async def start(self, host: str, port: int, *, backlog: int = 2048, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: serve HTTPS. A handshake must end within `read_timeout_s` (a client that stalls in
        it is dropped); only then is the connection counted and served."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self),
            host,
            port,
            backlog=backlog,
            reuse_address=True,
            ssl=tls,
            ssl_handshake_timeout=self.limits.read_timeout_s if tls is not None else None,
        )
        self._sweeper = loop.create_task(self._sweep())

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

    async def _sweep(self) -> None:
        limits = self.limits
        shortest_s = min(limits.keep_alive_s, limits.read_timeout_s, limits.write_timeout_s, limits.linger_s)
        while True:
            await asyncio.sleep(min(1.0, shortest_s / 4))
            now = time.monotonic()
            for connection in list(self.connections):
                connection.enforce_time_limits(now)


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs them one at a time, writes the answers."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._limits = server.limits
        self._max_header_count = server.limits.max_header_count  # read for every header field
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._local_peer = False
        self._parser = httptools.HttpRequestParser(self)
        self.last_active = time.monotonic()
        # The request being parsed: when its first byte came (None between requests), when its
        # head ended (None before), and what has been read of it.
        self._started_at: float | None = None
        self._head_ended_at: float | None = None
        self._messages_begun = 0
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        # Header fields whose name came before in the head (the count limit counts every field).
        self._repeated_headers = 0
        self._head_bytes = 0
        self._chunks: list[bytes] = []
        self._body_bytes = 0
        # The spool when the request's route spools bodies (HttpLimits.spool), the body's file once
        # it is past the spool's memory_bytes, and the route's limit.
        self._spooling: BodySpool | None = None
        self._spooled: BinaryIO | None = None
        self._spooled_path = Path()
        self._max_body_bytes = self._limits.max_request_bytes
        # Set when a request was answered from its head (an `Expect` refused, a body too large):
        # the rest of the message is not read.
        self._answered_early = False
        # Parsed requests waiting for the one in flight, and the task running them.
        self._pending: deque[HttpRequest] = deque()
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._write_paused_at: float | None = None
        self._closing = False
        # Set once nothing more is parsed: what arrives is dropped. `_linger` says whether the
        # client may still be sending when the connection closes; if so, the connection then shuts
        # its write side and drops what arrives until the client's EOF or `_linger_until`.
        self._discarding = False
        self._linger = False
        self._linger_until: float | None = None
        # Bytes dropped since discarding began, and when it began: the discard rate's budget.
        self._discarded = 0
        self._discard_started_at = 0.0
        self._discard_paused = False

    @property
    def idle(self) -> bool:
        return self._task is None and not self._pending and self._started_at is None

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # NOTE: uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self._local_peer = isinstance(peer, tuple) and is_loopback_host(str(peer[0]))
        self._server.connections.add(self)
        if self._server.stopping:
            self.close_when_done()
        elif len(self._server.connections) > self._limits.max_connections:
            self._discarding = self._linger = True
            message = f"the server holds its limit of {self._limits.max_connections} connections; retry later"
            self._send(
                HttpResponse(503, message.encode(), [(b"retry-after", b"1"), *_TEXT_HEADERS], close=True),
                "",
                keep_alive=False,
            )
            self._close()

    def data_received(self, data: bytes) -> None:
        if self._discarding or self._closing:
            self._discard(len(data))
            return
        self.last_active = time.monotonic()
        started_at = self._started_at
        head_open_before = self._messages_begun if started_at is not None and self._head_ended_at is None else -1
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            rejected = exc.__context__
            if isinstance(rejected, _Rejected):
                self._reject(rejected.status, rejected.message)
            elif not isinstance(rejected, _StopParsing):  # a bug in a callback below
                logger.exception("failed to read an HTTP request")
                self._reject(500, "internal error reading the request")
            return
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as exc:
            self._reject(400, f"invalid HTTP request: {exc}")
            return
        if head_open_before == self._messages_begun and self._started_at is not None and self._head_ended_at is None:
            # httptools hands over a header only once it ends, so a header line that never ends
            # is counted here: all of this data belonged to the open head. (The data a head
            # begins in is not counted: that undercounts by at most one read, never overcounts.)
            self._count_head(len(data), raising=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._drop_spooled()  # a body cut off midway
        self._drop_pending()
        if self._task is not None:
            # The client is gone: whatever its request waits for (a batcher's queue, an instance)
            # is dropped rather than computed for nobody.
            self._task.cancel()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._server.connection_closed(self)

    def pause_writing(self) -> None:
        self._write_paused_at = time.monotonic()
        if self._writable is None or self._writable.done():
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        self._write_paused_at = None
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def enforce_time_limits(self, now: float) -> None:
        """Called by the server's sweep: closes what has outstayed its limit."""
        limits = self._limits
        if self._linger_until is not None:
            if now > self._linger_until:
                self.abort()
        elif self._write_paused_at is not None and now - self._write_paused_at > limits.write_timeout_s:
            logger.warning("closing a connection whose client read nothing for %.0f s", limits.write_timeout_s)
            self.abort()
        elif self._started_at is not None and not self._reading_paused and not self._discarding:
            if self._head_ended_at is None:
                if now - self._started_at > limits.read_timeout_s:
                    self._reject(408, f"request head not received within {limits.read_timeout_s:g} s", linger=False)
            elif now - self._head_ended_at > limits.read_timeout_s + self._body_bytes / limits.min_body_bytes_per_s:
                self._reject(
                    408,
                    f"request body arriving slower than {limits.min_body_bytes_per_s:g} bytes/s",
                    linger=False,
                )
        elif self.idle and not self._closing and now - self.last_active > limits.keep_alive_s:
            self.close_when_done()

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._messages_begun += 1
        self._started_at = self.last_active  # the time of the read this request's first byte came in
        self._head_ended_at = None
        self._url = b""
        self._headers = {}
        self._repeated_headers = 0
        self._head_bytes = 0
        self._chunks = []
        self._body_bytes = 0
        self._answered_early = False
        self._drop_spooled()
        self._max_body_bytes = self._limits.max_request_bytes

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        # Every request's every field passes here: the usual one costs a lookup, two comparisons
        # and the head's size; a repeated name, a Transfer-Encoding or one field too many go on.
        lowered = name.lower()
        headers = self._headers
        if (
            lowered in headers
            or lowered == b"transfer-encoding"
            or len(headers) + self._repeated_headers >= self._max_header_count
        ):
            self._unusual_header(lowered, value)
        headers[lowered] = value
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > self._limits.max_head_bytes:
            self._count_head(0)

    def _unusual_header(self, lowered: bytes, value: bytes) -> None:
        """A field whose name came before (a chunked body's trailers included), a Transfer-Encoding,
        or a field past the count limit."""
        if len(self._headers) + self._repeated_headers >= self._max_header_count:
            raise _Rejected(431, f"request has more than {self._max_header_count} header fields")
        if lowered == b"transfer-encoding" and value.strip().lower() != b"chunked":
            # A coding inferd would not undo (gzip, chunked) must not reach a handler as if it were
            # the body: refused, as RFC 9112 asks and nginx does. (llhttp refuses chunked before
            # another coding, and Transfer-Encoding beside Content-Length.)
            raise _Rejected(501, f"Transfer-Encoding {value.decode('latin-1')!r} is not supported; use chunked")
        if lowered in self._headers:
            self._repeated_headers += 1

    def on_headers_complete(self) -> None:
        self._head_ended_at = self.last_active
        spool = self._limits.spool
        # A substring test first: every other request (inference itself) pays only that.
        if (
            spool is not None
            and spool.suffix in self._url
            and self._parser.get_method() == b"POST"
            and httptools.parse_url(self._url).path.endswith(spool.suffix)
        ):
            self._max_body_bytes = spool.max_bytes
            self._spooling = spool
        declared = self._headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body_bytes:
            # Refused by its declared length, before a byte of the body is read.
            self._answer_early(oversized=int(declared))
        elif self._headers.get(b"expect", b"").lower() == b"100-continue" and self._task is None and not self._pending:
            self._write(_CONTINUE)
            # NOTE: behind pipelined requests the 100 is not sent; the client sends its body after
            # its own timeout, as RFC 9110 allows.

    def on_body(self, body: bytes) -> None:
        if self._answered_early:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body_bytes:
            # A chunked body, whose size shows only as it arrives.
            self._chunks = []
            self._answer_early(oversized=self._body_bytes)  # the spooled part, if any, is dropped
            return
        if self._spooled is not None:
            self._spooled.write(body)  # NOTE: on the loop, as the reads are: a disk keeps up with a socket
            return
        self._chunks.append(body)
        if self._spooling is not None and self._body_bytes > self._spooling.memory_bytes:
            self._spool(self._spooling)

    def _spool(self, spool: BodySpool) -> None:
        """From here on the body goes to a file (what came so far first)."""
        # Open across callbacks (closed when the body ends or the request goes): no `with`.
        self._spooled, self._spooled_path = spool.open()
        self._spooled.writelines(self._chunks)
        self._chunks = []

    def on_message_complete(self) -> None:
        if not self._answered_early:
            self._finish_request()
        self._started_at = None

    # -- serving --------------------------------------------------------------------------------

    def _count_head(self, size: int, *, raising: bool = True) -> None:
        self._head_bytes += size
        if self._head_bytes > self._limits.max_head_bytes:
            message = f"request head exceeds {self._limits.max_head_bytes} bytes"
            if raising:  # inside a parser callback: the parser stops at once
                raise _Rejected(431, message)
            self._reject(431, message)

    def _answer_early(self, *, oversized: int) -> None:
        """Hand the request over from its head, marked `oversized`; read nothing more of it."""
        self._answered_early = True
        self._discarding = self._linger = True
        self._finish_request(oversized=oversized)
        raise _StopParsing

    def _finish_request(self, *, oversized: int = 0) -> None:
        parsed = httptools.parse_url(self._url)
        path = parsed.path.decode("latin-1")
        if "%" in path:
            path = urllib.parse.unquote(path)
        chunks = self._chunks
        body_file = None
        spool = self._spooling
        limit = (spool.max_bytes, spool.setting) if spool is not None else (self._max_body_bytes, "--max-request-bytes")
        if self._spooled is not None and not oversized:
            self._spooled.close()
            body_file, self._spooled = self._spooled_path, None
        self._drop_spooled()
        request = HttpRequest(
            method=self._parser.get_method().decode("ascii"),
            path=path,
            query=parsed.query or b"",
            headers=self._headers,
            body=chunks[0] if len(chunks) == 1 else b"".join(chunks),
            oversized=oversized,
            limit=limit,
            # After a refused body the stream is not at a request's start.
            keep_alive=self._parser.should_keep_alive() and not oversized,
            local_peer=self._local_peer,
            body_file=body_file,
        )
        self._url = b""
        self._chunks = []
        self._pending.append(request)
        if self._task is None:
            self._task = self._loop.create_task(self._serve())
        elif len(self._pending) > self._limits.max_pipelined:
            raise _Rejected(503, f"more than {self._limits.max_pipelined} pipelined requests unanswered; closing")
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
                    if request.body_file is not None:  # not taken by the handler
                        request.body_file.unlink(missing_ok=True)
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
                    if self._started_at is not None:
                        # A request begun in the socket while reading was paused: its clock starts now.
                        self._started_at = self.last_active
                        if self._head_ended_at is not None:
                            self._head_ended_at = self.last_active
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

    def _discard(self, size: int) -> None:
        """Drop `size` bytes; past the budget (a burst, then `discard_bytes_per_s`), stop reading
        until it allows more, so that TCP, not the server, holds the sender back."""
        now = time.monotonic()
        if self._discarded == 0:
            self._discard_started_at = now
        self._discarded += size
        allowed = DISCARD_BURST_BYTES + (now - self._discard_started_at) * self._limits.discard_bytes_per_s
        transport = self._transport
        if self._discarded > allowed and not self._discard_paused and transport is not None:
            self._discard_paused = True
            transport.pause_reading()
            self._loop.call_later((self._discarded - allowed) / self._limits.discard_bytes_per_s, self._resume_discard)

    def _resume_discard(self) -> None:
        self._discard_paused = False
        if not self._transport_gone():
            assert self._transport is not None
            self._transport.resume_reading()

    def _reject(self, status: int, message: str, *, linger: bool = True) -> None:
        """Answer a request that could not be read, after those before it, and close.

        `linger`: the client may still be sending (a body, a long head); keep reading and dropping
        it for a moment after the answer, so that the close does not reset the answer away."""
        self._closing = True
        self._discarding = True
        self._linger = linger
        body = message.encode("utf-8", errors="replace")
        rejection = HttpResponse(status, body, list(_TEXT_HEADERS), close=True)
        if self._task is None:
            self._send(rejection, "", keep_alive=False)
            self._close()
        else:
            # Answered by _serve's `finally` closing the connection after the one in flight.
            self._drop_pending(keep=1)
            logger.warning("closing a connection after its request in flight: %s", message)

    def _drop_spooled(self) -> None:
        self._spooling = None
        if self._spooled is not None:
            self._spooled.close()
            self._spooled_path.unlink(missing_ok=True)
            self._spooled = None

    def _drop_pending(self, keep: int = 0) -> None:
        """Forget the requests read but not answered, but for the first `keep` (the one in flight
        is `_pending[0]`)."""
        while len(self._pending) > keep:
            dropped = self._pending.pop()
            if dropped.body_file is not None:
                dropped.body_file.unlink(missing_ok=True)

    def close_when_done(self) -> None:
        """Close now if idle or lingering, else after the requests already read are answered."""
        if self._linger_until is not None:
            self.abort()
            return
        self._closing = True
        if self._task is None and not self._pending:
            self._close()

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()

    def _close(self) -> None:
        """Close once what is written is sent; when the client may still be sending, linger first:
        shut the write side, then drop what arrives until its EOF or for `linger_s` at most."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._linger_until is not None:
            return
        if self._linger and transport.can_write_eof():
            self._discarding = True
            self._linger_until = time.monotonic() + self._limits.linger_s
            transport.write_eof()
        else:
            transport.close()

    def _transport_gone(self) -> bool:
        return self._transport is None or self._transport.is_closing()

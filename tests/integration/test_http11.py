"""inferd's HTTP/1.1 server, over real sockets on 127.0.0.1: what clients rely on beyond one
request and one response (keep-alive, pipelining, Expect, limits, disconnects, shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from inferd.server.http11 import HttpLimits, HttpRequest, HttpResponse, HttpServer
from inferd.testing.framing import CHUNKED, FRAMING, SMUGGLED, NginxFront, exchange, nginx_in_front

LIMIT = 1024
MAX_CONNECTIONS = 16


class EchoHandler:
    """Answers with the request's method, path and body; `/slow` waits until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.seen: list[HttpRequest] = []

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.seen.append(request)
        if request.oversized:
            return HttpResponse(413, b"too large %d" % request.oversized)
        if request.path == "/slow":
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if request.path == "/boom":
            raise RuntimeError("a bug")
        if request.path == "/large":
            return HttpResponse(200, b"x" * (4 << 20))
        body = b"%s %s %s" % (request.method.encode(), request.path.encode(), request.body)
        return HttpResponse(200, body, [(b"x-query", request.query)])


_writers: list[asyncio.StreamWriter] = []


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpServer, EchoHandler]]:
    handler = EchoHandler()
    limits = HttpLimits(
        max_request_bytes=LIMIT,
        max_head_bytes=2048,
        keep_alive_s=0.3,
        read_timeout_s=0.5,
        min_body_bytes_per_s=100,
        write_timeout_s=0.5,
        max_connections=MAX_CONNECTIONS,
        max_pipelined=8,
        linger_s=1.0,
    )
    server = HttpServer(handler, limits)
    await server.start("127.0.0.1", 0)
    yield server, handler
    await server.shutdown(1.0)
    while _writers:
        writer = _writers.pop()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(b": ", 1) for line in lines[1:] if line)
    body = await asyncio.wait_for(reader.readexactly(int(headers.get(b"content-length", b"0"))), 5)
    return status, headers, body


async def connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection, closed when the test ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    _writers.append(writer)
    return reader, writer


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)


async def test_keep_alive_serves_many_requests_on_one_connection(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    for i in range(3):
        writer.write(post("/echo", b"body-%d" % i))
        status, headers, body = await read_response(reader)
        assert (status, body) == (200, b"POST /echo body-%d" % i)
        assert b"connection" not in headers


async def test_pipelined_requests_are_answered_in_order(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"".join(post(f"/p{i}", b"%d" % i) for i in range(5)))
    bodies = [(await read_response(reader))[2] for _ in range(5)]
    assert bodies == [b"POST /p%d %d" % (i, i) for i in range(5)]


async def test_chunked_body_query_and_percent_decoded_path(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(
        b"POST /a%20b?x=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    status, headers, body = await read_response(reader)
    assert (status, body, headers[b"x-query"]) == (200, b"POST /a b abcde", b"x=1")


async def test_http10_closes_after_the_response(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"GET /old HTTP/1.0\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"], body) == (200, b"close", b"GET /old ")
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_expect_100_continue(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    assert (await read_response(reader))[2] == b"POST /e hello"


async def test_expect_with_oversized_length_is_refused_before_the_body(
    served: tuple[HttpServer, EchoHandler],
) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (LIMIT + 1))
    status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"], body) == (413, b"close", b"too large %d" % (LIMIT + 1))


async def test_chunked_body_over_the_limit_is_refused_once_it_passes_it(
    served: tuple[HttpServer, EchoHandler],
) -> None:
    server, handler = served
    reader, writer = await connect(server)
    # Chunked, so the size is only known while reading: refused as the limit is passed.
    chunk = b"x" * 512
    writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(4):
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    writer.write(b"0\r\n\r\n")
    status, headers, _ = await read_response(reader)
    assert (status, headers[b"connection"]) == (413, b"close")
    assert handler.seen[-1].body == b"" and handler.seen[-1].oversized > LIMIT
    assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_declared_length_over_the_limit_is_refused_at_once_without_reading_the_body(
    served: tuple[HttpServer, EchoHandler],
) -> None:
    server, _ = served
    reader, writer = await connect(server)
    # Declares 300 times the limit, sends a little of it, and keeps the connection open.
    writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (300 * LIMIT))
    writer.write(b"x" * (10 * LIMIT))
    status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"], body) == (413, b"close", b"too large %d" % (300 * LIMIT))
    # The server shut its side; what the client still sends is dropped, and the connection is gone
    # after the linger time even though the client never closes.
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.write(b"x" * (10 * LIMIT))
    await wait_until(lambda: not server.connections)


async def test_a_refused_client_that_keeps_streaming_is_held_back_by_tcp(
    served: tuple[HttpServer, EchoHandler],
) -> None:
    """After a refusal the server drops what still arrives at a bounded rate (a burst, then
    `discard_bytes_per_s`), not as fast as a client can send: an oversized-body flood costs it
    almost nothing, and the client still reads its 413."""
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (300 << 20))
    loop = asyncio.get_running_loop()
    written, chunk = 0, b"x" * 65536
    deadline = loop.time() + 0.8  # within the linger time
    while loop.time() < deadline and not writer.transport.is_closing():
        if writer.transport.get_write_buffer_size() < (1 << 20):
            writer.write(chunk)
            written += len(chunk)
        await asyncio.sleep(0)
    # What left this side's buffer is in the kernel's socket buffers or read by the server: a few
    # MiB at most, where an unthrottled server reads hundreds of MiB in this time.
    taken = written - writer.transport.get_write_buffer_size()
    assert taken < 24 << 20, f"the server took {taken >> 20} MiB"
    status, _, body = await read_response(reader)
    assert (status, body) == (413, b"too large %d" % (300 << 20))
    await wait_until(lambda: not server.connections)


async def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Polls `condition` (bounded): for state the server changes on its own clock."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


async def test_malformed_request_gets_400_and_close(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"]) == (400, b"close")
    assert b"invalid HTTP request" in body


async def test_oversized_head_gets_431(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
    assert (await read_response(reader))[0] == 431


async def test_handler_bug_is_a_500_and_the_server_keeps_serving(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_response(reader))[0] == 500
    reader, writer = await connect(server)
    writer.write(b"GET /fine HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_response(reader))[0] == 200


async def test_head_sends_the_length_but_no_body(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b"content-length: 8" in head
    # The next response starts right after the head: no body was sent for HEAD.
    assert (await read_response(reader))[2] == b"GET /next "


async def test_disconnect_cancels_the_request_in_flight(served: tuple[HttpServer, EchoHandler]) -> None:
    server, handler = served
    _, writer = await connect(server)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(handler.started.wait(), 5)
    writer.close()
    await asyncio.wait_for(handler.cancelled.wait(), 5)


async def test_idle_connections_close_after_keep_alive(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    await read_response(reader)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert not server.connections


async def test_shutdown_finishes_the_request_in_flight_and_refuses_new_connections(
    served: tuple[HttpServer, EchoHandler],
) -> None:
    server, handler = served
    reader, writer = await connect(server)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(handler.started.wait(), 5)
    idle_reader, _ = await connect(server)
    port = server.port
    shutting_down = asyncio.create_task(server.shutdown(5.0))
    # The idle connection closes at once; the busy one gets its answer, marked as the last.
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    handler.release.set()
    status, headers, _ = await read_response(reader)
    assert (status, headers[b"connection"]) == (200, b"close")
    await asyncio.wait_for(shutting_down, 5)
    assert not handler.cancelled.is_set()


async def test_shutdown_cancels_what_outlives_the_timeout(served: tuple[HttpServer, EchoHandler]) -> None:
    server, handler = served
    _, writer = await connect(server)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(handler.started.wait(), 5)
    await asyncio.wait_for(server.shutdown(0.1), 5)
    await asyncio.wait_for(handler.cancelled.wait(), 5)
    assert not server.connections


async def test_header_line_that_never_ends_gets_431(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nX-Big: ")
    for _ in range(8):  # 8 x 512 bytes of one header value, never terminated
        writer.write(b"a" * 512)
        await writer.drain()
        await asyncio.sleep(0.01)
    status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"]) == (431, b"close")
    assert b"request head exceeds 2048 bytes" in body


async def test_head_trickled_byte_by_byte_times_out_and_costs_others_nothing(
    served: tuple[HttpServer, EchoHandler],
) -> None:
    server, _ = served
    slow_reader, slow_writer = await connect(server)
    request = b"GET /slowloris HTTP/1.1\r\nHost: x\r\n\r\n"

    async def trickle() -> None:
        for byte in request:  # one byte every 50 ms: the head would take 2 s; the limit is 0.5 s
            slow_writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    # Meanwhile another client is served as usual.
    reader, writer = await connect(server)
    writer.write(b"GET /fine HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_response(reader))[0] == 200
    status, headers, body = await read_response(slow_reader)
    assert (status, headers[b"connection"]) == (408, b"close")
    assert b"request head not received within 0.5 s" in body
    trickling.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await trickling


async def test_body_trickled_below_the_minimum_rate_times_out(served: tuple[HttpServer, EchoHandler]) -> None:
    server, handler = served
    reader, writer = await connect(server)
    writer.write(b"POST /slow-body HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n")
    for _ in range(5):  # 1 byte per 50 ms = 20 bytes/s, under the 100 bytes/s floor
        writer.write(b"x")
        await asyncio.sleep(0.05)
    status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"]) == (408, b"close")
    assert b"slower than 100 bytes/s" in body
    assert not [r for r in handler.seen if r.path == "/slow-body"]


async def test_client_that_never_reads_is_disconnected(served: tuple[HttpServer, EchoHandler]) -> None:
    import socket

    server, _ = served
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills fast
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
    try:
        # Pipelined requests for large responses, none of which the client reads.
        await asyncio.get_running_loop().sock_sendall(sock, b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
        await wait_until(lambda: not server.connections)
    finally:
        sock.close()


async def test_connections_over_the_cap_get_503_and_the_rest_are_served(
    served: tuple[HttpServer, EchoHandler],
) -> None:
    server, handler = served
    busy = []
    for _ in range(MAX_CONNECTIONS):
        reader, writer = await connect(server)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        busy.append(reader)
    await wait_until(lambda: len(handler.seen) == MAX_CONNECTIONS)
    reader, writer = await connect(server)
    writer.write(b"GET /one-too-many HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert (status, headers[b"retry-after"], headers[b"connection"]) == (503, b"1", b"close")
    assert b"limit of 16 connections" in body
    handler.release.set()
    for reader in busy:
        assert (await read_response(reader))[0] == 200


async def test_pipelining_past_the_cap_closes_after_the_answered_ones(served: tuple[HttpServer, EchoHandler]) -> None:
    server, handler = served
    reader, writer = await connect(server)
    # One slow request, then more pipelined behind it than a connection may hold.
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n" * 20)
    await asyncio.wait_for(handler.started.wait(), 5)
    handler.release.set()
    assert (await read_response(reader))[0] == 200
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert [r.path for r in handler.seen] == ["/slow"]


# Requests a proxy in front and inferd could read differently (request smuggling), and heads that
# break the grammar (inferd.testing.framing.FRAMING): each is refused with its status and the
# connection closed, so nothing after it on the connection is read as a request.
@pytest.mark.parametrize("name", FRAMING)
async def test_ambiguous_or_malformed_framing_is_refused_and_closes(
    served: tuple[HttpServer, EchoHandler], name: str
) -> None:
    server, handler = served
    request, status = FRAMING[name]
    reader, writer = await connect(server)
    writer.write(request + SMUGGLED)  # a second request behind it, which must never be read as one
    answer, headers, _ = await read_response(reader)
    assert (answer, headers[b"connection"]) == (status, b"close")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert [r.path for r in handler.seen if r.path == "/smuggled"] == []


@pytest.fixture
async def behind_nginx(tmp_path: Path) -> AsyncIterator[tuple[NginxFront, EchoHandler]]:
    handler = EchoHandler()
    server = HttpServer(handler, HttpLimits())
    await server.start("127.0.0.1", 0)
    try:
        with nginx_in_front(server.port, tmp_path) as front:
            yield front, handler
    finally:
        await server.shutdown(1.0)


@pytest.mark.parametrize("name", FRAMING)
async def test_behind_nginx_inferd_reads_exactly_the_requests_nginx_forwards(
    behind_nginx: tuple[NginxFront, EchoHandler], name: str
) -> None:
    """nginx in front (HTTP/1.1 keep-alive to inferd, as ingress-nginx): whatever nginx makes of a
    case (it refuses most; it accepts a bare LF and forwards well-formed requests), inferd parses
    the same requests nginx sent it, no more: nothing is smuggled past the proxy."""
    front, handler = behind_nginx
    request, _ = FRAMING[name]
    statuses = await exchange(front.port, request + SMUGGLED)
    assert statuses, "nginx gave no answer"
    assert [r.path for r in handler.seen] == front.forwarded()
    assert all(status < 500 or status == 501 for status in statuses), statuses


async def test_chunk_extensions_are_allowed_and_ignored(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    writer.write(CHUNKED + b"3;name=value\r\nabc\r\n0\r\n\r\n")
    assert (await read_response(reader))[::2] == (200, b"POST /a abc")


async def test_too_many_header_fields_get_431(served: tuple[HttpServer, EchoHandler]) -> None:
    server, _ = served
    reader, writer = await connect(server)
    fields = b"".join(b"h%d: v\r\n" % i for i in range(server.limits.max_header_count))
    writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")  # one more than the limit with Host
    status, headers, body = await read_response(reader)
    assert (status, headers[b"connection"]) == (431, b"close")
    assert b"more than 100 header fields" in body
    reader, writer = await connect(server)
    repeated = b"h: v\r\n" * (server.limits.max_header_count + 1)  # one name: every field counts
    writer.write(b"GET /a HTTP/1.1\r\n" + repeated + b"\r\n")
    assert (await read_response(reader))[0] == 431
    reader, writer = await connect(server)
    trailers = b"t: v\r\n" * server.limits.max_header_count  # trailers count with the head's fields
    writer.write(
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n" + trailers + b"\r\n"
    )
    assert (await read_response(reader))[0] == 431
    reader, writer = await connect(server)
    writer.write(b"GET /a HTTP/1.1\r\n" + fields + b"\r\n")  # exactly the limit
    assert (await read_response(reader))[0] == 200

"""The experimental granian edge (server/rsgi.py) over real sockets: the request it hands inferd's
handler, and the limits held around granian (413 by declared length, 408 for a slow body, a
disconnect cancelling the request in flight). test_http11.py's handler and client helpers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from inferd.server.http11 import HttpLimits
from inferd.server.rsgi import GranianServer  # imports granian only when a server starts
from tests.integration.test_http11 import LIMIT, EchoHandler, post, read_response


@pytest.fixture
async def served() -> AsyncIterator[tuple[GranianServer, EchoHandler]]:
    handler = EchoHandler()
    limits = HttpLimits(max_request_bytes=LIMIT, read_timeout_s=0.5, min_body_bytes_per_s=100, max_connections=16)
    server = GranianServer(handler, limits)
    await server.start("127.0.0.1", 0)
    yield server, handler
    await server.shutdown(1.0)


@contextlib.asynccontextmanager
async def connection(server: GranianServer) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_the_handler_gets_inferds_request(served: tuple[GranianServer, EchoHandler]) -> None:
    server, handler = served
    async with connection(server) as (reader, writer):
        for i in range(2):  # keep-alive
            writer.write(post("/a%20b?x=1", b"body-%d" % i, b"X-Caps: Yes\r\n"))
            status, headers, body = await read_response(reader)
            assert (status, body, headers[b"x-query"]) == (200, b"POST /a b body-%d" % i, b"x=1")
    request = handler.seen[-1]
    assert (request.path, request.query, request.headers[b"x-caps"]) == ("/a b", b"x=1", b"Yes")


async def test_declared_length_over_the_limit_is_refused_without_reading_the_body(
    served: tuple[GranianServer, EchoHandler],
) -> None:
    server, handler = served
    async with connection(server) as (reader, writer):
        writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (300 * LIMIT))
        writer.write(b"x" * (10 * LIMIT))
        status, headers, body = await read_response(reader)
        assert (status, headers[b"connection"], body) == (413, b"close", b"too large %d" % (300 * LIMIT))
    assert handler.seen[-1].body == b""


async def test_body_trickled_below_the_minimum_rate_times_out(served: tuple[GranianServer, EchoHandler]) -> None:
    server, handler = served
    async with connection(server) as (reader, writer):
        writer.write(b"POST /slow-body HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n")
        for _ in range(5):
            writer.write(b"x")
            await asyncio.sleep(0.05)
        status, headers, body = await read_response(reader)
        assert (status, headers[b"connection"]) == (408, b"close")
        assert b"slower than 100 bytes/s" in body
    assert not [r for r in handler.seen if r.path == "/slow-body"]


async def test_disconnect_cancels_the_request_in_flight(served: tuple[GranianServer, EchoHandler]) -> None:
    server, handler = served
    async with connection(server) as (_, writer):
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(handler.started.wait(), 5)
    await asyncio.wait_for(handler.cancelled.wait(), 5)

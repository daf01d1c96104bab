"""The async submit routes' bodies on both HTTP edges (http11 and the granian edge), over real
sockets: a body past the spool's memory size reaches the handler as a file written as it arrived
(removed once answered, unless taken), a smaller one as bytes with no file made, the submit
routes take bodies up to their own limit and every other route keeps the server's, a 413 names
the setting that was exceeded, and a body cut off midway reaches no handler and leaves no file."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from inferd.server.http11 import BodySpool, HttpLimits, HttpRequest, HttpResponse, HttpServer
from inferd.server.rsgi import GranianServer
from tests.integration.test_http11 import post, read_response

pytestmark = pytest.mark.timeout(60)

MEMORY = 100_000  # past the granian edge's read-whole size, so both edges stream what is larger
SPOOL_LIMIT = 1_000_000
LIMIT = 1024


class SpoolHandler:
    """Answers what it got: the body's size in memory, or the spooled file's (read in the handler:
    the edge removes the file once answered)."""

    def __init__(self) -> None:
        self.files: list[tuple[Path, bytes]] = []
        self.paths: list[str] = []

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.paths.append(request.path)
        if request.oversized:
            limit, setting = request.limit
            return HttpResponse(413, b"over %d (%s)" % (limit, setting.encode()))
        if request.body_file is not None:
            self.files.append((request.body_file, request.body_file.read_bytes()))
            return HttpResponse(200, b"file %d" % request.body_file.stat().st_size)
        return HttpResponse(200, b"memory %d" % len(request.body))


@pytest.fixture(params=["http11", "granian"])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Any, SpoolHandler, Path]]:
    handler = SpoolHandler()
    folder = tmp_path / "spool"
    limits = HttpLimits(max_request_bytes=LIMIT, spool=BodySpool(folder, SPOOL_LIMIT, memory_bytes=MEMORY))
    server: Any = HttpServer(handler, limits) if request.param == "http11" else GranianServer(handler, limits)
    await server.start("127.0.0.1", 0)
    yield server, handler, folder
    await server.shutdown(1.0)


async def exchange(server: Any, message: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(message)
        status, _, body = await read_response(reader)
        return status, body
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_a_submit_body_past_memory_size_goes_to_a_file_and_a_small_one_does_not(
    served: tuple[Any, SpoolHandler, Path],
) -> None:
    server, handler, folder = served
    large = bytes(range(256)) * 1200  # 307,200 bytes
    assert await exchange(server, post("/v2/models/m/infer_async", large)) == (200, b"file %d" % len(large))
    assert len(handler.files) == 1 and handler.files[0][1] == large  # whole, as it was sent
    assert not handler.files[0][0].exists() and not list(folder.iterdir())  # not taken: removed
    small = b"y" * (MEMORY - 1)
    assert await exchange(server, post("/v2/models/m/infer_async", small)) == (200, b"memory %d" % len(small))
    assert len(handler.files) == 1  # no file for it


async def test_each_route_keeps_its_own_limit_and_a_refusal_names_it(served: tuple[Any, SpoolHandler, Path]) -> None:
    server, _, folder = served
    status, body = await exchange(server, post("/v2/models/m/infer", b"x" * (LIMIT + 1)))
    assert (status, body) == (413, b"over %d (--max-request-bytes)" % LIMIT)
    declared = b"POST /v2/models/m/infer_async HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (SPOOL_LIMIT + 1)
    status, body = await exchange(server, declared)
    assert (status, body) == (413, b"over %d (--max-async-request-bytes)" % SPOOL_LIMIT)
    assert not folder.exists() or not list(folder.iterdir())


@pytest.mark.parametrize("sent", [40_000, 150_000, 500_000])  # read whole, in memory, spooled
async def test_a_body_cut_off_midway_reaches_no_handler_and_leaves_no_file(
    served: tuple[Any, SpoolHandler, Path], sent: int
) -> None:
    server, handler, folder = served
    declared = 50_000 if sent < 50_000 else 600_000
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v2/models/m/infer_async HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % declared)
    writer.write(b"x" * sent)
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()  # the client goes midway
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    for _ in range(100):  # whatever the edge does with it, it does within a second
        await asyncio.sleep(0.01)
    assert await exchange(server, post("/after", b"ok")) == (200, b"memory 2")  # the edge still serves
    assert handler.paths == ["/after"] and handler.files == []
    assert not folder.exists() or not list(folder.iterdir())

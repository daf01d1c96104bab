"""A bare REST edge: a handler that reads the body and answers a fixed 150-byte JSON document,
served by one of the edges that benchmarks/http_edge.py --bare compares:

* inferd: inferd's own HTTP/1.1 server (server/http11.py's HttpServer);
* granian: granian's embedded server through inferd's adapter (server/rsgi.py's GranianServer);
* granian-raw: granian's embedded server with an RSGI app that does the same work, no adapter.

    python benchmarks/baselines/edge_server.py {inferd,granian,granian-raw} PORT
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import uvloop

from inferd.server.http11 import HttpRequest, HttpResponse, HttpServer
from inferd.server.rsgi import GranianServer

ANSWER = (
    b'{"model_name":"tiny","model_version":"1",'
    b'"outputs":[{"name":"y","datatype":"FP32","shape":[1,4],"data":[0.7,-5.8,2.05,-1.3]}]}'
)
HEADERS = [(b"content-type", b"application/json")]


async def handler(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, ANSWER, HEADERS)


class RawApp:
    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        await protocol()
        protocol.response_bytes(200, [("content-type", "application/json")], ANSWER)


async def main(edge: str, port: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if edge == "inferd":
        server: Any = HttpServer(handler)
        await server.start("127.0.0.1", port)
    elif edge == "granian":
        server = GranianServer(handler)
        await server.start("127.0.0.1", port)
    else:
        from granian.constants import HTTPModes, Interfaces
        from granian.server.embed import Server

        embedded = Server(RawApp(), address="127.0.0.1", port=port, interface=Interfaces.RSGI, http=HTTPModes.http1)
        serving = asyncio.get_running_loop().create_task(embedded.serve())
    await stop.wait()
    if edge == "granian-raw":
        embedded.stop()
        await serving
    else:
        await server.shutdown(1.0)


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], int(sys.argv[2])))

#!/usr/bin/env python3
"""Each framing case a proxy and inferd could read differently (inferd.testing.framing.FRAMING),
followed on its connection by a second request, sent to inferd's HTTP server alone and to nginx in
front of it (HTTP/1.1 keep-alive to inferd, as ingress-nginx): the statuses each client saw, what
nginx forwarded and what inferd read behind it. They must agree: inferd never reads a request
that nginx did not forward as one.

    make nginx && .venv/bin/python benchmarks/edge_framing.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from inferd.server.http11 import HttpLimits, HttpRequest, HttpResponse, HttpServer
from inferd.testing.framing import FRAMING, SMUGGLED, exchange, nginx_in_front

console = Console(width=None if sys.stdout.isatty() else 170)


class Recorder:
    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.paths.append(request.path)
        return HttpResponse(200, b"ok")


async def main() -> int:
    alone_handler, behind_handler = Recorder(), Recorder()
    alone, behind = HttpServer(alone_handler, HttpLimits()), HttpServer(behind_handler, HttpLimits())
    await alone.start("127.0.0.1", 0)
    await behind.start("127.0.0.1", 0)
    table = Table(title="framing cases, each with a second request behind it on the connection")
    for column in ("case", "inferd alone: answers", "inferd alone read", "nginx in front: answers",
                   "nginx forwarded", "inferd behind nginx read", "agree"):  # fmt: skip
        table.add_column(column)
    disagreements = 0
    with tempfile.TemporaryDirectory() as state, nginx_in_front(behind.port, Path(state)) as front:
        for name, (request, _) in FRAMING.items():
            alone_handler.paths.clear()
            behind_handler.paths.clear()
            front.access_log.write_text("")
            direct = await exchange(alone.port, request + SMUGGLED)
            proxied = await exchange(front.port, request + SMUGGLED)
            forwarded, read = front.forwarded(), list(behind_handler.paths)
            disagreements += forwarded != read
            table.add_row(
                name,
                " ".join(map(str, direct)),
                " ".join(alone_handler.paths) or "nothing",
                " ".join(map(str, proxied)),
                " ".join(forwarded) or "nothing",
                " ".join(read) or "nothing",
                "yes" if forwarded == read else "NO",
            )
    await asyncio.gather(alone.shutdown(1.0), behind.shutdown(1.0))
    console.print(table)
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

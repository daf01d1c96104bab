#!/usr/bin/env python3
"""What a slow or hostile client meets at the REST edge: inferd's own HTTP/1.1 server against
granian's embedded one (server/rsgi.py), probed with raw sockets, side by side.

    .venv/bin/python benchmarks/http_edge_limits.py

Both edges serve one test handler in one event loop (as `inferd serve` would), with the same
`HttpLimits`: inferd's defaults but for short time limits (read 2 s, keep-alive 1 s, write 3 s)
and 8 connections at most, so that every probe ends within seconds. Each probe reports what its
client saw: the status it was answered (and when), or that the connection was closed or reset
without one, and when. Needs granian (pip install 'inferd[granian]').
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from inferd.server.http11 import HttpLimits, HttpRequest, HttpResponse, HttpServer
from inferd.server.rsgi import GranianServer

LIMITS = HttpLimits(
    keep_alive_s=1.0,
    read_timeout_s=2.0,
    write_timeout_s=3.0,
    max_connections=8,
)
LARGE = 4 << 20
console = Console(width=None if sys.stdout.isatty() else 170)


class ProbeHandler:
    """/slow waits until released (and notes a cancellation); /large answers 4 MiB; else a few bytes."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled = threading.Event()

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.oversized:
            return HttpResponse(413, b"too large", close=True)
        if request.path == "/slow":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if request.path == "/large":
            return HttpResponse(200, b"x" * LARGE)
        return HttpResponse(200, b"ok %d" % len(request.body))


@dataclass
class Edge:
    name: str
    port: int
    handler: ProbeHandler
    loop: asyncio.AbstractEventLoop

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.handler.release.set)

    def hold(self) -> None:
        self.loop.call_soon_threadsafe(self.handler.release.clear)


# -- client side --------------------------------------------------------------------------------


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    return sock


def outcome(sock: socket.socket, started: float, timeout_s: float) -> str:
    """What the client reads from now on: the first response's status and when, then when the
    connection closed (EOF or reset); or that nothing came within `timeout_s`."""
    sock.settimeout(0.1)
    data, status, closed = b"", "", ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            continue
        except ConnectionResetError:
            closed = f"reset at {time.monotonic() - started:.1f} s"
            break
        if not chunk:
            closed = f"closed at {time.monotonic() - started:.1f} s"
            break
        data += chunk
        if not status and b"\r\n" in data:
            status = f"{data.split(b' ', 2)[1].decode()} at {time.monotonic() - started:.1f} s"
    parts = [status or "no answer", closed or f"still open after {timeout_s:.0f} s"]
    return ", ".join(parts)


def send_in_background(sock: socket.socket, chunks: Iterable[bytes], pace_s: float = 0.0) -> list[int]:
    """Sends `chunks` (one every `pace_s`) until they end or the server stops taking them; the
    bytes sent so far, in a one-element list that the thread updates."""
    sent = [0]

    def run() -> None:
        with contextlib.suppress(OSError):
            for chunk in chunks:
                sock.sendall(chunk)
                sent[0] += len(chunk)
                if pace_s:
                    time.sleep(pace_s)

    threading.Thread(target=run, daemon=True).start()
    return sent


def server_holds(server_port: int, client_port: int) -> bool:
    """Whether a process still holds the server's end of this connection (/proc/net/tcp: the entry
    is gone once the kernel dropped it, and its inode is 0 once the process closed it)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            return inode != "0"
    return False


# -- probes -------------------------------------------------------------------------------------


def head_trickle(edge: Edge) -> str:
    sock = connect(edge.port)
    started = time.monotonic()
    head = b"GET /slowloris HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 200
    send_in_background(sock, (bytes([byte]) for byte in head), 0.1)
    try:
        return outcome(sock, started, 12)
    finally:
        sock.close()


def endless_header_line(edge: Edge) -> str:
    sock = connect(edge.port)
    started = time.monotonic()
    sent = send_in_background(sock, [b"GET / HTTP/1.1\r\nX-Big: ", *[b"a" * 65536] * 64])
    try:
        return f"{outcome(sock, started, 8)}; {sent[0] >> 10} KiB of 4 MiB taken"
    finally:
        sock.close()


def long_head(edge: Edge) -> str:
    sock = connect(edge.port)
    started = time.monotonic()
    lines = b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 1000) for i in range(100))  # ~100 KiB of headers
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    try:
        return outcome(sock, started, 8)
    finally:
        sock.close()


def declared_too_large(edge: Edge) -> str:
    sock = connect(edge.port)
    started = time.monotonic()
    head = b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n"
    sent = send_in_background(sock, [head, *[b"b" * 65536] * 4577])
    try:
        return f"{outcome(sock, started, 10)}; {sent[0] >> 20} MiB of 286 sent"
    finally:
        sock.close()


def slow_body(edge: Edge) -> str:
    sock = connect(edge.port)
    started = time.monotonic()
    sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    send_in_background(sock, [b"b" * 10] * 10000, 0.1)  # 100 bytes/s, under 1 KiB/s
    try:
        return outcome(sock, started, 12)
    finally:
        sock.close()


def never_reads(edge: Edge) -> str:
    sock = connect(edge.port, rcvbuf=4096)
    client_port = sock.getsockname()[1]
    started = time.monotonic()
    sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n" * 16)  # 64 MiB of answers, none read
    try:
        while not server_holds(edge.port, client_port) and time.monotonic() - started < 2:
            time.sleep(0.01)  # until accepted: before, the kernel holds it alone
        while time.monotonic() - started < 20:
            if not server_holds(edge.port, client_port):
                return f"dropped by the server at {time.monotonic() - started:.1f} s"
            time.sleep(0.1)
        return "still held by the server after 20 s"
    finally:
        sock.close()


def idle_keep_alive(edge: Edge) -> str:
    sock = connect(edge.port)
    sock.sendall(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n")
    started = time.monotonic()
    try:
        return outcome(sock, started, 12)
    finally:
        sock.close()


def one_connection_too_many(edge: Edge) -> str:
    held = [connect(edge.port) for _ in range(LIMITS.max_connections)]  # idle, but open
    time.sleep(0.2)
    sock = connect(edge.port)
    started = time.monotonic()
    sock.sendall(b"GET /extra HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        return outcome(sock, started, 6)
    finally:
        sock.close()
        for other in held:
            other.close()


def deep_pipeline(edge: Edge) -> str:
    sock = connect(edge.port)
    started = time.monotonic()
    sock.sendall(b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n" * 300)
    sock.settimeout(0.5)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(1 << 20):
            data += chunk
    sock.close()
    closed = "closed" if time.monotonic() - started < 4 else "kept open"
    return f"{data.count(b'HTTP/1.1 ')} of 300 answered, {closed}"


def disconnect_in_flight(edge: Edge) -> str:
    edge.handler.cancelled.clear()
    edge.hold()
    sock = connect(edge.port)
    sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    sock.close()
    started = time.monotonic()
    cancelled = edge.handler.cancelled.wait(5)
    edge.release()
    return f"cancelled {time.monotonic() - started:.2f} s after the close" if cancelled else "not cancelled within 5 s"


def malformed(edge: Edge) -> str:
    sock = connect(edge.port)
    started = time.monotonic()
    sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    try:
        return outcome(sock, started, 5)
    finally:
        sock.close()


PROBES: list[tuple[str, str, Callable[[Edge], str]]] = [
    ("head trickled, 1 byte / 100 ms", "read timeout (head) 2 s", head_trickle),
    ("4 MiB header line, never ended", "head 64 KiB", endless_header_line),
    ("100 KiB of complete headers", "head 64 KiB", long_head),
    ("Content-Length 300 MB, body sent at once", "body 64 MiB", declared_too_large),
    ("body at 100 bytes/s", "body rate 1 KiB/s after 2 s", slow_body),
    ("16 x 4 MiB answers, never read", "write timeout 3 s", never_reads),
    ("one request, then idle", "keep-alive 1 s", idle_keep_alive),
    ("9th connection (8 idle open)", "max connections 8", one_connection_too_many),
    ("300 pipelined requests", "pipelined 128", deep_pipeline),
    ("client gone mid-request", "cancels the request", disconnect_in_flight),
    ("malformed request line", "400", malformed),
]


def serve_both(ready: threading.Event, edges: list[Edge], stop: threading.Event) -> None:
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        own, gran = ProbeHandler(), ProbeHandler()
        own_server, granian_server = HttpServer(own, LIMITS), GranianServer(gran, LIMITS)
        await own_server.start("127.0.0.1", 0)
        await granian_server.start("127.0.0.1", 0)
        edges.extend([Edge("inferd", own_server.port, own, loop), Edge("granian", granian_server.port, gran, loop)])
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await asyncio.gather(own_server.shutdown(1.0), granian_server.shutdown(1.0))

    uvloop.run(main())


def main() -> int:
    chosen = set(sys.argv[1:])  # probe function names; all without
    edges: list[Edge] = []
    ready, stop = threading.Event(), threading.Event()
    server = threading.Thread(target=serve_both, args=(ready, edges, stop), daemon=True)
    server.start()
    if not ready.wait(30):
        print("the servers did not start", file=sys.stderr)
        return 1
    time.sleep(0.5)
    table = Table(title="The REST edge under slow and hostile clients (what the client saw, from its first byte)")
    for column in ("probe", "inferd's limit", *(edge.name for edge in edges)):
        table.add_column(column)
    for label, limit, probe in PROBES:
        if chosen and probe.__name__ not in chosen:
            continue
        results = []
        for edge in edges:
            with console.status(f"{label}: {edge.name}"):
                results.append(probe(edge))
            time.sleep(2.5)  # what the probe left behind (idle connections, lingering) times out
        console.print(f"{label}: " + " | ".join(f"{e.name}: {r}" for e, r in zip(edges, results, strict=True)))
        table.add_row(label, limit, *results)
    console.print(table)
    stop.set()
    server.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

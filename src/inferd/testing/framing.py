"""HTTP/1.1 framing that a proxy in front of inferd and inferd itself could read differently
(request smuggling), and nginx run in front of an inferd HTTP server, as production runs it: what
the edge's tests and `benchmarks/edge_framing.py` send and compare."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from inferd.testing.server import free_port

POST = b"POST /a HTTP/1.1\r\nHost: x\r\n"
CHUNKED = POST + b"Transfer-Encoding: chunked\r\n\r\n"
# A request sent right behind each case: a server that read the case's bytes otherwise than its
# sender meant would take it for a request of its own.
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
# Each case and the status inferd's own server answers it with before closing the connection.
# nginx 1.22 (benchmarks/edge_framing.py) refuses the same ones with 400, but "chunked, gzip" with
# 501; it accepts a bare LF and a control character in a chunk extension, which llhttp (and so
# inferd) refuses, and then forwards well-formed requests that inferd reads as nginx sent them.
FRAMING = {
    "content-length-with-transfer-encoding": (
        POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    "transfer-encoding-with-content-length": (
        POST + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400),
    "repeated-content-length": (POST + b"Content-Length: 3\r\nContent-Length: 5\r\n\r\nabc", 400),
    "content-length-list": (POST + b"Content-Length: 3, 3\r\n\r\nabc", 400),
    "negative-content-length": (POST + b"Content-Length: -1\r\n\r\n", 400),
    "signed-content-length": (POST + b"Content-Length: +3\r\n\r\nabc", 400),
    "obsolete-line-folding": (b"GET /a HTTP/1.1\r\nHost: x\r\nX-A: one\r\n two\r\n\r\n", 400),
    "space-before-colon": (b"GET /a HTTP/1.1\r\nHost : x\r\n\r\n", 400),
    "bare-lf": (b"GET /a HTTP/1.1\nHost: x\n\n", 400),
    "invalid-chunk-size": (CHUNKED + b"zz\r\nabc\r\n0\r\n\r\n", 400),
    "chunk-size-overflow": (CHUNKED + b"ffffffffffffffffff\r\nabc\r\n0\r\n\r\n", 400),
    "invalid-chunk-extension": (CHUNKED + b"3;\x01\r\nabc\r\n0\r\n\r\n", 400),
    "chunked-not-last": (POST + b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", 400),
    "unsupported-transfer-coding": (POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
}  # fmt: skip


async def exchange(port: int, data: bytes, timeout_s: float = 3.0) -> list[int]:
    """Send `data` on one connection to 127.0.0.1:`port`; the statuses of the responses read until
    the server closes it (or `timeout_s` passes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    received = b""
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(ConnectionError, TimeoutError):
        while (left := deadline - time.monotonic()) > 0:
            chunk = await asyncio.wait_for(reader.read(65536), left)
            if not chunk:
                break
            received += chunk
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return statuses(received)


def statuses(received: bytes) -> list[int]:
    """The statuses of the responses one after the other in `received` (bodies framed by
    Content-Length, as both servers frame them)."""
    found = []
    while (head_end := received.find(b"\r\n\r\n")) >= 0:
        head = received[:head_end].decode("latin-1")
        matched = re.match(r"HTTP/1\.[01] (\d{3}) ", head)
        if matched is None:
            break
        found.append(int(matched.group(1)))
        length = re.search(r"(?im)^content-length:\s*(\d+)\s*$", head)
        received = received[head_end + 4 + (int(length.group(1)) if length else 0) :]
    return found


@dataclass
class NginxFront:
    """nginx listening on `port`, proxying every path to one backend over HTTP/1.1 keep-alive (as
    ingress-nginx does); its access log names each request it forwarded."""

    port: int
    process: subprocess.Popen[bytes]
    access_log: Path

    def forwarded(self) -> list[str]:
        """The paths of the requests nginx sent on to the backend, in order."""
        if not self.access_log.exists():
            return []
        lines = self.access_log.read_text(encoding="utf-8", errors="replace").splitlines()
        return [line.split()[1] for line in lines if len(line.split()) >= 3 and line.split()[2] != "-"]


def nginx_binary() -> str | None:
    # Debian puts nginx in /usr/sbin, which is not on every user's PATH.
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


@contextlib.contextmanager
def nginx_in_front(backend_port: int, state: Path) -> Iterator[NginxFront]:
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx not found: make nginx (Debian's nginx-light)")
    port = free_port()
    for folder in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (state / "tmp" / folder).mkdir(parents=True, exist_ok=True)
    access_log = state / "access.log"
    config = state / "nginx.conf"
    config.write_text(f"""daemon off;
pid {state / "nginx.pid"};
error_log {state / "error.log"} warn;
worker_processes 1;
events {{ worker_connections 64; }}
http {{
    log_format front '$request_method $uri $upstream_addr $status';
    access_log {access_log} front;
    client_body_temp_path {state / "tmp" / "body"};
    proxy_temp_path {state / "tmp" / "proxy"};
    fastcgi_temp_path {state / "tmp" / "fastcgi"};
    uwsgi_temp_path {state / "tmp" / "uwsgi"};
    scgi_temp_path {state / "tmp" / "scgi"};
    upstream backend {{ server 127.0.0.1:{backend_port}; keepalive 4; }}
    keepalive_timeout 1s;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
""")
    process = subprocess.Popen([binary, "-c", str(config), "-p", str(state)], stderr=subprocess.PIPE)
    try:
        _wait_listening(port, process)
        yield NginxFront(port, process, access_log)
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited: {process.stderr.read().decode() if process.stderr else ''}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nginx is not listening on 127.0.0.1:{port}")

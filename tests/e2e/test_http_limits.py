"""`inferd serve`'s connection limits, set by its flags: a slow or greedy client loses its own
connection and nobody else notices."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from inferd.testing.models import add_sub_model
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

MAX_CONNECTIONS = 4


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits")
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    flags = ("--read-timeout", "0.5", "--keep-alive-timeout", "1", "--max-connections", str(MAX_CONNECTIONS))
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log", *flags) as server:
        yield server


def read_all(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):  # the socket's timeout fails the test if the server never closes
        received += chunk
    return received


def test_a_trickled_head_gets_408_while_others_are_served(limited_server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", limited_server.http_port), timeout=10) as slow:
        slow.sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")
        started = time.monotonic()
        assert http_request(limited_server, "GET", "/v2/health/ready").status == 200
        answer = read_all(slow)
    assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer
    assert time.monotonic() - started < 5  # 0.5 s read timeout, swept a few times a second


def test_connections_over_the_cap_get_503_and_the_server_recovers(limited_server: ServerProcess) -> None:
    held = []
    for _ in range(MAX_CONNECTIONS):
        sock = socket.create_connection(("127.0.0.1", limited_server.http_port), timeout=10)
        held.append(sock)
        # Answered, so the server has taken it; it then stays open for the 1 s keep-alive.
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    try:
        with socket.create_connection(("127.0.0.1", limited_server.http_port), timeout=10) as extra:
            extra.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_all(extra)
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer
    finally:
        for sock in held:
            sock.close()
    # The held connections are gone: new clients are served again (the server notices closes at once).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if http_request(limited_server, "GET", "/v2/health/live").status == 200:
                return
        except ConnectionError:
            pass
        time.sleep(0.05)
    raise AssertionError("the server never took connections again")

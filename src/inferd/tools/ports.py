"""Free TCP ports on 127.0.0.1, for the tools that start servers (analyze, fleet)."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free now (held together while chosen, so none repeats; another process
    may still take one before it is used: callers that bind must be ready to try again)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()

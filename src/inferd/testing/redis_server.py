"""A throwaway `redis-server` (Debian's, which `make test` installs) on 127.0.0.1 for the tests of
the shared async job queue: no persistence, its own port, stopped after."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from inferd.tools.ports import free_ports


@contextlib.contextmanager
def run_redis(folder: Path) -> Iterator[str]:
    """A running redis-server; yields its URL (redis://127.0.0.1:PORT/0)."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    (port,) = free_ports(1)
    folder.mkdir(parents=True, exist_ok=True)
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(folder)]  # fmt: skip
    with (folder / "redis.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(folder / 'redis.log').read_text()}")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=30)

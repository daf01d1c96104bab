"""`run_server()`: a real `inferd serve` subprocess on free 127.0.0.1 ports, ready when it returns."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from inferd.tools.ports import free_ports

STARTUP_TIMEOUT_S = 60.0


def free_port() -> int:
    (port,) = free_ports(1)
    return port


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def terminate(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def wait_ready(
    http_port: int, process: subprocess.Popen[bytes], timeout_s: float, tls: ssl.SSLContext | None = None
) -> None:
    """`tls`: the client's context for a server that serves HTTPS."""
    deadline = time.monotonic() + timeout_s
    url = f"{'https' if tls else 'http'}://127.0.0.1:{http_port}/v2/health/ready"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"inferd serve exited with {process.returncode} before becoming ready")
        # Not ready: nothing listens yet, or what answers is not this server's HTTP (another socket on
        # the port, such as the server's own gRPC before a failed HTTP bind ends the process).
        with (
            contextlib.suppress(OSError, http.client.HTTPException),
            urllib.request.urlopen(url, timeout=1, context=tls) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"inferd serve was not ready within {timeout_s} s")


@contextlib.contextmanager
def run_server(
    repository: Path | str | None,
    log_path: Path,
    *extra_args: str,
    ports: tuple[int, int, int] | None = None,
    env: dict[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
    cwd: Path | None = None,
) -> Iterator[ServerProcess]:
    """Start `inferd serve` on free ports (or `ports`: HTTP, gRPC, metrics), `repository` its
    --model-repository (None: none, the arguments name the models otherwise), with `env` added to
    the environment, in `cwd` (relative paths in the arguments are found there); wait on its own
    readiness endpoint (over HTTPS with `tls`, a client context for a server given --tls-cert),
    stop it after."""
    # A port free when picked may be taken (by another socket's ephemeral port) before the server
    # binds it: with ports of its own choosing, a server that could not bind starts again on others.
    attempts = 1 if ports else 3
    for attempt in range(attempts):
        http_port, grpc_port, metrics_port = free_ports(3)  # distinct: picked together
        chosen = ports or (http_port, grpc_port, metrics_port)
        server = _start(repository, log_path, chosen, extra_args, env, cwd)
        try:
            wait_ready(chosen[0], server.process, STARTUP_TIMEOUT_S, tls)
        except RuntimeError:
            server.terminate()
            if attempt + 1 < attempts and "address already in use" in server.log():
                continue
            raise
        except BaseException:
            server.terminate()
            raise
        try:
            yield server
        finally:
            server.terminate()
        return


def _start(
    repository: Path | str | None, log_path: Path, ports: tuple[int, int, int], extra_args: tuple[str, ...],
    env: dict[str, str] | None, cwd: Path | None,
) -> ServerProcess:  # fmt: skip
    command = [
        sys.executable,
        "-m",
        "inferd",
        "serve",
        *(("--model-repository", str(repository)) if repository is not None else ()),
        "--host",
        "127.0.0.1",
        "--http-port",
        str(ports[0]),
        "--grpc-port",
        str(ports[1]),
        "--metrics-port",
        str(ports[2]),
        *extra_args,
    ]
    with log_path.open("wb") as log_file:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd
        )
    return ServerProcess(process, *ports, log_path=log_path)

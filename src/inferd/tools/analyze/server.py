"""One inferd per configuration, as a deployment would run it: a subprocess serving a repository
of one model, on free ports of 127.0.0.1, with its memory and CPU read from the OS (psutil)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from inferd.client import Client
from inferd.errors import InferdError
from inferd.tools import model_config
from inferd.tools.ports import free_ports

STARTUP_TIMEOUT_S = 120.0
PORT_ATTEMPTS = 3


class ServerStartError(RuntimeError):
    """inferd did not become ready with this configuration (its log's last lines say why)."""


@dataclass
class RunningServer:
    url: str
    process: psutil.Process

    def rss_bytes(self) -> int:
        return int(self.process.memory_info().rss)

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)


@contextmanager
def serve(model_name: str, model_dir: Path | None, config: Any | None, extra_args: tuple[str, ...] = ()) -> Iterator[
    RunningServer
]:  # fmt: skip
    """inferd serving `model_dir`'s version folders under `model_name` with `config` (a ModelConfig
    message), or an empty repository when `model_dir` is None (the baseline of memory)."""
    with tempfile.TemporaryDirectory(prefix="inferd-analyze-") as scratch:
        repository = Path(scratch) / "repository"
        repository.mkdir()
        if model_dir is not None:
            target = repository / model_name
            target.mkdir()
            copy_versions(model_dir, target)
            model_config.write(target, config)
        log_path = Path(scratch) / "server.log"
        for attempt in range(PORT_ATTEMPTS):
            process, url = _start(repository, log_path, extra_args)
            try:
                _wait_ready(process, url, model_name if model_dir is not None else None, log_path)
            except ServerStartError:
                _stop(process)
                if attempt + 1 < PORT_ATTEMPTS and "address already in use" in _tail(log_path).lower():
                    continue
                raise
            break
        try:
            yield RunningServer(url, psutil.Process(process.pid))
        finally:
            _stop(process)


def _start(repository: Path, log_path: Path, extra_args: tuple[str, ...]) -> tuple[subprocess.Popen[bytes], str]:
    http, grpc, metrics = free_ports(3)
    command = [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository),
               "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
               "--host", "127.0.0.1", "--log-format", "text", *extra_args]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{http}"


def _wait_ready(process: subprocess.Popen[bytes], url: str, model: str | None, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    with Client(url, timeout_s=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServerStartError(f"inferd exited ({process.returncode}): {_tail(log_path)}")
            try:
                if client.server_ready() and (model is None or client.model_ready(model)):
                    return
                failed = [e for e in client.repository_index() if e.name == model and e.state == "UNAVAILABLE"]
                if failed and failed[0].reason:
                    raise ServerStartError(f"inferd could not load the model: {failed[0].reason}")
            except InferdError:
                pass
            time.sleep(0.2)
    raise ServerStartError(f"inferd was not ready within {STARTUP_TIMEOUT_S:.0f} s: {_tail(log_path)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(log_path: Path, lines: int = 5) -> str:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def copy_versions(model_dir: Path, target: Path) -> None:
    """A model folder's version folders into `target`: hard links where the file system allows
    (a large model is not copied for every configuration), copies elsewhere."""

    def link_or_copy(source: str, destination: str) -> object:
        try:
            os.link(source, destination)
            return destination
        except OSError:
            return shutil.copy2(source, destination)

    for entry in model_dir.iterdir():
        if entry.is_dir() and entry.name.isdigit():
            shutil.copytree(entry, target / entry.name, dirs_exist_ok=True, copy_function=link_or_copy)

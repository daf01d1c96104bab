"""A real Ray cluster of two nodes on this machine, for the Ray engine's tests and benchmark:
`ray start --head` and a second `ray start --address`, each with its own CPU count, on 127.0.0.2
(Ray rewrites 127.0.0.1 to the machine's outbound address, but keeps another loopback address as
it is), with token authentication, without usage statistics, stopped by their PIDs (`ray stop`
would stop every Ray of the machine, anyone's)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from inferd.tools.ports import free_ports

HOST = "127.0.0.2"
START_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class RayCluster:
    address: str  # host:port of the head
    env: dict[str, str]  # what a driver joining it needs in its environment (the token among it)


def _ray() -> str:
    return str(Path(sys.executable).parent / "ray")


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((HOST, port)) == 0


def _active_nodes(address: str, env: dict[str, str]) -> int:
    done = subprocess.run([_ray(), "status", "--address", address], capture_output=True, text=True, env=env, timeout=60)
    active = done.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return active.count("node_")


@contextmanager
def ray_cluster(logs: Path, head_cpus: int = 2, worker_cpus: int = 1) -> Iterator[RayCluster]:
    """Two nodes, up until the context ends; their logs in `logs`."""
    ray_env = {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "3",
    }
    env = {**os.environ, **ray_env}
    (port,) = free_ports(1)
    address = f"{HOST}:{port}"
    # Ray's Unix sockets live under its temp dir, whose path must stay short (about 107 bytes).
    head_dir, worker_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp"), tempfile.mkdtemp(prefix="rw", dir="/tmp")
    common = ["--disable-usage-stats", "--node-ip-address", HOST, "--block"]
    logs.mkdir(parents=True, exist_ok=True)
    head_log, worker_log = (logs / "head.log").open("w"), (logs / "worker.log").open("w")
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        head = [_ray(), "start", "--head", "--port", str(port), "--num-cpus", str(head_cpus)]
        head += ["--include-dashboard", "false", "--temp-dir", head_dir, *common]
        nodes.append(subprocess.Popen(head, env=env, stdout=head_log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(port):
            if nodes[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray's head did not start: {(logs / 'head.log').read_text()[-2000:]}")
            time.sleep(0.2)
        worker = [_ray(), "start", "--address", address, "--num-cpus", str(worker_cpus), "--temp-dir", worker_dir]
        nodes.append(subprocess.Popen([*worker, *common], env=env, stdout=worker_log, stderr=subprocess.STDOUT))
        while _active_nodes(address, env) < 2:
            if nodes[1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray's second node did not join: {(logs / 'worker.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield RayCluster(address, ray_env)
    finally:
        for node in reversed(nodes):
            node.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
        head_log.close()
        worker_log.close()
        for folder in (head_dir, worker_dir):
            shutil.rmtree(folder, ignore_errors=True)

"""A plan run on this machine: each bin an `inferd serve` process on 127.0.0.1, nginx in front,
routed as the Kubernetes Ingress would route. What `up` starts is recorded in STATE/fleet.json
(process ids with their start times, ports, commands), so `status` reports on it and `down` and
`restart` act on exactly those processes, never on a process that merely reuses a pid."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
import psutil

from inferd.tools.fleet.nginx import nginx_config
from inferd.tools.plan.plan_file import Plan, routes
from inferd.tools.ports import free_ports

STATE_FILE = "fleet.json"
ROLLOUTS = "rollouts"
"""The state folder's folder where `inferd fleet rollout` keeps its controller's rollouts."""
READY_TIMEOUT_S = 120.0


class FleetError(RuntimeError):
    """The fleet cannot do what was asked: one line says why."""


@dataclass
class Process:
    pid: int
    started: float
    """psutil's create_time: with the pid, it names this process and no later one."""

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            same = abs(float(process.create_time()) - self.started) < 0.01
            return same and bool(process.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False


@dataclass
class Bin:
    name: str
    models: list[str]
    http_port: int
    grpc_port: int
    metrics_port: int
    command: list[str]
    process: Process | None = None


@dataclass
class Fleet:
    plan: str
    port: int
    bins: list[Bin]
    nginx: Process | None = None
    endpoints: str = ""
    """The endpoints file every bin serves (--endpoints), as an absolute path; "" when none."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def load(state: Path) -> Fleet:
    path = state / STATE_FILE
    if not path.is_file():
        raise FleetError(f"no fleet in {state} (inferd fleet up starts one)")
    document = orjson.loads(path.read_bytes())
    bins = [Bin(**{**b, "process": Process(**b["process"]) if b["process"] else None}) for b in document["bins"]]
    nginx = Process(**document["nginx"]) if document["nginx"] else None
    return Fleet(document["plan"], document["port"], bins, nginx, document.get("endpoints", ""))


def _save(fleet: Fleet, state: Path) -> None:
    temporary = state / (STATE_FILE + ".tmp")
    temporary.write_bytes(orjson.dumps(asdict(fleet), option=orjson.OPT_INDENT_2))
    temporary.replace(state / STATE_FILE)


def up(
    plan: Plan,
    plan_path: Path,
    repository: str,
    state: Path,
    port: int,
    nginx_binary: str = "nginx",
    on_ready: Callable[[str], None] = lambda name: None,
    extra_args: tuple[str, ...] = (),
    endpoints: str = "",
    endpoint_models: Mapping[str, tuple[str, ...]] | None = None,
) -> Fleet:
    """Start every bin and nginx; wait until every bin is ready. A failure stops what was started.
    `endpoints`: an endpoints file every bin serves (followed every second), whose endpoints'
    variants name `endpoint_models`: nginx sends an endpoint to the bins that hold all of them."""
    serving = _endpoint_bins(plan, endpoint_models or {})
    if (state / STATE_FILE).is_file() and any(b.process and b.process.alive() for b in load(state).bins):
        raise FleetError(f"a fleet is already running from {state}: inferd fleet down first")
    # Debian puts nginx in /usr/sbin, which is not on every user's PATH.
    nginx_path = shutil.which(nginx_binary) or shutil.which(nginx_binary, path="/usr/sbin:/usr/local/sbin")
    if nginx_path is None:
        raise FleetError(f"nginx not found ({nginx_binary}): install it (Debian: apt-get install nginx-light)")
    state.mkdir(parents=True, exist_ok=True)
    (state / "logs").mkdir(exist_ok=True)
    for folder in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (state / "nginx-tmp" / folder).mkdir(parents=True, exist_ok=True)
    bins = []
    for instance in plan.instances:
        http, grpc, metrics = free_ports(3)
        command = [sys.executable, "-m", "inferd", "serve", "--model-repository", repository, "--host", "127.0.0.1",
                   "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                   "--model-control-mode", "explicit", "--log-format", "json", *extra_args]  # fmt: skip
        if endpoints:
            command += ["--endpoints", endpoints, "--repository-poll-secs", "1"]
        for model in instance.models:
            command += ["--load-model", model]
        bins.append(Bin(instance.name, list(instance.models), http, grpc, metrics, command))
    fleet = Fleet(str(plan_path.resolve()), port, bins, endpoints=endpoints)
    try:
        for fleet_bin in bins:
            fleet_bin.process = _spawn(fleet_bin, state)
            _save(fleet, state)
        for fleet_bin in bins:
            _wait_ready(fleet_bin, state)
            on_ready(fleet_bin.name)
        config = state / "nginx.conf"
        ports = {b.name: b.http_port for b in bins}
        config.write_text(nginx_config(routes(plan), ports, port, state, serving))
        started = subprocess.run([nginx_path, "-c", str(config), "-p", str(state)], capture_output=True, text=True)
        if started.returncode != 0:
            raise FleetError(f"nginx did not start: {started.stderr.strip()}")
        fleet.nginx = _nginx_process(state)
        _save(fleet, state)
        _wait_listening(port)
    except BaseException:
        down(state)
        raise
    return fleet


def _endpoint_bins(plan: Plan, endpoint_models: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """The bins that serve each endpoint: those holding every one of its variants' models (a bin
    routes an endpoint's requests among its variants in-process)."""
    serving = {}
    for endpoint, models in endpoint_models.items():
        if endpoint in plan.models:
            raise FleetError(f"endpoint '{endpoint}' has a model's name: an endpoint must have a name of its own")
        holders = [i.name for i in plan.instances if set(models) <= set(i.models)]
        if not holders:
            where = "; ".join(f"{m} on {', '.join(plan.models[m].instances) or 'none'}" if m in plan.models
                              else f"{m} in no bin" for m in models)  # fmt: skip
            raise FleetError(
                f"endpoint '{endpoint}': no bin holds all its variants' models ({where}): plan them on the same bins"
            )
        serving[endpoint] = holders
    return serving


def status(state: Path) -> tuple[Fleet, dict[str, bool], bool]:
    """The fleet, whether each bin answers ready, and whether nginx runs."""
    from inferd.client import NO_RETRIES, Client
    from inferd.errors import InferdError

    fleet = load(state)
    ready = {}
    for fleet_bin in fleet.bins:
        ok = False
        if fleet_bin.process and fleet_bin.process.alive():
            try:
                with Client(f"http://127.0.0.1:{fleet_bin.http_port}", timeout_s=2.0, retry=NO_RETRIES) as client:
                    ok = client.server_ready()
            except (InferdError, OSError):
                ok = False
        ready[fleet_bin.name] = ok
    return fleet, ready, bool(fleet.nginx and fleet.nginx.alive())


def restart(state: Path, name: str, on_ready: Callable[[str], None] = lambda name: None) -> Fleet:
    """Stop one bin (SIGTERM: it drains) and start it again with the same command and ports."""
    fleet = load(state)
    fleet_bin = next((b for b in fleet.bins if b.name == name), None)
    if fleet_bin is None:
        raise FleetError(f"no bin '{name}' in this fleet (bins: {', '.join(b.name for b in fleet.bins)})")
    _stop(fleet_bin.process)
    fleet_bin.process = _spawn(fleet_bin, state)
    _save(fleet, state)
    _wait_ready(fleet_bin, state)
    on_ready(fleet_bin.name)
    return fleet


def down(state: Path) -> list[str]:
    """Stop exactly what `up` started (each process checked by pid and start time); returns what
    was stopped."""
    if not (state / STATE_FILE).is_file():
        return []
    fleet = load(state)
    stopped = []
    if fleet.nginx and fleet.nginx.alive():
        _stop(fleet.nginx, signal.SIGQUIT)  # nginx's graceful shutdown
        stopped.append("nginx")
    for fleet_bin in fleet.bins:
        if fleet_bin.process and fleet_bin.process.alive():
            _stop(fleet_bin.process)
            stopped.append(fleet_bin.name)
    (state / STATE_FILE).unlink()
    return stopped


def _spawn(fleet_bin: Bin, state: Path) -> Process:
    with (state / "logs" / f"{fleet_bin.name}.log").open("ab") as log:
        process = subprocess.Popen(fleet_bin.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # fmt: skip
    return Process(process.pid, psutil.Process(process.pid).create_time())


def _stop(process: Process | None, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 40.0) -> None:
    if process is None or not process.alive():
        return
    handle = psutil.Process(process.pid)
    handle.send_signal(sig)
    try:
        handle.wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        handle.kill()
        handle.wait(timeout=10)


def _wait_ready(fleet_bin: Bin, state: Path) -> None:
    from inferd.client import NO_RETRIES, Client
    from inferd.errors import InferdError

    deadline = time.monotonic() + READY_TIMEOUT_S
    with Client(f"http://127.0.0.1:{fleet_bin.http_port}", timeout_s=2.0, retry=NO_RETRIES) as client:
        while time.monotonic() < deadline:
            if fleet_bin.process is None or not fleet_bin.process.alive():
                tail = (state / "logs" / f"{fleet_bin.name}.log").read_text(errors="replace")[-600:]
                raise FleetError(f"{fleet_bin.name} exited before it was ready: {tail}")
            try:
                if client.server_ready():
                    return
            except (InferdError, OSError):
                pass
            time.sleep(0.2)
    raise FleetError(f"{fleet_bin.name} was not ready within {READY_TIMEOUT_S:g} s (its log: {state / 'logs'})")


def _nginx_process(state: Path) -> Process:
    deadline = time.monotonic() + 10
    pid_file = state / "nginx.pid"
    while time.monotonic() < deadline:
        if pid_file.is_file() and pid_file.read_text().strip():
            pid = int(pid_file.read_text().strip())
            return Process(pid, psutil.Process(pid).create_time())
        time.sleep(0.05)
    raise FleetError(f"nginx wrote no pid file ({pid_file}); its log: {state / 'logs' / 'nginx-error.log'}")


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise FleetError(f"nginx is not listening on 127.0.0.1:{port}")

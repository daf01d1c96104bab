"""A rollout across a fleet, end to end: two inferd servers that serve one endpoints file, nginx in
front of them, Debian's Prometheus scraping both every second, and `inferd rollout start
--controller` judging from Prometheus (or from the replicas' own /metrics) and writing the file.

The candidate `flaky` fails every second request on replica A only (a Python model built to fail,
whatever the machine's speed), so neither replica alone tells the truth: A's traffic alone would
say 50%, B's 0%; the sum says about 25%."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferd import rollout_queries as queries
from inferd.server.fleet_metrics import parse_metrics
from inferd.testing.models import misbehaving_model
from inferd.testing.prometheus import query, run_prometheus, wait_for_targets
from inferd.testing.server import ServerProcess, run_server
from inferd.tools.deploy.endpoints import HASH_LABEL, RolloutSettings, guard_queries
from inferd.tools.ports import free_ports
from tests.e2e.conftest import http_request

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()
PACE_S = 0.004  # between a driver's requests: the test's rate has a ceiling, whatever the machine
VARIANTS = (("blue", "stable", 100), ("green", "flaky", 0), ("teal", "good", 0))
HASHES = ("hash-a", "hash-b")  # replica A's and B's "pod template hash"


def declared(weights: dict[str, float]) -> str:
    variants = [{"name": name, "model": model, "weight": weights[name]} for name, model, _ in VARIANTS]
    return yaml.safe_dump({"endpoints": {"shop": {"variants": variants}}}, sort_keys=False)


ORIGINAL = {name: float(weight) for name, _, weight in VARIANTS}


@dataclass
class Fleet:
    replicas: list[ServerProcess]
    front: str  # nginx, host:port
    prometheus: str
    endpoints: Path

    def reset(self) -> None:
        """The file as declared at first, followed by both replicas. Written whole, then renamed:
        a replica reading a half-written file would serve what it says."""
        partial = self.endpoints.with_name("endpoints.partial")
        partial.write_text(declared(ORIGINAL))
        partial.replace(self.endpoints)
        wait_for_weights(self, ORIGINAL)


def replica_weights(server: ServerProcess) -> dict[str, float]:
    body = json.loads(http_request(server, "GET", "/v2/endpoints/shop").body)
    return {v["name"]: v["weight"] for v in body["variants"]}


def wait_for_weights(fleet: Fleet, weights: dict[str, float], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(replica_weights(server) != weights for server in fleet.replicas):
        assert time.monotonic() < deadline, [replica_weights(server) for server in fleet.replicas]
        time.sleep(0.05)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet-rollout")
    endpoints = root / "endpoints.yaml"
    endpoints.write_text(declared(ORIGINAL))
    with ExitStack() as stack:
        replicas = []
        for replica, fail_every in (("a", 2), ("b", 0)):
            repository = root / replica / "repository"
            misbehaving_model(repository / "stable")
            misbehaving_model(repository / "good")
            misbehaving_model(repository / "flaky", fail_every=fail_every)
            arguments = ("--endpoints", str(endpoints), "--repository-poll-secs", "0.2")
            replicas.append(stack.enter_context(run_server(repository, root / f"{replica}.log", *arguments)))
        front = stack.enter_context(run_nginx(root / "nginx", [server.http_port for server in replicas]))
        targets = [f"127.0.0.1:{server.metrics_port}" for server in replicas]
        # Each replica's series carry a pod template hash, as Argo's pods do on Kubernetes: A's
        # stand for a canary's pods, B's for the stable's.
        hashes = {target: {HASH_LABEL: name} for target, name in zip(targets, HASHES, strict=True)}
        prometheus = stack.enter_context(run_prometheus(root / "prometheus", targets, hashes))
        wait_for_targets(prometheus, len(targets))
        yield Fleet(replicas, front, prometheus, endpoints)


class Traffic:
    """Paced requests to the endpoint through nginx (or to each of `front`'s addresses in turn),
    from a thread, until stopped: what they were answered, by (status, variant)."""

    def __init__(self, front: str | list[str]) -> None:
        self.answers: Counter[tuple[int, str]] = Counter()
        self._fronts = [front] if isinstance(front, str) else front
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drive, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _drive(self) -> None:
        connections = [http.client.HTTPConnection(*_address(front), timeout=30) for front in self._fronts]
        deadline = time.monotonic() + 240  # bounded, whatever happens to the test
        try:
            sent = 0
            while not self._stop.is_set() and time.monotonic() < deadline:
                connection = connections[sent % len(connections)]
                sent += 1
                connection.request("POST", "/v2/models/shop/infer", BODY)
                response = connection.getresponse()
                response.read()
                self.answers[(response.status, response.getheader("inferd-variant") or "")] += 1
                time.sleep(PACE_S)
        finally:
            for connection in connections:
                connection.close()


def _address(front: str) -> tuple[str, int]:
    host, _, port = front.rpartition(":")
    return host, int(port)


def controller(fleet: Fleet, state: Path, candidate: str, source: list[str], *settings: str) -> list[str]:
    return [
        sys.executable, "-m", "inferd", "rollout", "start", "shop", "--to", candidate, "--controller",
        "--endpoints", str(fleet.endpoints), "--state-dir", str(state), *source, *settings,
    ]  # fmt: skip


def prometheus_source(fleet: Fleet) -> list[str]:
    return ["--metrics-source", "prometheus", "--prometheus-url", fleet.prometheus, "--scrape-interval", "1s"]


def scrape_source(fleet: Fleet) -> list[str]:
    replicas = ",".join(f"127.0.0.1:{server.metrics_port}" for server in fleet.replicas)
    return ["--metrics-source", "scrape", "--replicas", replicas]


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=200, env=_env())


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "400"}  # a decision a line


@pytest.mark.parametrize("source", [prometheus_source, scrape_source], ids=["prometheus", "scrape"])
def test_a_candidate_failing_on_one_replica_only_is_rolled_back_on_both_replicas_traffic(
    fleet: Fleet, tmp_path: Path, source: Any
) -> None:
    fleet.reset()
    command = controller(fleet, tmp_path / "state", "green", source(fleet), "--strategy", "canary:50",
                         "--bake", "1h", "--min-requests", "60")  # fmt: skip
    with Traffic(fleet.front) as traffic:
        ended = run(command)
    assert ended.returncode == 1, ended.stdout + ended.stderr
    # Replica A's candidate fails half its requests, B's none: the sum, about a quarter, is judged.
    judged = re.search(r"rolled back at step 1: candidate error rate ([\d.]+)% vs baseline 0\.0% over (\d+) requests",
                       ended.stdout)  # fmt: skip
    assert judged is not None, ended.stdout
    assert 12 <= float(judged.group(1)) <= 38 and int(judged.group(2)) >= 60, ended.stdout
    # Both replicas are back on the baseline, as the file says.
    assert yaml.safe_load(fleet.endpoints.read_text())["endpoints"]["shop"]["variants"][1]["weight"] == 0
    wait_for_weights(fleet, ORIGINAL)
    # The baseline failed nothing: only the candidate's requests did.
    assert {status for (status, variant) in traffic.answers if variant == "blue"} == {200}, traffic.answers
    # The controller's rollout is kept, with the numbers behind its decision.
    status = run([sys.executable, "-m", "inferd", "rollout", "status", "shop", "--state-dir", str(tmp_path / "state")])
    assert "rolled-back" in status.stdout and "candidate error rate" in status.stdout, status.stdout


def test_a_healthy_candidate_is_promoted_and_a_controller_killed_mid_bake_is_taken_up(
    fleet: Fleet, tmp_path: Path
) -> None:
    """No request fails because of the shift; both replicas end with the same weights; a
    controller killed (-9) in the middle of a bake, started again with the same command, takes the
    rollout up where it was and finishes it."""
    fleet.reset()
    state = tmp_path / "state"
    command = controller(fleet, state, "teal", prometheus_source(fleet), "--strategy", "linear:2", "--bake", "4s",
                         "--min-requests", "30")  # fmt: skip
    with Traffic(fleet.front) as traffic:
        first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
        try:
            wait_for_weights(fleet, {"blue": 50.0, "green": 0.0, "teal": 50.0}, timeout_s=60)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        kept = json.loads((state / "fleet-rollouts.json").read_text())["rollouts"][0]
        assert kept["state"] == "running" and kept["step"] == 0, kept
        # Nobody judges now, and the traffic stays split as it was: the next controller takes it up.
        again = run(command)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "takes up the rollout" in again.stdout and "resumed" in again.stdout, again.stdout
    assert "promoted: 'teal' takes all the traffic" in again.stdout, again.stdout
    promoted = {"blue": 0.0, "green": 0.0, "teal": 100.0}
    wait_for_weights(fleet, promoted)
    assert set(traffic.answers) <= {(200, "blue"), (200, "teal")}, traffic.answers
    assert traffic.answers[(200, "teal")] > 0 and traffic.answers[(200, "blue")] > 0


@contextlib.contextmanager
def sharing_replicas(tmp_path: Path, shared: Path, document: dict[str, Any]) -> Iterator[tuple[ServerProcess, ...]]:
    """Two replicas sharing the state directory `shared`, polling it every 0.2 s, with endpoint
    `shop` (`document`) PUT to the first and followed by the second."""
    repository = tmp_path / "repository"
    misbehaving_model(repository / "stable")
    misbehaving_model(repository / "good")
    arguments = ("--state-dir", str(shared), "--repository-poll-secs", "0.2")
    with ExitStack() as stack:
        a, b = (stack.enter_context(run_server(repository, tmp_path / f"{n}.log", *arguments)) for n in "ab")
        assert http_request(a, "PUT", "/v2/endpoints/shop", json.dumps(document).encode()).status == 201
        wait_until(lambda: http_request(b, "GET", "/v2/endpoints/shop").status == 200)
        yield a, b


def test_replicas_sharing_a_state_directory_follow_each_other_and_a_controller(tmp_path: Path) -> None:
    """A PUT to either replica reaches the other within a poll; a controller writing the shared
    directory's weights (no endpoints file) rolls a candidate out over both, and meanwhile neither
    replica lets the endpoint be changed through its API."""
    shared = tmp_path / "shared-state"
    document: dict[str, Any] = {"variants": [{"name": "blue", "model": "stable", "weight": 100},
                                             {"name": "teal", "model": "good", "weight": 0}]}  # fmt: skip
    with sharing_replicas(tmp_path, shared, document) as (a, b):
        document["variants"][0]["weight"] = 90
        document["variants"][1]["weight"] = 10
        assert http_request(b, "PUT", "/v2/endpoints/shop", json.dumps(document).encode()).status == 200
        wait_until(lambda: replica_weights(a) == {"blue": 90.0, "teal": 10.0})

        replicas = ",".join(f"127.0.0.1:{server.metrics_port}" for server in (a, b))
        command = [sys.executable, "-m", "inferd", "rollout", "start", "shop", "--to", "teal", "--controller",
                   "--state-dir", str(shared), "--metrics-source", "scrape", "--replicas", replicas,
                   "--strategy", "linear:2", "--bake", "3s", "--min-requests", "20"]  # fmt: skip
        with Traffic([a.http_url, b.http_url]) as traffic:
            controller_process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                  text=True, env=_env())  # fmt: skip
            try:
                wait_until(lambda: replica_weights(b) == {"blue": 50.0, "teal": 50.0})
                refused = http_request(a, "PUT", "/v2/endpoints/shop", json.dumps(document).encode())
                assert refused.status == 409 and b"rolled out across the fleet" in refused.body, refused.body
                output, _ = controller_process.communicate(timeout=120)
            finally:
                if controller_process.poll() is None:
                    controller_process.kill()
                    controller_process.communicate()
        assert controller_process.returncode == 0, output
        assert "promoted: 'teal' takes all the traffic" in output, output
        for server in (a, b):
            wait_until(lambda server=server: replica_weights(server) == {"blue": 0.0, "teal": 100.0})
        assert set(traffic.answers) <= {(200, "blue"), (200, "teal")}, traffic.answers
        # Ended: the endpoint is the API's again.
        assert http_request(a, "PUT", "/v2/endpoints/shop", json.dumps(document).encode()).status == 200


def test_a_server_started_as_the_fleets_rollout_controller_judges_its_api_rollouts_on_every_replica(
    tmp_path: Path,
) -> None:
    """Two replicas share a state directory; one is started with --rollout-controller over both
    replicas' /metrics. The candidate fails half its requests on the other replica only: the
    controller's own traffic alone would promote it, the fleet's rolls it back. The other replica
    refuses to change the endpoint meanwhile."""
    shared = tmp_path / "shared-state"
    ports = {name: free_ports(3) for name in ("controller", "replica")}
    scraped = ",".join(f"127.0.0.1:{found[2]}" for found in ports.values())
    with ExitStack() as stack:
        servers = {}
        for name, fail_every in (("controller", 0), ("replica", 2)):
            repository = tmp_path / name / "repository"
            misbehaving_model(repository / "stable")
            misbehaving_model(repository / "flaky", fail_every=fail_every)
            arguments = ["--state-dir", str(shared), "--repository-poll-secs", "0.2"]
            if name == "controller":
                arguments += ["--rollout-controller", f"scrape={scraped}"]
            servers[name] = stack.enter_context(
                run_server(repository, tmp_path / f"{name}.log", *arguments, ports=ports[name])
            )
        controller_server, replica = servers["controller"], servers["replica"]
        document = {"variants": [{"name": "blue", "model": "stable", "weight": 100},
                                 {"name": "green", "model": "flaky", "weight": 0}]}  # fmt: skip
        assert http_request(controller_server, "PUT", "/v2/endpoints/shop", json.dumps(document).encode()).status == 201
        wait_until(lambda: http_request(replica, "GET", "/v2/endpoints/shop").status == 200)
        settings = {"to": "green", "strategy": "canary:50", "bake": "1h", "min_requests": 60}
        started = http_request(controller_server, "POST", "/v2/endpoints/shop/rollout", json.dumps(settings).encode())
        assert started.status == 200, started.body

        def rollout() -> dict[str, Any]:
            reply = http_request(controller_server, "GET", "/v2/endpoints/shop/rollout")
            return json.loads(reply.body)  # type: ignore[no-any-return]

        with Traffic([controller_server.http_url, replica.http_url]):
            wait_until(lambda: replica_weights(replica) == {"blue": 50.0, "green": 50.0})
            refused = http_request(replica, "PUT", "/v2/endpoints/shop", json.dumps(document).encode())
            assert refused.status == 409 and b"rolled out across the fleet" in refused.body, refused.body
            wait_until(lambda: rollout()["state"] != "running", timeout_s=120)
        ended = rollout()
        assert ended["state"] == "rolled-back", ended
        message = ended["decisions"][-1]["message"]
        judged = re.match(
            r"rolled back at step 1: candidate error rate ([\d.]+)% vs baseline 0\.0% over (\d+)", message
        )
        assert judged is not None and 12 <= float(judged.group(1)) <= 38, message
        for server in (controller_server, replica):
            wait_until(lambda server=server: replica_weights(server) == {"blue": 100.0, "green": 0.0})


def test_a_replicas_rollout_is_its_own_and_taken_up_by_another_when_it_dies(tmp_path: Path) -> None:
    """Replicas sharing a state directory: a rollout started through one replica's API is refused
    to the other's changes while its replica lives; killed (-9), the other takes it up within a
    poll, so its split is never left with nobody judging."""
    shared = tmp_path / "shared-state"
    document: dict[str, Any] = {"variants": [{"name": "blue", "model": "stable", "weight": 100},
                                             {"name": "teal", "model": "good", "weight": 0}]}  # fmt: skip
    with sharing_replicas(tmp_path, shared, document) as (a, b):
        settings = {"to": "teal", "strategy": "canary:20", "bake": "1h", "min_requests": 10}
        assert http_request(a, "POST", "/v2/endpoints/shop/rollout", json.dumps(settings).encode()).status == 200
        wait_until(lambda: replica_weights(b) == {"blue": 80.0, "teal": 20.0})
        refused = http_request(b, "PUT", "/v2/endpoints/shop", json.dumps(document).encode())
        assert refused.status == 409 and b"rolled out by a replica" in refused.body, refused.body
        a.process.send_signal(signal.SIGKILL)
        a.process.wait(timeout=30)

        def taken_up() -> bool:
            reply = http_request(b, "GET", "/v2/endpoints/shop/rollout")
            return reply.status == 200 and json.loads(reply.body)["state"] == "running"

        wait_until(taken_up)
        kept = json.loads(http_request(b, "GET", "/v2/endpoints/shop/rollout").body)
        assert "resumed" in [d["action"] for d in kept["decisions"]], kept
        assert "rollouts of a server sharing the state directory that is gone, taken up" in b.log()
        aborted = http_request(b, "POST", "/v2/endpoints/shop/rollout/abort", b"")
        assert aborted.status == 200, aborted.body
        assert replica_weights(b) == {"blue": 100.0, "teal": 0.0}


def wait_until(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)


def test_the_controllers_promql_is_what_prometheus_evaluates_over_both_replicas(fleet: Fleet) -> None:
    """The expressions the controller (and an Argo AnalysisTemplate) evaluate, run against the
    test's Prometheus: the requests one sees are the sum of both replicas' own counts."""
    fleet.reset()
    for server in fleet.replicas:
        for _ in range(10):
            http_request(server, "POST", "/v2/models/shop/infer", BODY)
    counted = sum(_own_count(server) for server in fleet.replicas)
    selected = queries.matchers("shop", "blue")
    deadline = time.monotonic() + 30
    while True:
        found = query(fleet.prometheus, f"sum({queries.REQUESTS}{{{selected}}})")  # every replica's count, summed
        if found and float(found[0]["value"][1]) == counted:
            break
        assert time.monotonic() < deadline, (found, counted)
        time.sleep(0.2)
    errors = query(fleet.prometheus, queries.errors_in(selected, 10))
    assert float(errors[0]["value"][1]) == 0.0
    p99 = query(fleet.prometheus, queries.quantile_in(0.99, selected, 60))
    assert 0 < float(p99[0]["value"][1]) <= 10


def test_argos_guards_are_the_controllers_expressions_and_judge_as_it_does(fleet: Fleet) -> None:
    """The queries `inferd deploy k8s` puts in the AnalysisTemplate, run by the test's Prometheus
    with replica A as Argo's canary and B as its stable: the candidate fails half of A's requests
    and none of B's, so the error-rate delta is about 0.5 (Argo aborts above 0.05), and at one
    instant it is what the controller's own expressions (rollout_queries) give."""
    fleet.reset()
    partial = fleet.endpoints.with_name("endpoints.partial")
    partial.write_text(declared({"blue": 0.0, "green": 100.0, "teal": 0.0}))
    partial.replace(fleet.endpoints)
    wait_for_weights(fleet, {"blue": 0.0, "green": 100.0, "teal": 0.0})
    settings = RolloutSettings("gateway", "", "http://unused", (50.0, 100.0), bake_s=10.0, min_requests=20,
                               scrape_interval_s=1.0)  # fmt: skip
    selected = {name: queries.matchers("shop", "green", {HASH_LABEL: name}) for name in HASHES}
    with Traffic(fleet.front):
        deadline = time.monotonic() + 120
        while True:  # until each side has enough requests in the guards' window
            counts = [query(fleet.prometheus, queries.requests_in(selected[name], settings.range_s)) for name in HASHES]
            if all(found and float(found[0]["value"][1]) >= 60 for found in counts):
                break
            assert time.monotonic() < deadline, counts
            time.sleep(0.5)
        at = time.time()
    guards = guard_queries("shop", "green", settings, *HASHES)

    def value(expression: str) -> float:
        (found,) = query(fleet.prometheus, expression, at)
        return float(found["value"][1])

    rate = {
        name: value(queries.errors_in(selected[name], settings.range_s))
        / value(queries.requests_in(selected[name], settings.range_s))
        for name in HASHES
    }
    delta = value(guards["error-rate-delta"])
    assert delta == pytest.approx(rate["hash-a"] - rate["hash-b"]) and 0.3 < delta < 0.7, rate
    assert value(guards["p99-slower"]) == 0  # as fast as each other: the latency guard holds
    # Too few requests in the window: no value, which Argo's conditions read as inconclusive.
    strict = RolloutSettings("gateway", "", "http://unused", (50.0, 100.0), bake_s=10.0, min_requests=10**6,
                             scrape_interval_s=1.0)  # fmt: skip
    assert query(fleet.prometheus, guard_queries("shop", "green", strict, *HASHES)["error-rate-delta"], at) == []


def _own_count(server: ServerProcess) -> float:
    """The replica's own count of blue's requests by weight, from its /metrics page."""
    connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return parse_metrics(text)[("shop", "blue")].requests


# -- nginx ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def run_nginx(folder: Path, ports: list[int]) -> Iterator[str]:
    """nginx on 127.0.0.1 in front of `ports`, round robin: the fleet's one address (host:port)."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    (port,) = free_ports(1)
    folder.mkdir(parents=True, exist_ok=True)
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in ports)
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temporary = "\n".join(f"    {kind}_temp_path {folder / kind};" for kind in kinds)
    config = folder / "nginx.conf"
    config.write_text(
        f"daemon off;\npid {folder / 'nginx.pid'};\nerror_log {folder / 'error.log'} warn;\n"
        "worker_processes 1;\nevents { worker_connections 256; }\n"
        f"http {{\n    access_log off;\n{temporary}\n"
        f"    upstream replicas {{\n{servers}\n        keepalive 8;\n    }}\n"
        f"    server {{\n        listen 127.0.0.1:{port};\n        location / {{\n"
        "            proxy_pass http://replicas;\n            proxy_http_version 1.1;\n"
        '            proxy_set_header Connection "";\n        }\n    }\n}\n'
    )
    process = subprocess.Popen([binary, "-c", str(config), "-p", str(folder)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _answers(port):
            assert process.poll() is None and time.monotonic() < deadline, (folder / "error.log").read_text()
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGQUIT)  # nginx's graceful stop
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError, http.client.HTTPException):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            connection.request("GET", "/v2/health/ready")
            return connection.getresponse().status == 200
        finally:
            connection.close()
    return False

"""Guarded rollouts end to end: real servers, candidates that are Python models built to misbehave
(failing every fifth request, or 100 ms slower), requests paced by the test so that what it checks
depends on request counts, not on the machine's speed."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inferd.testing.models import misbehaving_model
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()
PACE_S = 0.004  # between requests: the test's rate has a ceiling, whatever the machine


def model(root: Path, name: str, **parameters: object) -> None:
    misbehaving_model(root / name, **parameters)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rollouts") / "repository"
    model(root, "stable")
    model(root, "same")
    model(root, "flaky", fail_every=5)
    model(root, "slow", sleep_ms=100)
    model(root, "drifted", offset=0.5)  # answers well, but not what the baseline answers
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    state = tmp_path_factory.mktemp("state")
    with run_server(repository, state.parent / "server.log", "--state-dir", str(state)) as server:
        yield server


def set_endpoint(server: ServerProcess, name: str, candidate: str, status: int = 201) -> None:
    document = {"variants": [{"name": "blue", "model": "stable", "weight": 100},
                             {"name": "green", "model": candidate, "weight": 0}]}  # fmt: skip
    reply = http_request(server, "PUT", f"/v2/endpoints/{name}", json.dumps(document).encode())
    assert reply.status == status, reply.body


def start(server: ServerProcess, name: str, **settings: Any) -> dict[str, Any]:
    reply = http_request(
        server, "POST", f"/v2/endpoints/{name}/rollout", json.dumps({"to": "green", **settings}).encode()
    )
    assert reply.status == 200, reply.body
    return json.loads(reply.body)  # type: ignore[no-any-return]


def rollout(server: ServerProcess, name: str) -> dict[str, Any]:
    return json.loads(http_request(server, "GET", f"/v2/endpoints/{name}/rollout").body)  # type: ignore[no-any-return]


def drive(
    server: ServerProcess, name: str, until: Callable[[dict[str, Any]], bool], limit: int = 6000
) -> Counter[tuple[int, str]]:
    """Paced requests to the endpoint until `until(rollout)` holds (checked every 20 requests);
    what they were answered, by (status, variant)."""
    answers: Counter[tuple[int, str]] = Counter()
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        for count in range(limit):
            if count % 20 == 0 and until(rollout(server, name)):
                return answers
            connection.request("POST", f"/v2/models/{name}/infer", BODY)
            response = connection.getresponse()
            response.read()
            answers[(response.status, response.getheader("inferd-variant") or "")] += 1
            time.sleep(PACE_S)
    finally:
        connection.close()
    raise AssertionError(f"the rollout never got there: {rollout(server, name)}")


def ended(document: dict[str, Any]) -> bool:
    return document["state"] not in ("running", "paused")


def weights(server: ServerProcess, name: str) -> dict[str, float]:
    body = json.loads(http_request(server, "GET", f"/v2/endpoints/{name}").body)
    return {v["name"]: v["weight"] for v in body["variants"]}


def test_a_canary_failing_one_request_in_five_rolls_back_within_200_candidate_requests(server: ServerProcess) -> None:
    set_endpoint(server, "errors", "flaky")
    start(server, "errors", strategy="canary:10", bake="1h")
    answers = drive(server, "errors", ended)
    document = rollout(server, "errors")
    assert document["state"] == "rolled-back", document
    candidate = sum(n for (_, variant), n in answers.items() if variant == "green")
    assert 100 <= candidate <= 200, answers
    message = document["decisions"][-1]["message"]
    # One in five fails: about 20% over the hundred-odd requests judged.
    judged = r"rolled back at step 1: candidate error rate (1[5-9]|2[0-5])\.\d% vs baseline 0\.0% over 1\d\d requests"
    assert re.match(judged, message), message
    assert weights(server, "errors") == {"blue": 100.0, "green": 0.0}
    # Only the candidate's requests failed, none of the baseline's.
    assert {status for (status, variant) in answers if variant == "blue"} == {200}


def test_a_candidate_100_ms_slower_rolls_back_on_the_p99_guard(server: ServerProcess) -> None:
    set_endpoint(server, "latency", "slow")
    start(server, "latency", strategy="canary:20", bake="1h", min_requests=20)
    drive(server, "latency", ended)
    document = rollout(server, "latency")
    assert document["state"] == "rolled-back", document
    assert "candidate p99" in document["decisions"][-1]["message"]


def test_an_a_a_rollout_is_promoted_after_its_bakes_and_history_tells_each_step(server: ServerProcess) -> None:
    set_endpoint(server, "twins", "same")
    start(server, "twins", strategy="linear:2", bake="1s", min_requests=20)
    drive(server, "twins", ended)
    document = rollout(server, "twins")
    assert document["state"] == "promoted", document
    actions = [d["action"] for d in document["decisions"]]
    assert actions == ["started", "step", "passed", "step", "passed", "promoted"]
    assert weights(server, "twins") == {"blue": 0.0, "green": 100.0}
    history = json.loads(http_request(server, "GET", "/v2/endpoints/twins/rollout/history").body)["rollouts"]
    assert [r["state"] for r in history] == ["promoted"]


def shadowed_endpoint(server: ServerProcess, name: str, candidate: str) -> None:
    """blue (stable) and green (`candidate`), and green's model as a shadow: the baseline's
    requests are copied to it and its answers compared."""
    document = {"variants": [{"name": "blue", "model": "stable", "weight": 100},
                             {"name": "green", "model": candidate, "weight": 0}],
                "shadow": [{"name": "green-shadow", "model": candidate, "sample": 1.0}]}  # fmt: skip
    reply = http_request(server, "PUT", f"/v2/endpoints/{name}", json.dumps(document).encode())
    assert reply.status == 201, reply.body


def test_a_candidate_whose_answers_drift_rolls_back_on_the_drift_guard(server: ServerProcess) -> None:
    """Healthy by error rate and latency, but its answers differ from the baseline's on the very
    requests: --max-drift rolls it back; an A/A candidate passes the same guard."""
    shadowed_endpoint(server, "drift", "drifted")
    start(server, "drift", strategy="canary:50", bake="1h", min_requests=20, max_drift=0.05)
    answers = drive(server, "drift", ended)
    document = rollout(server, "drift")
    assert document["state"] == "rolled-back", document
    message = document["decisions"][-1]["message"]
    assert re.match(
        r"rolled back at step 1: candidate's answers disagreed with the baseline's on (\d+) of \1 ", message
    )
    assert {status for status, _ in answers} == {200}  # no client saw a failure: the answers only differed

    shadowed_endpoint(server, "drift-aa", "same")
    start(server, "drift-aa", strategy="canary:50", bake="1s", min_requests=20, max_drift=0.05)
    drive(server, "drift-aa", ended)
    document = rollout(server, "drift-aa")
    assert document["state"] == "promoted", document
    assert "disagreed on 0 of" in document["decisions"][2]["message"]

    set_endpoint(server, "unshadowed", "same")
    reply = http_request(
        server, "POST", "/v2/endpoints/unshadowed/rollout", json.dumps({"to": "green", "max_drift": 0.05}).encode()
    )
    assert reply.status == 400 and b"shadow" in reply.body


def test_too_little_traffic_pauses_the_step_and_says_so(server: ServerProcess) -> None:
    set_endpoint(server, "quiet", "same")
    start(server, "quiet", strategy="all-at-once", bake="200ms", min_requests=1000)
    drive(server, "quiet", lambda document: document["state"] == "paused", limit=400)
    document = rollout(server, "quiet")
    assert "too little traffic: the candidate has" in document["decisions"][-1]["message"]
    # The endpoint cannot be changed under a rollout; aborting puts the traffic back.
    reply = http_request(
        server, "PUT", "/v2/endpoints/quiet", json.dumps({"variants": [{"name": "a", "model": "same"}]}).encode()
    )
    assert reply.status == 409 and b"has a rollout running" in reply.body
    assert http_request(server, "POST", "/v2/endpoints/quiet/rollout/abort").status == 200
    assert weights(server, "quiet") == {"blue": 100.0, "green": 0.0}


def test_a_linear_rollout_under_steady_load_fails_no_request(server: ServerProcess) -> None:
    set_endpoint(server, "steady", "same")
    statuses: Counter[int] = Counter()
    stop = threading.Event()

    def load() -> None:  # a second client, steady, throughout
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        try:
            while not stop.is_set() and sum(statuses.values()) < 20000:
                connection.request("POST", "/v2/models/steady/infer", BODY)
                response = connection.getresponse()
                response.read()
                statuses[response.status] += 1
                time.sleep(PACE_S)
        finally:
            connection.close()

    thread = threading.Thread(target=load)
    thread.start()
    try:
        start(server, "steady", strategy="linear:4", bake="500ms", min_requests=10)
        drive(server, "steady", ended)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert rollout(server, "steady")["state"] == "promoted"
    assert set(statuses) == {200}, statuses


def test_the_cli_starts_follows_and_lists_rollouts(server: ServerProcess) -> None:
    set_endpoint(server, "cli", "same")
    url = f"http://{server.http_url}"

    def inferd(*arguments: str) -> str:
        command = [sys.executable, "-m", "inferd", "rollout", *arguments, "--url", url]
        environment = {**os.environ, "COLUMNS": "200"}
        run = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment)
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    started = inferd("start", "cli", "--to", "green", "--strategy", "canary:10", "--bake", "1h")
    assert "cli: running — from 'blue' to 'green' by canary:10, step 1 of 2, 'green' at 10%" in started
    assert "'green' at 10% for 3600 s" in inferd("status", "cli")
    assert "promoted by hand" in inferd("promote", "cli")
    assert "promoted by hand" in inferd("history", "cli")
    missing = subprocess.run([sys.executable, "-m", "inferd", "rollout", "abort", "cli", "--url", url],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 1 and "has no rollout running" in missing.stderr


def test_a_rollout_killed_mid_bake_resumes_after_a_restart_and_completes(repository: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with run_server(repository, tmp_path / "first.log", "--state-dir", str(state)) as server:
        set_endpoint(server, "kill", "same")
        start(server, "kill", strategy="canary:10", bake="3s", min_requests=20)
        drive(server, "kill", lambda document: document["decisions"][-1]["action"] == "step", limit=40)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=30)
    with run_server(repository, tmp_path / "second.log", "--state-dir", str(state)) as server:
        assert "rollouts resumed: kill" in server.log()
        assert weights(server, "kill") == {"blue": 90.0, "green": 10.0}  # split, and judged again
        drive(server, "kill", ended)
        document = rollout(server, "kill")
        assert document["state"] == "promoted", document
        assert "resumed" in [d["action"] for d in document["decisions"]]


class Gate:
    """An outside alarm on 127.0.0.1: answers each step with `verdict`, and keeps what it was asked."""

    def __init__(self) -> None:
        self.verdict: dict[str, Any] = {"pass": True}
        self.asked: list[dict[str, Any]] = []
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                gate.asked.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                body = json.dumps(gate.verdict).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/check"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_outside_alarm_is_asked_at_each_step_and_its_no_rolls_back(repository: Path, tmp_path: Path) -> None:
    gate = Gate()
    try:
        with run_server(repository, tmp_path / "server.log", "--rollout-webhook", f"gate={gate.url}") as server:
            set_endpoint(server, "gated", "same")
            unknown = http_request(server, "POST", "/v2/endpoints/gated/rollout",
                                   json.dumps({"to": "green", "webhook": "elsewhere"}).encode())  # fmt: skip
            assert unknown.status == 400 and b"known: gate" in unknown.body
            start(server, "gated", strategy="linear:2", bake="300ms", min_requests=10, webhook="gate")
            drive(server, "gated", ended)
            assert rollout(server, "gated")["state"] == "promoted"
            assert [(a["step"], a["share"]) for a in gate.asked] == [(1, 50.0), (2, 100.0)]
            assert set(gate.asked[0]["figures"]) == {"blue", "green"}
            gate.verdict = {"pass": False, "reason": "the checkout funnel dropped 3%"}
            set_endpoint(server, "gated", "same", status=200)  # the traffic back on blue
            start(server, "gated", strategy="canary:10", bake="300ms", min_requests=10, webhook="gate")
            drive(server, "gated", ended)
            document = rollout(server, "gated")
            assert document["state"] == "rolled-back"
            assert document["decisions"][-1]["message"] == (
                "rolled back at step 1: the webhook 'gate' said no: the checkout funnel dropped 3%"
            )
    finally:
        gate.close()

"""Shadow variants through the public interface: copies of an endpoint's requests to candidates that
never answer a client, their answers compared with the primary's, counted, logged, and a shadow that
keeps failing turning itself off. The misbehaving shadows are Python models built to misbehave."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inferd.testing.models import misbehaving_model
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request
from tests.e2e.test_observability import scrape

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()


def model(root: Path, name: str, **parameters: object) -> None:
    misbehaving_model(root / name, **parameters)


@pytest.fixture(scope="module")
def hold_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hold") / "held"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, hold_file: Path, state_dir: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("shadows") / "repository"
    model(root, "primary")
    model(root, "twin")
    model(root, "drift", offset=0.5)
    model(root, "flaky", hold_file=hold_file, fail_every=2)
    model(root, "broken", fail_every=1)
    with run_server(root, root.parent / "server.log", "--state-dir", str(state_dir)) as server:
        yield server


def put(server: ServerProcess, name: str, shadows: list[dict[str, Any]]) -> None:
    document = {"variants": [{"name": "main", "model": "primary"}], "shadow": shadows}
    reply = http_request(server, "PUT", f"/v2/endpoints/{name}", json.dumps(document).encode())
    assert reply.status == 201, reply.body


def shadows(server: ServerProcess, name: str) -> dict[str, dict[str, Any]]:
    body = json.loads(http_request(server, "GET", f"/v2/endpoints/{name}").body)
    return {shadow["name"]: shadow for shadow in body["shadow"]}


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def call(server: ServerProcess, endpoint: str, count: int) -> list[int]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    statuses = []
    try:
        for _ in range(count):
            connection.request("POST", f"/v2/models/{endpoint}/infer", BODY)
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
    finally:
        connection.close()
    return statuses


def rss_kib(server: ServerProcess) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_slow_failing_shadow_costs_the_clients_nothing_and_its_overflow_is_dropped(
    server: ServerProcess, hold_file: Path
) -> None:
    put(server, "mirrored", [{"name": "candidate", "model": "flaky", "sample": 1.0}])
    hold_file.touch()  # the shadow's executions wait until the file goes: none can end meanwhile
    try:
        rss_before = rss_kib(server)
        # Every primary answer comes while the shadow holds every copy: none waits for it.
        assert call(server, "mirrored", 2000) == [200] * 2000
        rss_after = rss_kib(server)
        state = shadows(server, "mirrored")["candidate"]
        # 4 copies running and 64 waiting; the rest were dropped, not queued without end.
        assert state["dropped_total"] == 2000 - 68
        assert state["requests_total"] == 0
    finally:
        hold_file.unlink()
    assert rss_after - rss_before < 64 * 1024, (rss_before, rss_after)
    wait_for(lambda: shadows(server, "mirrored")["candidate"]["requests_total"] == 68)
    state = shadows(server, "mirrored")["candidate"]
    # Half fail by construction; the other half agree with the primary (y = x both).
    assert (state["errors_total"], state["compared"], state["agreed"], state["state"]) == (34, 34, 34, "on")
    text = scrape(server)
    assert 'inferd_shadow_dropped_total{endpoint="mirrored",shadow="candidate"} 1932.0' in text
    assert 'inferd_shadow_requests_total{endpoint="mirrored",outcome="MODEL_RAISED",shadow="candidate"} 34.0' in text
    assert 'inferd_shadow_comparisons_total{endpoint="mirrored",result="agree",shadow="candidate"} 34.0' in text


def test_answers_are_compared_with_the_primarys_and_a_sample_is_exact(server: ServerProcess) -> None:
    put(server, "compared", [{"name": "same", "model": "twin", "sample": 0.5},
                             {"name": "other", "model": "drift", "sample": 0.5}])  # fmt: skip
    assert call(server, "compared", 200) == [200] * 200
    wait_for(lambda: all(s["compared"] == 100 for s in shadows(server, "compared").values()))
    found = shadows(server, "compared")
    same = found["same"]
    assert (same["agreed"], same["agreement"], same["max_abs_diff"]) == (100, 1.0, {"y": 0.0})
    assert (found["other"]["agreed"], found["other"]["agreement"]) == (0, 0.0)
    assert found["other"]["max_abs_diff"]["y"] == pytest.approx(0.5)
    assert found["other"]["against_variants"]["error_rate_delta"] == 0.0


def test_a_shadow_that_keeps_failing_turns_itself_off_and_says_why(server: ServerProcess) -> None:
    put(server, "failing", [{"name": "bad", "model": "broken"}])
    assert call(server, "failing", 60) == [200] * 60
    wait_for(lambda: shadows(server, "failing")["bad"]["state"] == "off")
    state = shadows(server, "failing")["bad"]
    assert state["reason"].startswith("turned off after 50 failures in a row; the last: MODEL_RAISED")
    sent = state["requests_total"]
    assert call(server, "failing", 20) == [200] * 20
    assert shadows(server, "failing")["bad"]["requests_total"] == sent
    assert "turned off after 50 failures" in server.log()


def test_a_logged_shadow_writes_pairs_that_inferd_validate_reads(server: ServerProcess, state_dir: Path) -> None:
    put(server, "logged", [{"name": "twin", "model": "twin", "log": True}])
    assert call(server, "logged", 10) == [200] * 10
    log = state_dir / "shadow" / "logged.twin.jsonl"
    wait_for(lambda: log.is_file() and len(log.read_text().splitlines()) == 10)
    first = json.loads(log.read_text().splitlines()[0])
    assert first["x"] == {"content": [1.0, 2.0, 3.0, 4.0], "shape": [1, 4]}
    assert first["_answers"]["agreed"] is True
    validate = subprocess.run(
        [sys.executable, "-m", "inferd", "validate", f"http://{server.http_url}/primary",
         f"http://{server.http_url}/twin", "--inputs", str(log)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "10 samples" in validate.stdout


def test_a_shadow_must_take_what_the_variants_take(server: ServerProcess) -> None:
    document = {"variants": [{"name": "main", "model": "primary"}], "shadow": [{"name": "s", "model": "nope"}]}
    reply = http_request(server, "PUT", "/v2/endpoints/wrong", json.dumps(document).encode())
    assert reply.status == 400 and b"model 'nope' does not serve" in reply.body
    document["shadow"] = [{"name": "main", "model": "twin"}]
    reply = http_request(server, "PUT", "/v2/endpoints/wrong", json.dumps(document).encode())
    assert reply.status == 400 and b"names variant 'main' more than once" in reply.body

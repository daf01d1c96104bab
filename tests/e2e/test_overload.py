"""Overload through the public interface: what the queue bound counts, refusals before the body is
decoded, and refusal floods that cost the log a line a second. Requests are held executing by a
Python model that waits on a file (slow by construction, on any machine); the tests wait on the
server's own gauges, never on sleeps."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import orjson
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferd.testing.models import sleepy_model
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import HttpReply, http_request

pytestmark = pytest.mark.e2e

TRITON_S_BOUND = 'parameters { key: "max_queue_size_includes_executing" value: { string_value: "false" } }'
ONE_QUEUED = "dynamic_batching { default_queue_policy { max_queue_size: 1 } }"


@pytest.fixture(scope="module")
def hold_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def overload_server(tmp_path_factory: pytest.TempPathFactory, hold_file: Path) -> Iterator[ServerProcess]:
    """Two models that run one request at a time with a queue of one: `queued` bounds the queue as
    Triton does, `inclusive` counts the executing request too (inferd's default)."""
    root = tmp_path_factory.mktemp("repository")
    sleepy_model(root / "queued", 0, 1, f"{ONE_QUEUED}\n{TRITON_S_BOUND}", hold_file=hold_file)
    sleepy_model(root / "inclusive", 0, 1, ONE_QUEUED, hold_file=hold_file)
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log") as server:
        yield server


def infer_body(value: float = 1.0) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [value, value]}]})


def infer(server: ServerProcess, model: str, body: bytes | None = None) -> HttpReply:
    return http_request(server, "POST", f"/v2/models/{model}/infer", body or infer_body())


def gauges(server: ServerProcess, model: str) -> tuple[float, float]:
    """(requests in flight, requests queued) of `model`, from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()

    def gauge(name: str) -> float:
        found = re.search(rf'^{name}\{{model="{model}",version="1"\}} (\S+)$', text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    return gauge("inferd_requests_in_flight"), gauge("inferd_queue_depth")


def wait_for(server: ServerProcess, model: str, executing: int, queued: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        in_flight, depth = gauges(server, model)
        if (in_flight - depth, depth) == (executing, queued):
            return
        time.sleep(0.02)
    raise AssertionError(f"{model} never had {executing} executing and {queued} queued: {gauges(server, model)}")


@pytest.fixture
def held(hold_file: Path) -> Iterator[ThreadPoolExecutor]:
    """Executions wait while the test runs; requests sent on the pool finish after it."""
    hold_file.touch()
    pool = ThreadPoolExecutor(4)
    try:
        yield pool
    finally:
        hold_file.unlink(missing_ok=True)
        pool.shutdown(wait=True)


def send(pool: ThreadPoolExecutor, server: ServerProcess, model: str) -> Future[HttpReply]:
    return pool.submit(infer, server, model)


def test_triton_s_bound_admits_a_request_behind_the_executing_one(
    overload_server: ServerProcess, held: ThreadPoolExecutor, hold_file: Path
) -> None:
    first = send(held, overload_server, "queued")
    wait_for(overload_server, "queued", executing=1, queued=0)
    second = send(held, overload_server, "queued")
    wait_for(overload_server, "queued", executing=1, queued=1)
    refused = infer(overload_server, "queued")
    assert refused.status == 503
    error = orjson.loads(refused.body)
    assert error["code"] == "OVERLOADED" and "holds max_queue_size 1 requests; retry later" in error["error"]
    assert "retry-after" in refused.headers
    hold_file.unlink()
    assert first.result(timeout=30).status == 200 and second.result(timeout=30).status == 200


def test_a_bound_that_includes_executing_requests_refuses_while_one_executes(
    overload_server: ServerProcess, held: ThreadPoolExecutor, hold_file: Path
) -> None:
    first = send(held, overload_server, "inclusive")
    wait_for(overload_server, "inclusive", executing=1, queued=0)
    refused = infer(overload_server, "inclusive")
    assert refused.status == 503
    error = orjson.loads(refused.body)
    assert error["code"] == "OVERLOADED"
    assert "holds max_queue_size 1 requests, executing ones included; retry later" in error["error"]
    hold_file.unlink()
    assert first.result(timeout=30).status == 200
    wait_for(overload_server, "inclusive", executing=0, queued=0)
    assert infer(overload_server, "inclusive").status == 200  # room again


def test_a_full_model_refuses_before_decoding_the_body_and_counts_the_refusal(
    overload_server: ServerProcess, held: ThreadPoolExecutor, hold_file: Path
) -> None:
    """Shedding costs no decoding: a body that would be a 400 gets the 503 of the full queue (its
    client retries after Retry-After and then hears what is wrong with it), over HTTP and gRPC."""
    before = model_failures(overload_server, "inclusive")
    first = send(held, overload_server, "inclusive")
    wait_for(overload_server, "inclusive", executing=1, queued=0)
    malformed = infer(overload_server, "inclusive", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [')
    assert malformed.status == 503 and orjson.loads(malformed.body)["code"] == "OVERLOADED"
    with grpc.insecure_channel(overload_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="inclusive")
        request.inputs.add(name="x", datatype="FP64", shape=[1, 2])  # wrong datatype, and no data
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "executing ones included" in str(raised.value.details())
    hold_file.unlink()
    assert first.result(timeout=30).status == 200
    assert model_failures(overload_server, "inclusive") == before + 2
    wait_for(overload_server, "inclusive", executing=0, queued=0)
    assert infer(overload_server, "inclusive", b"{").status == 400  # with room, decoded: the client's mistake


def model_failures(server: ServerProcess, model: str) -> int:
    reply = http_request(server, "GET", f"/v2/models/{model}/stats")
    return int(json.loads(reply.body)["model_stats"][0]["inference_stats"]["fail"]["count"])


def test_an_error_is_logged_with_its_request_id(overload_server: ServerProcess) -> None:
    http_request(overload_server, "POST", "/v2/models/queued/infer", b"{", {"X-Request-ID": "log-me-42"})
    lines = [json.loads(line) for line in overload_server.log().splitlines() if "log-me-42" in line]
    assert lines, "the error was not logged with its request id"
    assert lines[0]["request_id"] == "log-me-42" and lines[0]["level"] == "WARNING"
    assert lines[0]["status"] == 400


def test_a_flood_of_refusals_is_logged_a_line_a_second_with_a_count_of_the_rest(
    overload_server: ServerProcess,
) -> None:
    """Every refusal is accounted for: logged, or counted in the `suppressed` of the next line of
    its kind. The kind here (a model that does not exist) comes from no other test of this server."""

    def flood_lines() -> list[dict[str, object]]:
        return [
            entry
            for entry in map(json.loads, overload_server.log().splitlines())
            if "MODEL_NOT_FOUND" in str(entry.get("message"))
        ]

    sent = 60
    for index in range(sent):
        assert http_request(overload_server, "POST", f"/v2/models/absent-{index}/infer", infer_body()).status == 404
    logged = len(flood_lines())
    assert logged < sent, "every refusal of the flood was logged"
    deadline = time.monotonic() + 30
    while not any("suppressed" in entry for entry in flood_lines()) and time.monotonic() < deadline:
        http_request(overload_server, "POST", "/v2/models/absent-after/infer", infer_body())
        sent += 1
        time.sleep(0.2)
    summary = next(entry for entry in flood_lines() if "suppressed" in entry)
    assert f"({summary['suppressed']} more like it not logged)" in str(summary["message"])
    lines = flood_lines()
    assert len(lines) + sum(int(str(entry.get("suppressed", 0))) for entry in lines) == sent

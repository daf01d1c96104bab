"""Dynamic batching with several instances, under many concurrent clients, and under overload."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from inferd.testing.models import add_sub_model, python_model, sleepy_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

WIDTH = 16
SLOW_SIZE = 8
GLACIAL_SIZE = 8


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batching")
    add_sub_model(root / "add_sub" / "1" / "model.onnx", size=WIDTH)
    write_config(
        root / "add_sub",
        """
        max_batch_size: 16
        dynamic_batching { max_queue_delay_microseconds: 2000 preferred_batch_size: [ 8, 16 ] }
        instance_group [ { count: 2 kind: KIND_CPU } ]
        """,
    )
    # Python models that sleep per execution: slow by construction, on any machine.
    sleepy_model(
        root / "slow",
        50,
        2,
        """
        dynamic_batching { default_queue_policy { max_queue_size: 4 } }
        instance_group [ { count: 1 kind: KIND_CPU } ]
        """,
    )
    sleepy_model(root / "glacial", 500, 8, "dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]")
    # The rows each execution saw, beside y = x: padding shows in `seen`, never in `y`.
    python_model(root / "padded" / "1", ROWS_SEEN_MODEL)
    padded_config = """
        max_batch_size: 8
        dynamic_batching { max_queue_delay_microseconds: 20000 }
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "seen" data_type: TYPE_INT64 dims: [ 1 ] } ]
        parameters { key: "allowed_batch_sizes" value { string_value: "%s" } }
        """
    write_config(root / "padded", padded_config % "4,8")
    python_model(root / "padded_badly" / "1", ROWS_SEEN_MODEL)
    write_config(root / "padded_badly", padded_config % "2,4")
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log") as server:
        yield server


ROWS_SEEN_MODEL = """
import numpy as np


class Model:
    def execute(self, inputs):
        x = inputs["x"]
        return {"y": x, "seen": np.full((len(x), 1), len(x), dtype=np.int64)}
"""


def request_rows(index: int) -> np.ndarray:
    # Distinct inputs, and every fifth request carries several rows of its own.
    rows = 1 + (index % 5 == 0) * (index % 3 + 1)
    return np.arange(rows * WIDTH, dtype=np.float32).reshape(rows, WIDTH) + 1000 * index


async def http_call(client: httpaio.InferenceServerClient, index: int) -> None:
    a = request_rows(index)
    b = np.full_like(a, index)
    inputs = [httpaio.InferInput("INPUT0", list(a.shape), "FP32"), httpaio.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=index % 2 == 0)  # JSON and binary mixed in one batch
    inputs[1].set_data_from_numpy(b, binary_data=index % 2 == 0)
    result = await client.infer("add_sub", inputs, request_id=f"h{index}")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == f"h{index}"


async def grpc_call(client: grpcaio.InferenceServerClient, index: int) -> None:
    a = request_rows(index)
    b = np.full_like(a, -index)
    inputs = [grpcaio.InferInput("INPUT0", list(a.shape), "FP32"), grpcaio.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = await client.infer("add_sub", inputs, request_id=f"g{index}")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == f"g{index}"


def batch_size_histogram(server: ServerProcess, model: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    buckets = {}
    for line in text.splitlines():
        if line.startswith("inferd_batch_size_bucket") and f'model="{model}"' in line:
            le = line.split('le="')[1].split('"')[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
    return buckets


async def test_every_concurrent_request_gets_its_own_rows(batching_server: ServerProcess) -> None:
    http_client = httpaio.InferenceServerClient(batching_server.http_url, conn_limit=150)
    grpc_client = grpcaio.InferenceServerClient(batching_server.grpc_url)
    try:
        calls = [http_call(http_client, i) for i in range(150)] + [grpc_call(grpc_client, i) for i in range(150)]
        await asyncio.wait_for(asyncio.gather(*calls), timeout=120)
    finally:
        await http_client.close()
        await grpc_client.close()
    buckets = batch_size_histogram(batching_server, "add_sub")
    executions, single_row = buckets["+Inf"], buckets["1.0"]
    assert executions < 300, "no request was batched with another"
    assert single_row < executions


async def slow_call(client: httpaio.InferenceServerClient, index: int) -> str:
    x = np.full((1, SLOW_SIZE), float(index), dtype=np.float32)
    tensor = httpaio.InferInput("x", [1, SLOW_SIZE], "FP32")
    tensor.set_data_from_numpy(x)
    try:
        result = await client.infer("slow", [tensor])
    except InferenceServerException as exc:
        assert exc.status() == "503", exc.message()
        assert "model 'slow'" in exc.message() and "max_queue_size 4" in exc.message()
        return "shed"
    np.testing.assert_array_equal(result.as_numpy("y"), x)
    return "served"


async def test_overload_sheds_with_503_and_recovers(batching_server: ServerProcess) -> None:
    client = httpaio.InferenceServerClient(batching_server.http_url, conn_limit=80)
    try:
        burst = asyncio.gather(*(slow_call(client, i) for i in range(80)))
        # The server stays responsive while shedding.
        live = await asyncio.to_thread(http_request, batching_server, "GET", "/v2/health/live")
        assert live.status == 200
        outcomes = await asyncio.wait_for(burst, timeout=120)
        assert outcomes.count("shed") > 0
        assert outcomes.count("served") >= 4
        # Recovered: the next request is served.
        assert await slow_call(client, 999) == "served"
    finally:
        await client.close()


def slow_body() -> bytes:
    import orjson

    return orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, SLOW_SIZE], "data": [1.0] * SLOW_SIZE}]}
    )


def test_deadline_that_cannot_be_met_is_refused_at_once(batching_server: ServerProcess) -> None:
    import orjson

    # A microsecond is gone before the request is even decoded, on any machine: refused at once.
    # Whether a deadline can be met is decided by the batcher's estimate, tested as a unit with a
    # fake clock (tests/unit/core/test_batcher.py); here only the wire mapping is.
    reply = http_request(batching_server, "POST", "/v2/models/slow/infer", slow_body(), {"Inferd-Timeout-Ms": "0.001"})
    assert reply.status == 503
    body = orjson.loads(reply.body)
    assert body["code"] == "DEADLINE_UNREACHABLE"
    assert "cannot answer within the request's deadline" in body["error"]
    assert int(reply.headers["retry-after"]) >= 1
    assert body["retry_after_ms"] > 0
    # A generous deadline is met.
    reply = http_request(batching_server, "POST", "/v2/models/slow/infer", slow_body(), {"Inferd-Timeout-Ms": "60000"})
    assert reply.status == 200
    # A malformed one is the client's mistake.
    reply = http_request(batching_server, "POST", "/v2/models/slow/infer", slow_body(), {"Inferd-Timeout-Ms": "soon"})
    assert reply.status == 400


def test_triton_timeout_parameter_and_grpc_deadline(batching_server: ServerProcess) -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="slow")
    request.inputs.add(name="x", datatype="FP32", shape=[1, SLOW_SIZE]).contents.fp32_contents.extend([1.0] * SLOW_SIZE)
    request.parameters["timeout"].int64_param = 1  # microseconds: gone before admission, on any machine
    with grpc.insecure_channel(batching_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=30)
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        trailers = dict(raised.value.trailing_metadata())
        assert trailers["inferd-code"] == "DEADLINE_UNREACHABLE"
        assert int(trailers["retry-after"]) >= 1
        # The gRPC deadline itself is honoured the same way, and a roomy one is met.
        del request.parameters["timeout"]
        response = stub.ModelInfer(request, timeout=30)
        assert response.outputs[0].name == "y"


def test_request_of_a_client_that_left_is_dropped_from_the_queue(batching_server: ServerProcess) -> None:
    import socket
    import threading

    import orjson

    def glacial_request(rows: int) -> bytes:
        data = [1.0] * (rows * GLACIAL_SIZE)
        document = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, GLACIAL_SIZE], "data": data}]}
        return orjson.dumps(document)

    def inference_count() -> int:
        reply = http_request(batching_server, "GET", "/v2/models/glacial/stats")
        return int(orjson.loads(reply.body)["model_stats"][0]["inference_count"])

    before = inference_count()
    # A long batch keeps the only instance busy...
    blocker = threading.Thread(
        target=http_request, args=(batching_server, "POST", "/v2/models/glacial/infer", glacial_request(8))
    )
    blocker.start()
    wait_until_in_flight(batching_server, "glacial")
    # ...while a client queues a request behind it and hangs up.
    body = glacial_request(1)
    with socket.create_connection(("127.0.0.1", batching_server.http_port)) as sock:
        sock.sendall(
            b"POST /v2/models/glacial/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    blocker.join(timeout=120)
    # A request after both: by the time it is answered, the queue ahead of it has been worked off.
    assert http_request(batching_server, "POST", "/v2/models/glacial/infer", glacial_request(1)).status == 200
    assert inference_count() - before == 8 + 1  # the departed client's row never ran


def wait_until_in_flight(server: ServerProcess, model: str, count: int = 1) -> None:
    """Until the server reports `count` requests of `model` in flight (polled, bounded)."""
    import time

    from tests.e2e.test_observability import sample, scrape

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sample(scrape(server), "inferd_requests_in_flight", missing=0.0, model=model) >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"never {count} request(s) of {model} in flight")


async def test_allowed_batch_sizes_pad_every_execution_and_each_client_gets_its_own_rows(
    batching_server: ServerProcess,
) -> None:
    """TF Serving's allowed_batch_sizes: a lone 1-row request runs as 4 rows, 5 rows as 8, and
    concurrent requests batched together still get exactly their own rows."""

    async def call(client: httpaio.InferenceServerClient, index: int, rows: int) -> int:
        x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + 100 * index
        tensor = httpaio.InferInput("x", [rows, 2], "FP32")
        tensor.set_data_from_numpy(x)
        result = await client.infer("padded", [tensor])
        np.testing.assert_array_equal(result.as_numpy("y"), x)
        seen = result.as_numpy("seen")
        assert seen.shape == (rows, 1) and len(set(seen.ravel().tolist())) == 1
        return int(seen[0, 0])

    client = httpaio.InferenceServerClient(batching_server.http_url, conn_limit=40)
    try:
        assert await asyncio.wait_for(call(client, 0, 1), timeout=30) == 4
        assert await asyncio.wait_for(call(client, 1, 5), timeout=30) == 8
        assert await asyncio.wait_for(call(client, 2, 8), timeout=30) == 8
        calls = [call(client, i, 1 + i % 3) for i in range(40)]
        seen = await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
    finally:
        await client.close()
    assert set(seen) <= {4, 8}


def test_allowed_batch_sizes_that_miss_max_batch_size_fail_that_model_with_the_reason(
    batching_server: ServerProcess,
) -> None:
    index = json.loads(http_request(batching_server, "POST", "/v2/repository/index").body)
    state = {entry["name"]: (entry["state"], entry.get("reason", "")) for entry in index}["padded_badly"]
    assert state[0] == "UNAVAILABLE"
    assert "allowed_batch_sizes '2,4'" in state[1] and "the last size must be max_batch_size (8)" in state[1]

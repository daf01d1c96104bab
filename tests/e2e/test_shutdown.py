"""SIGTERM lets in-flight requests finish (HTTP and gRPC), then the server exits cleanly."""

from __future__ import annotations

import http.client
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient

from inferd.testing.models import sleepy_model
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import Clients
from tests.e2e.test_batching import wait_until_in_flight

pytestmark = pytest.mark.e2e

SIZE = 8


def http_infer(server: ServerProcess, value: float) -> tuple[int, float]:
    data = np.full((SIZE, SIZE), value, dtype=np.float32)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [SIZE, SIZE],
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    )
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    try:
        connection.request(
            "POST",
            "/v2/models/slow/infer",
            header + data.tobytes(),
            {"Inference-Header-Content-Length": str(len(header))},
        )
        response = connection.getresponse()
        body = response.read()
        length = int(response.getheader("Inference-Header-Content-Length", "0"))
        return response.status, float(np.frombuffer(body[length:], dtype="<f4")[0]) if response.status == 200 else -1.0
    finally:
        connection.close()


def grpc_infer(client: grpcclient.InferenceServerClient, value: float) -> float:
    tensor = grpcclient.InferInput("x", [SIZE, SIZE], "FP32")
    tensor.set_data_from_numpy(np.full((SIZE, SIZE), value, dtype=np.float32))
    return float(client.infer("slow", [tensor], client_timeout=120).as_numpy("y")[0, 0])


def test_sigterm_finishes_in_flight_requests(clients: Clients, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    hold = tmp_path / "hold"
    sleepy_model(repository / "slow", 50, 0, "instance_group [ { count: 1 kind: KIND_CPU } ]", hold_file=hold)
    with run_server(repository, tmp_path / "server.log") as server, ThreadPoolExecutor(max_workers=6) as pool:
        hold.touch()  # executions wait until it is gone: all six stay in flight as long as needed
        grpc_clients = [clients.grpc(server.grpc_url) for _ in range(2)]
        assert all(client.is_server_ready() for client in grpc_clients)
        http_futures = [pool.submit(http_infer, server, value) for value in (1.0, 2.0, 3.0, 4.0)]
        grpc_futures = [pool.submit(grpc_infer, grpc_clients[i], value) for i, value in enumerate((5.0, 6.0))]
        # One instance runs them one at a time, each held by the hold file (on any machine): signal
        # once the server holds all six, as its own gauge says, then let them finish.
        wait_until_in_flight(server, "slow", 6)
        server.process.send_signal(15)
        hold.unlink()
        # The identity weights keep each value; every request in flight is answered in full.
        assert [f.result(timeout=120) for f in http_futures] == [(200, 1.0), (200, 2.0), (200, 3.0), (200, 4.0)]
        assert [f.result(timeout=120) for f in grpc_futures] == [5.0, 6.0]
        assert server.process.wait(timeout=60) == 0
    log = server.log()
    assert "shutting down" in log
    assert "stopped" in log

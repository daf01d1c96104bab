"""Prometheus metrics, Triton's statistics extension and the Server-Timing split, end to end."""

from __future__ import annotations

import urllib.request

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from inferd.testing.server import ServerProcess
from tests.e2e.conftest import Clients, http_request

pytestmark = pytest.mark.e2e

PHASES = ("decode", "queue", "batch-wait", "compute", "encode")


def infer_mlp(server: ServerProcess, rows: int) -> None:
    tensor = httpclient.InferInput("x", [rows, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 16), dtype=np.float32))
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.infer("mlp_specific", [tensor], model_version="3")


def infer_mlp_over_grpc(clients: Clients, server: ServerProcess, rows: int) -> None:
    tensor = grpcclient.InferInput("x", [rows, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 16), dtype=np.float32))
    clients.grpc(server.grpc_url).infer("mlp_specific", [tensor], model_version="3")


def scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        return response.read().decode()


def grew(before: str, after: str, name: str, **labels: str) -> float:
    """How much the series `name{labels...}` grew between two scrapes (absent before: from 0)."""
    return sample(after, name, **labels) - sample(before, name, missing=0.0, **labels)


def sample(text: str, name: str, missing: float | None = None, **labels: str) -> float:
    """The value of the series `name{labels...}`; `missing` (or a failed assertion) if absent."""
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    assert missing is not None, f"{name} {labels} not in the exposition"
    return missing


def test_statistics_extension_counts_requests_and_rows(clients: Clients, server: ServerProcess) -> None:
    client = clients.http(server.http_url)
    before = client.get_inference_statistics("mlp_specific", "3")["model_stats"][0]
    infer_mlp(server, rows=3)
    infer_mlp(server, rows=2)
    after = client.get_inference_statistics("mlp_specific", "3")["model_stats"][0]
    assert after["name"] == "mlp_specific" and after["version"] == "3"
    assert after["inference_count"] - before["inference_count"] == 5
    assert after["execution_count"] - before["execution_count"] == 2
    success = after["inference_stats"]["success"]
    assert success["count"] - before["inference_stats"]["success"]["count"] == 2
    assert success["ns"] > before["inference_stats"]["success"]["ns"]
    assert {b["batch_size"] for b in after["batch_stats"]} >= {2, 3}
    # Every loaded version of every model, and over gRPC the same numbers.
    everything = client.get_inference_statistics()["model_stats"]
    assert {"add_sub", "mlp_specific"} <= {s["name"] for s in everything}
    grpc_stats = clients.grpc(server.grpc_url).get_inference_statistics("mlp_specific", "3")
    assert grpc_stats.model_stats[0].inference_count == after["inference_count"]


def test_statistics_of_unknown_model_is_404(server: ServerProcess) -> None:
    assert http_request(server, "GET", "/v2/models/nope/stats").status == 404


def test_prometheus_metrics_split_the_time(server: ServerProcess) -> None:
    before = scrape(server)
    infer_mlp(server, rows=4)
    after = scrape(server)
    labels = {"model": "mlp_specific", "version": "3"}

    def grew(name: str, **extra: str) -> float:
        return sample(after, name, **labels, **extra) - sample(before, name, missing=0.0, **labels, **extra)

    assert grew("inferd_requests_total", protocol="kserve_http", outcome="success") >= 1
    for phase in ("decode", "queue", "batch_wait", "compute", "encode"):
        assert grew(f"inferd_request_{phase}_duration_seconds_count", protocol="kserve_http") >= 1
    assert grew("inferd_batch_size_bucket", le="4.0") >= 1
    assert sample(after, "inferd_model_state", model="broken_file", state="UNAVAILABLE") == 1.0
    assert sample(after, "inferd_model_state", model="add_sub", state="READY") == 1.0
    assert sample(after, "inferd_requests_in_flight", model="mlp_specific", version="3") == 0.0


def test_each_door_s_requests_are_timed_apart_and_added_up_in_the_statistics(
    clients: Clients, server: ServerProcess
) -> None:
    """One request by KServe's HTTP door, one by its gRPC door: each door's phase histograms count
    its own; the model's executions (no door) and Triton's statistics extension count both."""
    triton_before = clients.http(server.http_url).get_inference_statistics("mlp_specific", "3")["model_stats"][0]
    before = scrape(server)
    infer_mlp(server, rows=1)
    infer_mlp_over_grpc(clients, server, rows=1)
    after = scrape(server)
    triton_after = clients.http(server.http_url).get_inference_statistics("mlp_specific", "3")["model_stats"][0]
    labels = {"model": "mlp_specific", "version": "3"}
    for protocol in ("kserve_http", "kserve_grpc"):
        for phase in ("", "_decode", "_queue", "_batch_wait", "_compute", "_encode"):
            name = f"inferd_request{phase}_duration_seconds_count"
            assert grew(before, after, name, **labels, protocol=protocol) == 1, (name, protocol)
    assert grew(before, after, "inferd_execution_duration_seconds_count", **labels) == 2
    assert 'inferd_batch_size_count{model="mlp_specific",version="3"}' in after  # no door: an execution's
    success_before, success_after = triton_before["inference_stats"], triton_after["inference_stats"]
    assert success_after["success"]["count"] - success_before["success"]["count"] == 2
    assert triton_after["execution_count"] - triton_before["execution_count"] == 2


def test_failures_are_counted_by_reason(server: ServerProcess) -> None:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 16], "data": [0] * 16}]})
    http_request(server, "POST", "/v2/models/mlp_specific/versions/3/infer", body)
    text = scrape(server)
    assert sample(text, "inferd_requests_total", model="mlp_specific", outcome="DATATYPE_MISMATCH") >= 1


def test_server_timing_on_request_over_http(server: ServerProcess) -> None:
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [1]}]})
    plain = http_request(server, "POST", "/v2/models/identity_int32/infer", body)
    assert "server-timing" not in plain.headers
    timed = http_request(server, "POST", "/v2/models/identity_int32/infer", body, {"Inferd-Server-Timing": "true"})
    entries = dict(part.strip().split(";dur=") for part in timed.headers["server-timing"].split(","))
    assert tuple(entries) == PHASES
    assert all(float(value) >= 0 for value in entries.values())
    assert float(entries["compute"]) > 0


def test_server_timing_on_request_over_grpc(server: ServerProcess) -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="identity_int32")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 1]).contents.int_contents.append(7)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelInfer.with_call(request, timeout=10, metadata=(("inferd-server-timing", "1"),))
    trailers = dict(call.trailing_metadata())
    assert [p.split(";")[0].strip() for p in trailers["server-timing"].split(",")] == list(PHASES)


def test_requests_for_unknown_models_add_no_series(server: ServerProcess) -> None:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0] * 16}]})
    before = scrape(server)
    for index in range(200):
        assert http_request(server, "POST", f"/v2/models/ghost-{index}/infer", body).status == 404
        assert http_request(server, "POST", f"/v2/models/mlp/versions/{1000 + index}/infer", body).status == 404
    after = scrape(server)
    assert "ghost-" not in after and 'version="1000"' not in after
    assert len(after.splitlines()) <= len(before.splitlines()) + 2  # at most the two outcomes' new lines

    def grew(outcome: str) -> float:
        name = "inferd_unresolved_requests_total"
        labels = {"protocol": "kserve_http", "outcome": outcome}
        return sample(after, name, **labels) - sample(before, name, missing=0.0, **labels)

    assert grew("MODEL_NOT_FOUND") == 200
    assert grew("VERSION_NOT_FOUND") == 200

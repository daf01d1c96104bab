"""Endpoints through the public interface: `/v2/endpoints` over HTTP, requests to an endpoint by
every client, weights, pins and sticky keys, and endpoints kept across a restart (--state-dir)."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc
from inferd.testing.models import add_sub_model, mlp_model, write_config
from inferd.testing.server import ServerProcess, free_port, run_server
from tests.e2e.conftest import http_request
from tests.e2e.test_observability import scrape
from tests.e2e.test_perf_analyzer import PERF_ANALYZER
from tests.e2e.test_remote_repository import BUCKET
from tests.e2e.test_remote_repository import s3 as s3  # the fixture
from tests.e2e.test_sagemaker import runtime

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}).encode()
CANARY = {
    "variants": [
        {"name": "blue", "model": "m", "version": "1", "weight": 90},
        {"name": "green", "model": "m", "version": "2", "weight": 10},
    ]
}


def build_repository(root: Path) -> Path:
    """`m` in two versions of one signature (other weights), `other` of another signature."""
    for version, seed in (("1", 1), ("2", 2)):
        (root / "m" / version).mkdir(parents=True)
        mlp_model(root / "m" / version / "model.onnx", seed=seed)
    write_config(root / "m", "max_batch_size: 8\nversion_policy: { all { } }")
    (root / "other" / "1").mkdir(parents=True)
    add_sub_model(root / "other" / "1" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("endpoints") / "repository")


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def tfserving_grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(
    repository: Path, state_dir: Path, tfserving_grpc_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "server.log"
    arguments = ("--model-control-mode", "explicit", "--load-model", "*", "--state-dir", str(state_dir),
                 "--tfserving-grpc-port", str(tfserving_grpc_port))  # fmt: skip
    with run_server(repository, log, *arguments) as server:
        yield server


def put(server: ServerProcess, name: str, document: object) -> tuple[int, dict[str, object]]:
    reply = http_request(server, "PUT", f"/v2/endpoints/{name}", json.dumps(document).encode())
    return reply.status, json.loads(reply.body or b"{}")


class Caller:
    """Requests on one kept-alive connection: a few thousand of them stay cheap for the client."""

    def __init__(self, server: ServerProcess) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)

    def infer(self, endpoint: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """Status and the variant the answer names."""
        self._connection.request("POST", f"/v2/models/{endpoint}/infer", BODY, headers or {})
        response = self._connection.getresponse()
        response.read()
        return response.status, response.getheader("inferd-variant") or ""

    def close(self) -> None:
        self._connection.close()


@pytest.fixture
def caller(server: ServerProcess) -> Iterator[Caller]:
    caller = Caller(server)
    yield caller
    caller.close()


def test_an_endpoint_is_set_read_listed_and_deleted(server: ServerProcess) -> None:
    status, body = put(server, "crud", CANARY)
    assert status == 201, body
    assert [(v["name"], v["weight"]) for v in body["variants"]] == [("blue", 90.0), ("green", 10.0)]  # type: ignore[index]
    status, body = put(server, "crud", {"variants": [{"name": "blue", "model": "m", "version": "1"}]})
    assert status == 200 and len(body["variants"]) == 1  # type: ignore[arg-type]
    listed = json.loads(http_request(server, "GET", "/v2/endpoints").body)
    assert "crud" in [e["name"] for e in listed["endpoints"]]
    assert http_request(server, "DELETE", "/v2/endpoints/crud").status == 200
    reply = http_request(server, "GET", "/v2/endpoints/crud")
    assert reply.status == 404 and b"PUT /v2/endpoints/crud sets it" in reply.body


@pytest.mark.parametrize(
    ("name", "document", "status", "says"),
    [
        ("m", CANARY, 409, "is a model's name"),
        ("bad", {"variants": [{"name": "a", "model": "m", "version": "1"}, {"name": "b", "model": "other"}]}, 400,
         "does not take what variant 'a' (m) takes: it has no input 'x'"),
        ("bad", {"variants": [{"name": "a", "model": "nope"}]}, 400, "model 'nope' does not serve"),
        ("bad", {"variants": [{"name": "a", "model": "m", "weigth": 3}]}, 400, "variants.0.weigth: Extra inputs"),
        ("bad", {"variants": [{"name": "a", "model": "m", "weight": "ten"}]}, 400, "variants.0.weight"),
        ("bad", {"variants": []}, 400, "has no variants"),
        ("bad", [], 400, "Input should be"),
    ],
)  # fmt: skip
def test_an_endpoint_that_could_not_serve_is_refused_saying_why(
    server: ServerProcess, name: str, document: object, status: int, says: str
) -> None:
    reply = http_request(server, "PUT", f"/v2/endpoints/{name}", json.dumps(document).encode())
    assert reply.status == status, reply.body
    assert says in json.loads(reply.body)["error"]
    assert http_request(server, "GET", "/v2/endpoints/bad").status == 404


def test_a_model_cannot_be_loaded_under_an_endpoints_name(server: ServerProcess) -> None:
    assert put(server, "taken", CANARY)[0] == 201
    reply = http_request(server, "POST", "/v2/repository/models/taken/load")
    assert reply.status == 409 and b"is an endpoint's name" in reply.body


def test_weights_split_requests_and_every_answer_names_its_variant(server: ServerProcess, caller: Caller) -> None:
    assert put(server, "split", CANARY)[0] == 201
    answers = Counter(caller.infer("split") for _ in range(5000))
    assert set(answers) == {(200, "blue"), (200, "green")}
    assert abs(answers[(200, "green")] / 5000 - 0.10) <= 0.02, answers
    body = json.loads(http_request(server, "GET", "/v2/endpoints/split").body)
    counted = {
        v["name"]: (v["requests_total"], v["last_minute"]["requests"], v["errors_total"]) for v in body["variants"]
    }
    assert counted == {
        "blue": (answers[(200, "blue")],) * 2 + (0,),
        "green": (answers[(200, "green")],) * 2 + (0,),
    }
    assert all(v["last_minute"]["p99_ms"] > 0 for v in body["variants"])


def test_a_pinned_variant_is_served_and_an_unknown_one_is_a_400(server: ServerProcess, caller: Caller) -> None:
    assert put(server, "pin", CANARY)[0] == 201
    for header in ("Inferd-Target-Variant", "X-Amzn-SageMaker-Target-Variant"):
        assert {caller.infer("pin", {header: "green"}) for _ in range(20)} == {(200, "green")}
    reply = http_request(server, "POST", "/v2/models/pin/infer", BODY, {"Inferd-Target-Variant": "purple"})
    assert reply.status == 400 and b"has no variant 'purple' (its variants: blue, green)" in reply.body
    versioned = http_request(server, "POST", "/v2/models/pin/versions/1/infer", BODY)
    assert versioned.status == 400 and b"it has variants, not versions" in versioned.body


def test_an_endpoint_answers_as_a_model_to_tritonclient_over_http_and_grpc(server: ServerProcess) -> None:
    assert put(server, "clients", CANARY)[0] == 201
    x = np.full((1, 16), 0.5, dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.is_model_ready("clients")
        metadata = client.get_model_metadata("clients")
        assert metadata["name"] == "clients" and [i["name"] for i in metadata["inputs"]] == ["x"]
        assert client.get_model_config("clients")["max_batch_size"] == 8
        tensor = httpclient.InferInput("x", [1, 16], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("clients", [tensor], headers={"Inferd-Target-Variant": "green"})
        assert result.as_numpy("y").shape == (1, 4)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("x", [1, 16], "FP32")
        tensor.set_data_from_numpy(x)
        pinned = grpc.infer("clients", [tensor], headers={"inferd-target-variant": "green"})
        # The same answer as the green version's own.
        direct = grpc.infer("m", [tensor], model_version="2")
        np.testing.assert_array_equal(pinned.as_numpy("y"), direct.as_numpy("y"))
    finally:
        grpc.close()


def test_endpoint_metrics_carry_the_endpoint_and_variant(server: ServerProcess, caller: Caller) -> None:
    assert put(server, "counted", CANARY)[0] == 201
    for _ in range(10):
        caller.infer("counted")
    caller.infer("counted", {"Inferd-Target-Variant": "green"})
    text = scrape(server)
    series = 'inferd_endpoint_requests_total{endpoint="counted",outcome="success",routed="%s",variant="%s"} %s'
    assert series % ("weight", "blue", "9.0") in text
    assert series % ("weight", "green", "1.0") in text
    assert series % ("pinned", "green", "1.0") in text  # counted apart: a rollout judges the routed ones
    histogram = 'inferd_endpoint_request_duration_seconds_count{endpoint="counted",routed="%s",variant="green"} 1.0'
    assert histogram % "weight" in text and histogram % "pinned" in text


def test_sticky_keys_keep_their_variant_across_requests_and_a_restart_and_move_only_to_a_gaining_variant(
    repository: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    arguments = ("--state-dir", str(state))
    sticky = {**CANARY, "sticky": "X-User-Id"}
    keys = [f"user-{i}" for i in range(1000)]

    def variants(server: ServerProcess, repeats: int) -> dict[str, str]:
        caller = Caller(server)
        try:
            seen: dict[str, set[str]] = {key: set() for key in keys}
            for _ in range(repeats):
                for key in keys:
                    status, variant = caller.infer("sticky", {"X-User-Id": key})
                    assert status == 200
                    seen[key].add(variant)
        finally:
            caller.close()
        assert all(len(found) == 1 for found in seen.values()), "a key reached two variants"
        return {key: found.pop() for key, found in seen.items()}

    with run_server(repository, tmp_path / "first.log", *arguments) as server:
        assert put(server, "sticky", sticky)[0] == 201
        first = variants(server, 20)
    assert abs(Counter(first.values())["green"] / len(keys) - 0.10) < 0.04
    with run_server(repository, tmp_path / "second.log", *arguments) as server:
        assert "endpoints restored from" in server.log()
        assert variants(server, 1) == first
        blue, green = CANARY["variants"]
        raised = {**sticky, "variants": [{**blue, "weight": 80}, {**green, "weight": 20}]}
        assert put(server, "sticky", raised)[0] == 200
        second = variants(server, 1)
    moved = {(first[key], second[key]) for key in keys if first[key] != second[key]}
    assert moved == {("blue", "green")}


def test_boto3_invokes_an_endpoint_by_name_and_pins_a_variant_with_target_variant(
    repository: Path, tmp_path: Path
) -> None:
    with run_server(repository, tmp_path / "sagemaker.log", "--sagemaker") as server:
        assert put(server, "shop", CANARY)[0] == 201
        client = runtime(server)
        answers = Counter(
            client.invoke_endpoint(EndpointName="shop", Body=BODY, ContentType="application/json")[
                "InvokedProductionVariant"
            ]
            for _ in range(50)
        )
        assert answers == {"blue": 45, "green": 5}
        pinned = client.invoke_endpoint(
            EndpointName="shop", Body=BODY, ContentType="application/json", TargetVariant="green"
        )
        assert pinned["InvokedProductionVariant"] == "green"
        outputs = json.loads(pinned["Body"].read())["outputs"]
        assert [o["name"] for o in outputs] == ["y"]


def test_a_file_declares_the_endpoints_and_is_followed(repository: Path, tmp_path: Path) -> None:
    declared = tmp_path / "endpoints.yaml"
    declared.write_text(
        "endpoints:\n"
        "  shop:\n"
        "    variants:\n"
        "      - {name: blue, model: m, version: 1, weight: 90}\n"
        "      - {name: green, model: m, version: 2, weight: 10}\n"
    )
    arguments = ("--endpoints", str(declared), "--repository-poll-secs", "0.2")
    with run_server(repository, tmp_path / "server.log", *arguments) as server:
        assert "endpoints declared by" in server.log()

        def weights() -> dict[str, float]:
            body = json.loads(http_request(server, "GET", "/v2/endpoints/shop").body)
            return {v["name"]: v["weight"] for v in body["variants"]}

        assert weights() == {"blue": 90.0, "green": 10.0}
        refused = http_request(server, "PUT", "/v2/endpoints/shop", json.dumps(CANARY).encode())
        assert refused.status == 409 and b"declared by a file" in refused.body
        rollout = http_request(server, "POST", "/v2/endpoints/shop/rollout", b'{"to": "green"}')
        assert rollout.status == 409
        declared.write_text(
            declared.read_text().replace("weight: 90", "weight: 50").replace("weight: 10", "weight: 50")
        )
        deadline = time.monotonic() + 30
        while weights() != {"blue": 50.0, "green": 50.0}:
            assert time.monotonic() < deadline, "the file's change was never followed"
            time.sleep(0.05)
        declared.write_text("endpoints: [not, a, mapping]\n")  # a bad reading changes nothing
        deadline = time.monotonic() + 30
        while "the endpoints stay as they were" not in server.log():  # read (and refused) by now
            assert time.monotonic() < deadline, "the bad file was never read"
            time.sleep(0.05)
        assert weights() == {"blue": 50.0, "green": 50.0}


def test_a_file_on_s3_declares_the_endpoints_and_is_followed(repository: Path, s3: Any, tmp_path: Path) -> None:
    """`--endpoints s3://...` through moto's S3 server: read at the start, and followed."""
    document = "endpoints:\n  shop:\n    variants:\n      - {name: blue, model: m, version: 1, weight: %d}\n" + (
        "      - {name: green, model: m, version: 2, weight: %d}\n"
    )
    s3.put_object(Bucket=BUCKET, Key="serving/endpoints.yaml", Body=(document % (90, 10)).encode())
    arguments = ("--endpoints", f"s3://{BUCKET}/serving/endpoints.yaml", "--repository-poll-secs", "0.2")
    with run_server(repository, tmp_path / "server.log", *arguments) as server:

        def weights() -> dict[str, float]:
            body = json.loads(http_request(server, "GET", "/v2/endpoints/shop").body)
            return {v["name"]: v["weight"] for v in body["variants"]}

        assert weights() == {"blue": 90.0, "green": 10.0}
        reply = http_request(server, "POST", "/v2/models/shop/infer", BODY, {"Inferd-Target-Variant": "green"})
        assert reply.status == 200 and reply.headers["inferd-variant"] == "green"
        s3.put_object(Bucket=BUCKET, Key="serving/endpoints.yaml", Body=(document % (30, 70)).encode())
        deadline = time.monotonic() + 30
        while weights() != {"blue": 30.0, "green": 70.0}:
            assert time.monotonic() < deadline, "the object's change was never followed"
            time.sleep(0.05)


def test_a_file_that_cannot_be_read_stops_the_start(repository: Path, tmp_path: Path) -> None:
    declared = tmp_path / "endpoints.yaml"
    declared.write_text("endpoints:\n  shop:\n    variants: [{name: a, model: m, weigth: 1}]\n")
    run = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository), "--http-port", "0",
         "--grpc-port", "0", "--metrics-port", "0", "--endpoints", str(declared)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert "not starting: --endpoints" in run.stderr + run.stdout and "variants.0.weigth" in run.stderr + run.stdout


def test_the_endpoints_api_asks_for_a_management_token(repository: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("admin-token\n")
    with run_server(repository, tmp_path / "server.log", "--management-tokens-file", str(tokens)) as server:
        body = json.dumps(CANARY).encode()
        assert http_request(server, "PUT", "/v2/endpoints/shop", body).status == 401
        assert http_request(server, "GET", "/v2/endpoints").status == 401
        admin = {"Authorization": "Bearer admin-token"}
        assert http_request(server, "PUT", "/v2/endpoints/shop", body, admin).status == 201
        assert http_request(server, "POST", "/v2/endpoints/shop/rollout", b'{"to": "green"}').status == 401
        # Calling the endpoint is inference: open, as the server's models are.
        assert http_request(server, "POST", "/v2/models/shop/infer", BODY).status == 200


@pytest.mark.perf_analyzer
def test_perf_analyzer_drives_an_endpoint_over_http_and_grpc(server: ServerProcess) -> None:
    assert put(server, "measured", CANARY)[0] == 201
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        completed = subprocess.run(
            [str(PERF_ANALYZER), "-m", "measured", "-u", url, "-i", protocol, "--concurrency-range", "2",
             "--measurement-interval", "1000", "--max-trials", "10", "--stability-percentage", "500"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0 and "error" not in output.lower(), output
        assert re.search(r"Throughput: [1-9][\d.]* infer/sec", output), output
    body = json.loads(http_request(server, "GET", "/v2/endpoints/measured").body)
    assert all(v["requests_total"] > 0 for v in body["variants"])


def test_the_other_doors_serve_an_endpoint_and_grpc_names_the_variant(
    server: ServerProcess, tfserving_grpc_port: int
) -> None:
    assert put(server, "doors", CANARY)[0] == 201
    # TorchServe's inference API: a JSON object naming the inputs.
    reply = http_request(
        server, "POST", "/predictions/doors", json.dumps({"x": [[0.5] * 16]}).encode(),
        {"Content-Type": "application/json", "Inferd-Target-Variant": "blue"},
    )  # fmt: skip
    assert reply.status == 200 and reply.headers["inferd-variant"] == "blue", reply.body
    assert np.asarray(json.loads(reply.body)).shape == (1, 4)
    # TF Serving's gRPC API: the endpoint in model_spec.name, the variant in the trailing metadata.
    predict = serving_pb.PredictRequest()
    predict.model_spec.name = "doors"
    proto = predict.inputs["x"]
    proto.dtype = tf_pb.DT_FLOAT
    proto.tensor_shape.dim.extend(tf_pb.TensorShapeProto.Dim(size=s) for s in (1, 16))
    proto.float_val.extend([0.5] * 16)
    with grpc.insecure_channel(f"127.0.0.1:{tfserving_grpc_port}") as channel:
        stub = serving_grpc.PredictionServiceStub(channel)
        answer, call = stub.Predict.with_call(predict, metadata=(("inferd-target-variant", "green"),), timeout=30)
        assert dict(call.trailing_metadata())["inferd-variant"] == "green"
        assert list(answer.outputs["y"].tensor_shape.dim) == [tf_pb.TensorShapeProto.Dim(size=s) for s in (1, 4)]
    # TF Serving's REST API: the endpoint is a model name there too.
    reply = http_request(
        server, "POST", "/v1/models/doors:predict", json.dumps({"instances": [[0.5] * 16]}).encode(),
        {"Inferd-Target-Variant": "green"},
    )  # fmt: skip
    assert reply.status == 200 and reply.headers["inferd-variant"] == "green", reply.body
    assert len(json.loads(reply.body)["predictions"][0]) == 4
    # gRPC: the variant in the trailing metadata, of an answer and of an error alike.
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="doors")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    tensor.contents.fp32_contents.extend([0.5] * 16)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelInfer.with_call(request, metadata=(("inferd-target-variant", "blue"),), timeout=30)
        assert dict(call.trailing_metadata())["inferd-variant"] == "blue"
        bad = service_pb2.ModelInferRequest(model_name="doors")
        bad.inputs.add(name="x", datatype="FP32", shape=[1, 3]).contents.fp32_contents.extend([0.5] * 3)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(bad, metadata=(("inferd-target-variant", "green"),), timeout=30)
        assert dict(refused.value.trailing_metadata())["inferd-variant"] == "green"

"""The SageMaker hosting contract, through boto3's `sagemaker-runtime` `invoke_endpoint` pointed at a
real `inferd serve --sagemaker` (endpoint_url), and plain HTTP for /ping, the multi-model endpoint
routes and the content types."""

from __future__ import annotations

import io
import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import orjson
import pytest
from botocore.config import Config
from click.testing import CliRunner

from inferd.cli.serve import sagemaker_ports
from inferd.protocol import sagemaker
from inferd.testing.models import add_sub_model, mlp_model, write_config
from inferd.testing.server import ServerProcess, run_server
from inferd.tools.ports import free_ports
from tests.e2e.conftest import http_request
from tests.e2e.test_observability import grew, scrape

pytestmark = pytest.mark.e2e

ROWS = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the platform puts models for a multi-model endpoint: <root>/<hash>/model/<name>/..."""
    root = tmp_path_factory.mktemp("opt-ml-models")
    mlp_model(root / "a1b2c3" / "model" / "mlp" / "1" / "model.onnx", seed=7)
    write_config(root / "a1b2c3" / "model" / "mlp", "max_batch_size: 8")
    mlp_model(root / "d4e5f6" / "model" / "1" / "model.onnx", seed=8)  # the url is the model folder itself
    return root


@pytest.fixture(scope="module")
def sagemaker_server(tmp_path_factory: pytest.TempPathFactory, model_root: Path) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("opt-ml-model")
    mlp_model(repository / "mlp" / "1" / "model.onnx", seed=3)
    write_config(repository / "mlp", "max_batch_size: 8")
    add_sub_model(repository / "add_sub" / "1" / "model.onnx")
    http_port, grpc_port, metrics_port = free_ports(3)
    ports = (http_port, grpc_port, metrics_port)
    env = {"SAGEMAKER_BIND_TO_PORT": str(ports[0]), "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "mlp"}
    logs = tmp_path_factory.mktemp("logs") / "server.log"
    args = ("--sagemaker", "--sagemaker-model-root", str(model_root), "--max-request-bytes", "1000000")
    with run_server(repository, logs, *args, ports=ports, env=env) as server:
        yield server


def runtime(server: ServerProcess):  # type: ignore[no-untyped-def]
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=f"http://{server.http_url}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 1}),
    )


def v2_body(rows: np.ndarray) -> bytes:
    return orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(rows.shape), "data": rows.ravel().tolist()}]}
    )


def reference(server: ServerProcess, model: str, rows: np.ndarray) -> np.ndarray:
    reply = http_request(server, "POST", f"/v2/models/{model}/infer", v2_body(rows))
    output = orjson.loads(reply.body)["outputs"][0]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def test_boto3_invoke_endpoint_with_v2_and_tf_serving_bodies(sagemaker_server: ServerProcess) -> None:
    want = reference(sagemaker_server, "mlp", ROWS)
    client = runtime(sagemaker_server)
    v2 = client.invoke_endpoint(EndpointName="local", Body=v2_body(ROWS), ContentType="application/json")
    assert v2["ContentType"] == "application/json"
    document = orjson.loads(v2["Body"].read())
    assert document["model_name"] == "mlp"  # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
    np.testing.assert_allclose(np.array(document["outputs"][0]["data"]).reshape(2, 4), want, rtol=1e-6)
    tf = client.invoke_endpoint(
        EndpointName="local", Body=orjson.dumps({"instances": ROWS.tolist()}), ContentType="application/json"
    )
    np.testing.assert_allclose(orjson.loads(tf["Body"].read())["predictions"], want, rtol=1e-6)
    other = client.invoke_endpoint(
        EndpointName="local",
        Body=orjson.dumps({"inputs": {"INPUT0": ROWS.tolist(), "INPUT1": ROWS.tolist()}}),
        ContentType="application/json",
        TargetModel="add_sub",
    )
    outputs = orjson.loads(other["Body"].read())["outputs"]
    np.testing.assert_allclose(outputs["OUTPUT0"], ROWS * 2, rtol=1e-6)


def test_nan_and_infinities_in_json_bodies_as_the_tensorflow_container_reads_them(
    sagemaker_server: ServerProcess,
) -> None:
    # SageMaker's TensorFlow container hands JSON to TF Serving's REST API, which reads and writes NaN,
    # Infinity and -Infinity; Python's json (what a boto3 user serializes with) writes and reads them.
    a = [[float("nan"), float("inf"), 1.0] + [0.0] * 13]
    b = [[1.0, float("inf"), -float("inf")] + [0.0] * 13]
    reply = runtime(sagemaker_server).invoke_endpoint(
        EndpointName="local",
        Body=json.dumps({"inputs": {"INPUT0": a, "INPUT1": b}}),
        ContentType="application/json",
        TargetModel="add_sub",
    )
    body = reply["Body"].read()
    assert b'"OUTPUT0":[[NaN,Infinity,-Infinity,0.0' in body and b'"OUTPUT1":[[NaN,NaN,Infinity,0.0' in body
    outputs = json.loads(body)["outputs"]
    np.testing.assert_array_equal(outputs["OUTPUT0"], np.add(a, b))


def test_numpy_and_csv_bodies_and_answers(sagemaker_server: ServerProcess) -> None:
    want = reference(sagemaker_server, "mlp", ROWS)
    buffer = io.BytesIO()
    np.save(buffer, ROWS.astype(np.float64))  # NumPy's default type: read as the model's FP32
    reply = http_request(
        sagemaker_server,
        "POST",
        "/invocations",
        buffer.getvalue(),
        {"Content-Type": "application/x-npy", "Accept": "application/x-npy"},
    )
    assert reply.status == 200 and reply.headers["content-type"] == "application/x-npy"
    np.testing.assert_allclose(np.load(io.BytesIO(reply.body)), want, rtol=1e-6)
    csv = "\n".join(",".join(repr(float(v)) for v in row) for row in ROWS).encode()
    as_csv = http_request(
        sagemaker_server, "POST", "/invocations", csv, {"Content-Type": "text/csv", "Accept": "text/csv"}
    )
    assert as_csv.status == 200 and as_csv.headers["content-type"] == "text/csv"
    np.testing.assert_allclose(np.loadtxt(io.StringIO(as_csv.body.decode()), delimiter=","), want, rtol=1e-5)
    as_json = http_request(sagemaker_server, "POST", "/invocations", csv, {"Content-Type": "text/csv"})
    np.testing.assert_allclose(orjson.loads(as_json.body)["predictions"], want, rtol=1e-5)


def test_content_type_and_accept_errors(sagemaker_server: ServerProcess) -> None:
    def post(body: bytes, headers: dict[str, str]) -> int:
        return http_request(sagemaker_server, "POST", "/invocations", body, headers).status

    assert post(b"x", {"Content-Type": "image/png"}) == 415
    assert post(v2_body(ROWS), {"Content-Type": "application/json", "Accept": "image/png"}) == 406
    assert post(b"not npy", {"Content-Type": "application/x-npy"}) == 400
    assert post(b"1,2\n3", {"Content-Type": "text/csv"}) == 400
    # "¹".isdigit() is True but int("¹") raises: that json-header-size was a 500 (beside the version
    # benchmarks/fuzz.py found so).
    binary = f"{sagemaker.TRITON_BINARY};{sagemaker.HEADER_SIZE_PARAMETER}=\u00b9"  # sent as Latin-1: b"\xb9"
    reply = http_request(sagemaker_server, "POST", "/invocations", v2_body(ROWS), {"Content-Type": binary})
    assert reply.status == 400 and orjson.loads(reply.body)["code"] == "INVALID_ARGUMENT", reply.body
    # An empty CSV body held no rows: numpy warned into the log and the model got an empty batch.
    empty = http_request(sagemaker_server, "POST", "/invocations", b"\n", {"Content-Type": "text/csv"})
    assert empty.status == 400 and b"no rows" in empty.body
    assert post(b"{}", {"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": "ghost"}) == 404
    # add_sub has two inputs: one array cannot feed it.
    buffer = io.BytesIO()
    np.save(buffer, ROWS)
    reply = http_request(
        sagemaker_server,
        "POST",
        "/invocations",
        buffer.getvalue(),
        {"Content-Type": "application/x-npy", "X-Amzn-SageMaker-Target-Model": "add_sub"},
    )
    assert reply.status == 400 and b"2 inputs" in reply.body


def test_ping(sagemaker_server: ServerProcess) -> None:
    reply = http_request(sagemaker_server, "GET", "/ping")
    assert reply.status == 200 and orjson.loads(reply.body) == {"status": "Healthy"}


def test_multi_model_endpoint_lifecycle(sagemaker_server: ServerProcess, model_root: Path) -> None:
    def call(method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        reply = http_request(sagemaker_server, method, path, orjson.dumps(body) if body is not None else None)
        return reply.status, reply.body

    url_a, url_b = str(model_root / "a1b2c3" / "model"), str(model_root / "d4e5f6" / "model")
    assert call("POST", "/models", {"model_name": "a1b2c3", "url": url_a})[0] == 200
    assert call("POST", "/models", {"model_name": "d4e5f6", "url": url_b})[0] == 200
    assert call("POST", "/models", {"model_name": "a1b2c3", "url": url_a})[0] == 409
    status, listing = call("GET", "/models")
    assert status == 200
    assert orjson.loads(listing) == {
        "models": [
            {"modelName": "a1b2c3", "modelUrl": str(Path(url_a).resolve() / "mlp")},
            {"modelName": "d4e5f6", "modelUrl": str(Path(url_b).resolve())},
        ]
    }
    assert orjson.loads(call("GET", "/models/d4e5f6")[1])["modelName"] == "d4e5f6"
    # Invoked by the platform's route, and by boto3 with TargetModel: the two models differ (seeds 7, 8).
    status, body = call("POST", "/models/a1b2c3/invoke", {"instances": ROWS.tolist()})
    assert status == 200
    by_route = np.array(orjson.loads(body)["predictions"])
    client = runtime(sagemaker_server)
    by_boto = client.invoke_endpoint(
        EndpointName="mme",
        TargetModel="a1b2c3",
        Body=orjson.dumps({"instances": ROWS.tolist()}),
        ContentType="application/json",
    )
    np.testing.assert_allclose(orjson.loads(by_boto["Body"].read())["predictions"], by_route, rtol=1e-6)
    other = np.array(
        orjson.loads(call("POST", "/models/d4e5f6/invoke", {"instances": ROWS.tolist()})[1])["predictions"]
    )
    assert not np.allclose(by_route, other)
    assert call("DELETE", "/models/a1b2c3")[0] == 200
    assert call("DELETE", "/models/a1b2c3")[0] == 404
    assert call("POST", "/models/a1b2c3/invoke", {"instances": ROWS.tolist()})[0] == 404
    assert call("GET", "/models/a1b2c3")[0] == 404
    assert [m["modelName"] for m in orjson.loads(call("GET", "/models")[1])["models"]] == ["d4e5f6"]
    assert call("DELETE", "/models/d4e5f6")[0] == 200


def test_model_urls_must_stay_under_the_model_root(
    sagemaker_server: ServerProcess, model_root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    shutil.copytree(model_root / "d4e5f6", outside)
    for url in (str(outside / "model"), str(model_root / ".." / outside.name), "/etc", str(model_root / "nope")):
        reply = http_request(sagemaker_server, "POST", "/models", orjson.dumps({"model_name": "x", "url": url}))
        assert reply.status == 400, (url, reply.body)
    (model_root / "linked").symlink_to(outside, target_is_directory=True)
    reply = http_request(
        sagemaker_server,
        "POST",
        "/models",
        orjson.dumps({"model_name": "x", "url": str(model_root / "linked" / "model")}),
    )
    assert reply.status == 400 and b"not under the model root" in reply.body
    assert http_request(sagemaker_server, "POST", "/models", b'{"url": 3}').status == 400
    # Found by schemathesis (tests/e2e/test_openapi.py): these were 500s (ValueError, OSError).
    for url in (str(model_root / "a\0b"), str(model_root / ("x" * 300))):
        reply = http_request(sagemaker_server, "POST", "/models", orjson.dumps({"model_name": "x", "url": url}))
        assert reply.status == 400 and orjson.loads(reply.body)["code"] == "LOAD_REQUEST_FAILED", reply.body
    assert (
        http_request(
            sagemaker_server,
            "POST",
            "/models",
            orjson.dumps({"model_name": "mlp", "url": str(model_root / "d4e5f6" / "model")}),
        ).status
        == 400
    )


def test_model_names_must_be_one_plain_folder_name(sagemaker_server: ServerProcess, model_root: Path) -> None:
    url = str(model_root / "d4e5f6" / "model")
    for name in ("..", ".", "a/b", "a\\b", "a\0b", "a\nb", "x" * 5000, ".hidden"):
        reply = http_request(sagemaker_server, "POST", "/models", orjson.dumps({"model_name": name, "url": url}))
        assert reply.status == 400, (name[:20], reply.status, reply.body[:200])
        error = orjson.loads(reply.body)
        assert error["code"] == "INVALID_ARGUMENT" and "is not one folder name" in error["error"], error
        assert len(error["error"]) < 400  # a 5,000-character name is not echoed whole
    # Nothing was loaded under any of them, by either API.
    assert orjson.loads(http_request(sagemaker_server, "GET", "/models").body) == {"models": []}
    index = orjson.loads(http_request(sagemaker_server, "POST", "/v2/repository/index", b"{}").body)
    assert sorted(entry["name"] for entry in index) == ["add_sub", "mlp"]
    # A name at the file system's limit is a name.
    longest = "m" * 255
    assert (
        http_request(sagemaker_server, "POST", "/models", orjson.dumps({"model_name": longest, "url": url})).status
        == 200
    )
    assert http_request(sagemaker_server, "DELETE", f"/models/{longest}").status == 200


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory: pytest.TempPathFactory, model_root: Path) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("capped-repository")
    logs = tmp_path_factory.mktemp("capped-logs") / "server.log"
    ports = free_ports(3)
    env = {"SAGEMAKER_BIND_TO_PORT": str(ports[0]), "INFERD_SAGEMAKER_MAX_MODELS": "2"}
    args = ("--sagemaker", "--sagemaker-model-root", str(model_root))
    with run_server(repository, logs, *args, ports=(ports[0], ports[1], ports[2]), env=env) as server:
        yield server


def test_models_loaded_from_folders_are_bounded(capped_server: ServerProcess, model_root: Path) -> None:
    def load(name: str) -> tuple[int, dict]:
        body = orjson.dumps({"model_name": name, "url": str(model_root / "d4e5f6" / "model")})
        reply = http_request(capped_server, "POST", "/models", body)
        return reply.status, orjson.loads(reply.body) if reply.body else {}

    assert load("one")[0] == 200 and load("two")[0] == 200
    status, error = load("three")
    # SageMaker's contract: 507 when a model cannot be loaded for want of resources; the platform
    # then unloads a model it no longer uses and tries again.
    assert status == 507 and error["code"] == "TOO_MANY_MODELS", error
    assert "2 models loaded from folders" in error["error"]
    assert load("two")[0] == 409  # a name loaded already is still that, not a 507
    assert [m["modelName"] for m in orjson.loads(http_request(capped_server, "GET", "/models").body)["models"]] == [
        "one",
        "two",
    ]
    assert http_request(capped_server, "DELETE", "/models/one").status == 200
    assert load("three")[0] == 200
    assert (
        http_request(capped_server, "POST", "/models/three/invoke", orjson.dumps({"instances": ROWS.tolist()})).status
        == 200
    )


def test_boto3_path_counts_under_the_sagemaker_door(sagemaker_server: ServerProcess) -> None:
    before = scrape(sagemaker_server)
    runtime(sagemaker_server).invoke_endpoint(EndpointName="local", Body=v2_body(ROWS), ContentType="application/json")
    labels = {"model": "mlp", "protocol": "sagemaker", "outcome": "success"}
    after = scrape(sagemaker_server)
    assert grew(before, after, "inferd_requests_total", **labels) == 1


def test_safe_port_range_moves_the_other_listeners(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEMAKER_BIND_TO_PORT", "31000")
    monkeypatch.setenv("SAGEMAKER_SAFE_PORT_RANGE", "31000-31010")
    assert sagemaker_ports({"grpc_port": 8001, "metrics_port": 31005}) == {
        "http_port": 31000,
        "grpc_port": 31001,
        "metrics_port": 31005,
    }
    monkeypatch.setenv("SAGEMAKER_SAFE_PORT_RANGE", "31000-31000")
    from inferd.cli.main import cli

    result = CliRunner().invoke(cli, ["serve", "--sagemaker", "--model-repository", "."])
    assert result.exit_code == 2 and "no port left" in result.output


def test_an_explicit_http_port_is_kept_and_sagemaker_bind_to_port_wins_over_it(tmp_path: Path) -> None:
    """`--sagemaker --http-port N` listens on N (it silently bound 8080); SageMaker's own
    SAGEMAKER_BIND_TO_PORT wins over both, as the platform calls the container there."""
    repository = tmp_path / "models"
    mlp_model(repository / "mlp" / "1" / "model.onnx", seed=3)
    given, bound, grpc_port, metrics_port = free_ports(4)
    # run_server passes --http-port: with no SAGEMAKER_BIND_TO_PORT, readiness is polled there.
    with run_server(
        repository, tmp_path / "given.log", "--sagemaker", ports=(given, grpc_port, metrics_port)
    ) as server:
        assert http_request(server, "GET", "/ping").status == 200
    env = {"SAGEMAKER_BIND_TO_PORT": str(bound)}
    args = ("--sagemaker", "--http-port", str(given))  # the last --http-port wins: `given`, not `bound`
    with run_server(
        repository, tmp_path / "bound.log", *args, ports=(bound, grpc_port, metrics_port), env=env
    ) as server:
        assert http_request(server, "GET", "/ping").status == 200
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", given), timeout=5).close()


def test_arrays_of_types_inferd_does_not_serve_are_a_400(sagemaker_server: ServerProcess) -> None:
    for array in (np.ones((1, 16), dtype=np.complex64), np.zeros((1, 16), dtype="datetime64[s]")):
        reply = http_request(
            sagemaker_server, "POST", "/invocations", _npy(array), {"Content-Type": "application/x-npy"}
        )
        assert reply.status == 400, reply.body


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()

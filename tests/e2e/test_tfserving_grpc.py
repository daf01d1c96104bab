"""TF Serving's gRPC API, called with TF Serving's official client (tensorflow-serving-api and
tensorflow's make_tensor_proto / make_ndarray, in their own venv) against `inferd serve
--tfserving-grpc-port`: every dtype inferd serves round-trips, answers match the v2 door's."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferd.testing.server import ServerProcess, free_port, run_server
from tests.e2e.conftest import http_request
from tests.e2e.test_observability import grew, scrape

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ROWS = np.random.default_rng(9).standard_normal((3, 16)).astype(np.float32)
# inferd's datatypes as numpy names; TF's client sends each as its own dtype.
DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",  # TF's half_val, each value's 16 bits
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
]


@pytest.fixture(scope="module")
def tf_python() -> str:
    """The official client's venv, built once (behind a stamp) by the script `make test` runs."""
    completed = subprocess.run(
        [str(ROOT / "scripts" / "install_tfserving_client.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
        check=True,
    )
    return completed.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def tf_server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    logs = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(repository, logs, "--tfserving-grpc-port", str(port)) as server:
        yield server, port


def official(tf_python: str, port: int, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    completed = subprocess.run(
        [tf_python, str(Path(__file__).with_name("tfserving_client.py")), f"127.0.0.1:{port}"],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


def sample_of(dtype: str) -> np.ndarray:
    if dtype == "bool":
        return np.array([[True, False, True], [False, True, True]])
    if "float" in dtype:  # bfloat16 too: ml_dtypes gives numpy its name
        return np.random.default_rng(1).standard_normal((2, 3)).astype(dtype)
    info = np.iinfo(dtype)
    return np.array([[info.min, info.max, 0], [1, info.max - 1, info.min + 1]], dtype=dtype)


def test_every_dtype_round_trips(tf_python: str, tf_server: tuple[ServerProcess, int]) -> None:
    _, port = tf_server
    calls: list[dict[str, Any]] = [
        {
            "call": "predict",
            "model": "identity_bf16" if d == "bfloat16" else f"identity_{'fp' + d[5:] if d.startswith('float') else d}",
            "inputs": {"INPUT0": {"dtype": d, "value": sample_of(d).tolist()}},
        }
        for d in DTYPES
    ]
    strings = np.array([[b"\x89PNG\r\n\x1a\n\xff", b"", "wörld".encode()]], dtype=object)
    calls.append(
        {
            "call": "predict",
            "model": "identity_bytes",
            "inputs": {"INPUT0": {"shape": [1, 3], "b64": [base64.b64encode(v).decode() for v in strings.ravel()]}},
        }
    )
    results = official(tf_python, port, calls)
    for dtype, result in zip(DTYPES, results[:-1], strict=True):
        assert "error" not in result, (dtype, result)
        output = result["outputs"]["OUTPUT0"]
        assert output["dtype"] == dtype and output["shape"] == [2, 3], (dtype, output)
        np.testing.assert_array_equal(np.array(output["value"], dtype=dtype), sample_of(dtype))
    received = [base64.b64decode(v) for v in results[-1]["outputs"]["OUTPUT0"]["b64"]]
    assert received == list(strings.ravel())


def test_predict_matches_the_v2_door_with_versions_labels_and_filters(
    tf_python: str, tf_server: tuple[ServerProcess, int]
) -> None:
    server, port = tf_server
    inputs = {"x": {"dtype": "float32", "value": ROWS.tolist()}}
    two, three, stable, latest, a_b = official(
        tf_python,
        port,
        [
            {"call": "predict", "model": "mlp", "version": 2, "inputs": inputs},
            {"call": "predict", "model": "mlp", "version": 3, "inputs": inputs},
            {"call": "predict", "model": "mlp", "label": "stable", "inputs": inputs},
            {"call": "predict", "model": "mlp", "signature": "serving_default", "inputs": inputs},
            {
                "call": "predict",
                "model": "add_sub",
                "inputs": {
                    "INPUT0": {"dtype": "float32", "value": ROWS.tolist()},
                    "INPUT1": {"dtype": "float32", "value": ROWS.tolist()},
                },
                "output_filter": ["OUTPUT1"],
            },
        ],
    )
    for version, result in (("2", two), ("3", three)):
        body = json.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 16], "data": ROWS.ravel().tolist()}]}
        )
        reply = json.loads(http_request(server, "POST", f"/v2/models/mlp/versions/{version}/infer", body.encode()).body)
        want = np.array(reply["outputs"][0]["data"], dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose(np.array(result["outputs"]["y"]["value"]), want, rtol=1e-6)
        assert result["model_spec"] == {"name": "mlp", "version": int(version), "signature_name": "serving_default"}
    assert stable["outputs"] == two["outputs"] and latest["model_spec"]["version"] == 3
    assert list(a_b["outputs"]) == ["OUTPUT1"]
    np.testing.assert_allclose(a_b["outputs"]["OUTPUT1"]["value"], np.zeros((3, 16)))


def test_metadata_and_status(tf_python: str, tf_server: tuple[ServerProcess, int]) -> None:
    _, port = tf_server
    metadata, status, one, broken = official(
        tf_python,
        port,
        [
            {"call": "metadata", "model": "add_sub"},
            {"call": "status", "model": "mlp"},
            {"call": "status", "model": "mlp", "version": 2},
            {"call": "status", "model": "broken_file"},
        ],
    )
    assert metadata["type_url"] == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    assert metadata["method_name"] == "tensorflow/serving/predict" and metadata["version"] == 1
    assert metadata["inputs"] == {n: {"dtype": "float32", "shape": [-1, 16]} for n in ("INPUT0", "INPUT1")}
    assert [(v["version"], v["state"], v["error_code"]) for v in status["versions"]] == [
        (3, "AVAILABLE", 0),
        (2, "AVAILABLE", 0),
    ]
    assert [v["version"] for v in one["versions"]] == [2]
    assert broken["versions"][0]["state"] == "END" and broken["versions"][0]["error_code"] == 2


def test_errors_carry_tf_serving_codes(tf_python: str, tf_server: tuple[ServerProcess, int]) -> None:
    _, port = tf_server
    good = {"x": {"dtype": "float32", "value": ROWS.tolist()}}
    results = official(
        tf_python,
        port,
        [
            {"call": "predict", "model": "ghost", "inputs": good},
            {"call": "predict", "model": "mlp", "version": 9, "inputs": good},
            {"call": "predict", "model": "mlp", "label": "nightly", "inputs": good},
            {"call": "predict", "model": "mlp", "inputs": {"x": {"dtype": "float64", "value": ROWS.tolist()}}},
            {"call": "predict", "model": "mlp", "inputs": {"z": {"dtype": "float32", "value": ROWS.tolist()}}},
            {"call": "predict", "model": "mlp", "signature": "other", "inputs": good},
            {"call": "predict", "model": "mlp", "inputs": {"x": {"dtype": "complex64", "value": [[1.0]]}}},
        ],
    )
    codes = [r.get("error") for r in results]
    assert codes == [
        "NOT_FOUND",
        "NOT_FOUND",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
    ], results
    assert "Unrecognized servable version label: nightly" in results[2]["details"]
    assert "DT_COMPLEX64" in results[6]["details"]


def test_requests_count_under_their_door(tf_python: str, tf_server: tuple[ServerProcess, int]) -> None:
    server, port = tf_server
    before = scrape(server)
    official(
        tf_python,
        port,
        [
            {
                "call": "predict",
                "model": "mlp",
                "version": 3,
                "inputs": {"x": {"dtype": "float32", "value": ROWS.tolist()}},
            }
        ],
    )
    labels = {"model": "mlp", "version": "3", "protocol": "tfserving_grpc", "outcome": "success"}
    after = scrape(server)
    assert grew(before, after, "inferd_requests_total", **labels) == 1


def test_batching_parameters_file_carries_over(repository: Path, tmp_path: Path) -> None:
    parameters = tmp_path / "batching_parameters.txt"
    parameters.write_text(
        "max_batch_size { value: 64 }\nbatch_timeout_micros { value: 1000 }\n"
        "max_enqueued_batches { value: 1000000 }\nnum_batch_threads { value: 4 }\n"
    )
    with run_server(repository, tmp_path / "server.log", "--tfserving-batching-parameters", str(parameters)) as server:
        config = json.loads(http_request(server, "GET", "/v2/models/mlp/config").body)
        unbatched = json.loads(http_request(server, "GET", "/v2/models/unbatched/config").body)
        log = server.log()
    assert config["max_batch_size"] == 64
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 1000
    assert int(config["dynamic_batching"]["default_queue_policy"]["max_queue_size"]) == 64_000_000
    assert [group["count"] for group in config["instance_group"]] == [4]
    assert unbatched["max_batch_size"] == 0 and "dynamic_batching" not in unbatched
    assert "batch_timeout_micros 1000 -> dynamic_batching max_queue_delay_microseconds 1000" in log


def test_a_shape_no_array_can_have_is_invalid_argument(tf_server: tuple[ServerProcess, int]) -> None:
    # [0, 2**62, 2**62] holds no element, yet numpy cannot make it: this was a 500 (INTERNAL).
    import grpc

    from inferd.protocol.tfserving_pb import tensorflow_pb2, tensorflow_serving_pb2, tensorflow_serving_pb2_grpc

    request = tensorflow_serving_pb2.PredictRequest()
    request.model_spec.name = "identity_fp32"
    tensor = request.inputs["INPUT0"]
    tensor.dtype = tensorflow_pb2.DT_FLOAT
    tensor.tensor_shape.dim.extend(tensorflow_pb2.TensorShapeProto.Dim(size=size) for size in (0, 2**62, 2**62))
    with grpc.insecure_channel(f"127.0.0.1:{tf_server[1]}") as channel:
        stub = tensorflow_serving_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Predict(request, timeout=10)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert "larger than any tensor" in raised.value.details()


def test_uint64_values_past_int64_stay_exact(tf_server: tuple[ServerProcess, int]) -> None:
    # numpy read uint64_val [2**64 - 1, 5] as float64: the values came back rounded (found by the
    # codec fuzz tests, tests/unit/protocol/test_codec_fuzz.py).
    import grpc

    from inferd.protocol.tfserving_pb import tensorflow_pb2, tensorflow_serving_pb2, tensorflow_serving_pb2_grpc

    values = [2**64 - 1, 5, 2**63]
    request = tensorflow_serving_pb2.PredictRequest()
    request.model_spec.name = "identity_uint64"
    tensor = request.inputs["INPUT0"]
    tensor.dtype = tensorflow_pb2.DT_UINT64
    tensor.tensor_shape.dim.extend(tensorflow_pb2.TensorShapeProto.Dim(size=size) for size in (1, 3))
    tensor.uint64_val.extend(values)
    with grpc.insecure_channel(f"127.0.0.1:{tf_server[1]}") as channel:
        response = tensorflow_serving_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
    assert np.frombuffer(response.outputs["OUTPUT0"].tensor_content, dtype="<u8").tolist() == values

"""TensorFlow SavedModels built by TensorFlow itself, served by a real `inferd serve` and checked
against TensorFlow's own answers through v2 REST, v2 gRPC, TF Serving REST and TF Serving's own
gRPC client: a tf.Module with several inputs and outputs, strings and a dynamic batch (Triton's
layout), the same model's other signature (TF_SIGNATURE_DEF), and a small BERT-shaped Keras
encoder in TF Serving's layout with no config at all."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from inferd.testing.isolated import in_child
from inferd.testing.models import (
    bert_shaped_savedmodel,
    mlp_model,
    python_model,
    tensorflow_savedmodel,
    write_config,
)
from inferd.testing.server import ServerProcess, free_port, run_server
from tests.e2e.conftest import http_request
from tests.e2e.test_tfserving_grpc import official, tf_python  # noqa: F401  (the client's venv, a fixture)

pytestmark = pytest.mark.e2e

X = np.array([[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]], dtype=np.float32)
TEXT = np.array([b"ab", "wörld".encode()], dtype=object)
IDS = np.array([[1, 2, 3], [-4, 5, 2**40]], dtype=np.int64)
TOKENS = np.array([[5, 17, 42, 0], [9, 3, 0, 0]], dtype=np.int32)
MASK = (TOKENS > 0).astype(np.int32)
MLP_X = np.arange(32, dtype=np.float32).reshape(2, 16) / 10


# x ── onnx_mlp (ONNX) ── hidden ── tf_scaled (TensorFlow) ── scaled ── py_square (Python) ── y
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling {
  step [
    { model_name: "onnx_mlp" input_map { key: "x" value: "x" } output_map { key: "y" value: "hidden" } },
    { model_name: "tf_scaled" input_map { key: "x" value: "hidden" } output_map { key: "y" value: "scaled" } },
    { model_name: "py_square" input_map { key: "x" value: "scaled" } output_map { key: "y" value: "y" } }
  ]
}
"""
SQUARE = """
class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]

    def execute(self, inputs):
        return {"y": inputs["x"] * inputs["x"]}
"""


def build(root: Path) -> None:
    tensorflow_savedmodel(root / "tf_multi" / "1" / "model.savedmodel", seed=1)
    write_config(root / "tf_multi", 'platform: "tensorflow_savedmodel"\nmax_batch_size: 8\ndynamic_batching { }')
    tensorflow_savedmodel(root / "tf_scaled" / "1" / "model.savedmodel", seed=1)  # the same model, another signature
    write_config(
        root / "tf_scaled",
        'max_batch_size: 8\nparameters { key: "TF_SIGNATURE_DEF" value { string_value: "scaled" } }',
    )
    bert_shaped_savedmodel(root / "bert" / "1", seed=2)  # TF Serving's layout, no config.pbtxt
    mlp_model(root / "onnx_mlp" / "1" / "model.onnx", seed=4)  # an ONNX model beside them: x [16] -> y [4]
    write_config(root / "onnx_mlp", "max_batch_size: 8")
    python_model(root / "py_square" / "1", SQUARE)
    write_config(root / "py_square", 'backend: "python"\nmax_batch_size: 8')
    (root / "onnx_then_tf" / "1").mkdir(parents=True)
    write_config(root / "onnx_then_tf", ENSEMBLE)


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built by TensorFlow in a process of its own (inferd.testing.isolated: never in this one)."""
    root = tmp_path_factory.mktemp("tensorflow")
    in_child(build, root)
    return root


def tensorflow_answers(saved_models: Path) -> dict[str, dict[str, np.ndarray]]:
    import onnxruntime as ort
    import tensorflow as tf

    multi = tf.saved_model.load(str(saved_models / "tf_multi" / "1" / "model.savedmodel"))
    bert = tf.saved_model.load(str(saved_models / "bert" / "1"))
    answers = multi.signatures["serving_default"](x=tf.constant(X), text=tf.constant(TEXT), ids=tf.constant(IDS))
    scaled = multi.signatures["scaled"](x=tf.constant(X))
    pooled = bert.signatures["serving_default"](input_ids=tf.constant(TOKENS), attention_mask=tf.constant(MASK))
    hidden = ort.InferenceSession(str(saved_models / "onnx_mlp" / "1" / "model.onnx")).run(["y"], {"x": MLP_X})[0]
    then_tf = multi.signatures["scaled"](x=tf.constant(hidden))
    return {
        "tf_multi": {name: value.numpy() for name, value in answers.items()},
        "tf_scaled": {"y": scaled["y"].numpy()},
        "bert": {"pooled": pooled["pooled"].numpy()},
        "onnx_then_tf": {"y": then_tf["y"].numpy() ** 2},
    }


@pytest.fixture(scope="module")
def expected(saved_models: Path) -> dict[str, dict[str, np.ndarray]]:
    """TensorFlow's own answers, from the same SavedModels, loaded in a process of its own."""
    return in_child(tensorflow_answers, saved_models)


@pytest.fixture(scope="module")
def tf_server(saved_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(saved_models, log, "--tfserving-grpc-port", str(port)) as server:
        yield server, port


def test_a_savedmodel_answers_as_tensorflow_does_over_v2_http_and_grpc(
    tf_server: tuple[ServerProcess, int], expected: dict[str, dict[str, np.ndarray]]
) -> None:
    server, _ = tf_server
    want = expected["tf_multi"]
    for binary in (False, True):
        inputs = [
            httpclient.InferInput("x", [2, 4], "FP32"),
            httpclient.InferInput("text", [2], "BYTES"),
            httpclient.InferInput("ids", [2, 3], "INT64"),
        ]
        for tensor, data in zip(inputs, (X, TEXT, IDS), strict=True):
            tensor.set_data_from_numpy(data, binary_data=binary)
        with httpclient.InferenceServerClient(server.http_url) as client:
            result = client.infer("tf_multi", inputs)
        np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-6)
        assert result.as_numpy("length").tolist() == want["length"].tolist() == [2, 6]
        assert result.as_numpy("doubled").tolist() == want["doubled"].tolist()
        assert list(result.as_numpy("upper")) == list(want["upper"]) == [b"AB", "WöRLD".encode()]
    grpc_inputs = [
        grpcclient.InferInput("x", [2, 4], "FP32"),
        grpcclient.InferInput("text", [2], "BYTES"),
        grpcclient.InferInput("ids", [2, 3], "INT64"),
    ]
    for tensor, data in zip(grpc_inputs, (X, TEXT, IDS), strict=True):
        tensor.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("tf_multi", grpc_inputs)
    np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-6)
    assert list(result.as_numpy("upper")) == list(want["upper"])


def test_its_config_is_completed_from_the_signature(tf_server: tuple[ServerProcess, int]) -> None:
    server, _ = tf_server
    config = orjson.loads(http_request(server, "GET", "/v2/models/tf_multi/config").body)
    assert config["platform"] == "tensorflow_savedmodel" and config["backend"] == "tensorflow"
    dims = {t["name"]: (t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]}
    assert dims == {"x": ("TYPE_FP32", [4]), "text": ("TYPE_STRING", []), "ids": ("TYPE_INT64", [3])}
    metadata = orjson.loads(http_request(server, "GET", "/v2/models/bert").body)
    assert metadata["platform"] == "tensorflow_savedmodel"
    assert {t["name"]: t["shape"] for t in metadata["inputs"]} == {"input_ids": [-1, -1], "attention_mask": [-1, -1]}


def test_the_signature_tf_signature_def_names_is_served(
    tf_server: tuple[ServerProcess, int], expected: dict[str, dict[str, np.ndarray]]
) -> None:
    server, _ = tf_server
    metadata = orjson.loads(http_request(server, "GET", "/v2/models/tf_scaled").body)
    assert [t["name"] for t in metadata["inputs"]] == ["x"]
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}]})
    reply = http_request(server, "POST", "/v2/models/tf_scaled/infer", body)
    assert reply.status == 200, reply.body
    got = np.array(orjson.loads(reply.body)["outputs"][0]["data"], dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(got, expected["tf_scaled"]["y"], rtol=1e-6)


def test_a_bert_shaped_graph_in_tf_serving_s_layout_batches_concurrent_requests(
    tf_server: tuple[ServerProcess, int], expected: dict[str, dict[str, np.ndarray]]
) -> None:
    server, _ = tf_server

    def one(row: int) -> np.ndarray:
        inputs = [
            httpclient.InferInput("input_ids", [1, 4], "INT32"),
            httpclient.InferInput("attention_mask", [1, 4], "INT32"),
        ]
        inputs[0].set_data_from_numpy(TOKENS[row : row + 1])
        inputs[1].set_data_from_numpy(MASK[row : row + 1])
        with httpclient.InferenceServerClient(server.http_url) as client:
            return client.infer("bert", inputs).as_numpy("pooled")[0]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, [i % 2 for i in range(16)]))
    for index, answer in enumerate(answers):
        np.testing.assert_allclose(answer, expected["bert"]["pooled"][index % 2], rtol=1e-4, atol=1e-5)


def test_tf_serving_s_rest_api_and_its_own_grpc_client_get_tensorflow_s_answers(
    tf_server: tuple[ServerProcess, int],
    expected: dict[str, dict[str, np.ndarray]],
    tf_python: str,  # noqa: F811
) -> None:
    server, port = tf_server
    want = expected["tf_multi"]
    document = {"inputs": {"x": X.tolist(), "text": [t.decode() for t in TEXT], "ids": IDS.tolist()}}
    reply = http_request(server, "POST", "/v1/models/tf_multi:predict", orjson.dumps(document))
    assert reply.status == 200, reply.body
    outputs = orjson.loads(reply.body)["outputs"]
    np.testing.assert_allclose(np.array(outputs["y"], dtype=np.float32), want["y"], rtol=1e-6)
    assert outputs["upper"] == ["AB", "WöRLD"] and outputs["doubled"] == want["doubled"].tolist()
    calls: list[dict[str, Any]] = [
        {
            "call": "predict",
            "model": "tf_multi",
            "inputs": {
                "x": {"dtype": "float32", "value": X.tolist()},
                "text": {"shape": [2], "b64": [base64.b64encode(t).decode() for t in TEXT]},
                "ids": {"dtype": "int64", "value": IDS.tolist()},
            },
        }
    ]
    (result,) = official(tf_python, port, calls)
    assert "error" not in result, result
    np.testing.assert_allclose(np.array(result["outputs"]["y"]["value"], dtype=np.float32), want["y"], rtol=1e-6)
    assert [base64.b64decode(v) for v in result["outputs"]["upper"]["b64"]] == list(want["upper"])
    assert result["outputs"]["doubled"]["value"] == want["doubled"].tolist()


def test_inputs_tensorflow_rejects_are_a_400_saying_why(tf_server: tuple[ServerProcess, int]) -> None:
    server, _ = tf_server
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    missing = http_request(server, "POST", "/v2/models/tf_multi/infer", body)
    assert missing.status == 400 and "text" in orjson.loads(missing.body)["error"]


def test_only_a_server_with_savedmodels_loads_tensorflow(
    tf_server: tuple[ServerProcess, int], server: ServerProcess
) -> None:
    def maps_tensorflow(process: ServerProcess) -> bool:
        with open(f"/proc/{process.process.pid}/maps", encoding="utf-8") as maps:
            return "libtensorflow" in maps.read()

    assert maps_tensorflow(tf_server[0])
    assert not maps_tensorflow(server)  # the ONNX models' server


def test_an_ensemble_runs_an_onnx_step_into_a_tensorflow_one_into_a_python_one(
    tf_server: tuple[ServerProcess, int], expected: dict[str, dict[str, np.ndarray]]
) -> None:
    server, _ = tf_server
    tensor = httpclient.InferInput("x", [2, 16], "FP32")
    tensor.set_data_from_numpy(MLP_X)
    with httpclient.InferenceServerClient(server.http_url) as client:
        got = client.infer("onnx_then_tf", [tensor]).as_numpy("y")
    np.testing.assert_allclose(got, expected["onnx_then_tf"]["y"], rtol=1e-5, atol=1e-6)

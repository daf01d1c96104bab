"""What Triton's own client programs rely on, through tritonclient (HTTP and gRPC) against a real
`inferd serve`: the model-configuration API echoes every field of config.pbtxt, those inferd does
not act on included; HTTP requests and responses compressed with gzip or deflate; the
classification extension; errors that begin with Triton's phrase for the same condition."""

from __future__ import annotations

import gzip
import http.client
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from inferd.testing.models import add_sub_model, identity_model, mlp_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import ServerProcess, run_server
from inferd.types import DataType

pytestmark = pytest.mark.e2e
MAX_REQUEST_BYTES = 1 << 20

CLASSIFIER_CONFIG = """
max_batch_size: 8
input [{ name: "x", data_type: TYPE_FP32, format: FORMAT_NCHW, dims: [16] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [4], label_filename: "labels.txt" }]
instance_group [{ kind: KIND_CPU, count: 1, rate_limiter { priority: 2 } }]
optimization { input_pinned_memory { enable: true } }
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


WHOLE_CONFIG = """
max_batch_size: 0
input [{ name: "x", data_type: TYPE_FP32, dims: [2, 16] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [2, 4], label_filename: "labels.txt" }]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    mlp_model(repository / "classifier" / "1" / "model.onnx", seed=3)
    write_model_config(repository / "classifier", CLASSIFIER_CONFIG)
    (repository / "classifier" / "labels.txt").write_text("cat\ndog\nbird\nfish\n")
    # Not batching: the classes are ranked over the whole [2, 4] output (flat indices 0..7).
    mlp_model(repository / "whole" / "1" / "model.onnx", seed=4)
    write_model_config(repository / "whole", WHOLE_CONFIG)
    (repository / "whole" / "labels.txt").write_text("a\nb\nc\nd")  # no newline at the end: 4 labels
    add_sub_model(repository / "add_sub" / "1" / "model.onnx")
    identity_model(repository / "halves" / "1" / "model.onnx", DataType.FP16, ["batch", 4])
    write_model_config(repository / "halves", "max_batch_size: 8")
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(repository, log, "--max-request-bytes", str(MAX_REQUEST_BYTES)) as process:
        yield process


def test_the_configuration_api_echoes_every_field(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        config = client.get_model_config("classifier")
    assert config["input"][0]["format"] == "FORMAT_NCHW"
    assert config["output"][0]["label_filename"] == "labels.txt"
    assert config["output"][0]["dims"] == [4] and config["input"][0]["dims"] == [16]
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    assert config["instance_group"][0]["rate_limiter"]["priority"] == 2
    assert config["instance_group"][0]["count"] == 1 and config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    # Triton's form: scalars at their defaults printed too, unset messages left out.
    assert config["input"][0]["is_shape_tensor"] is False and config["output"][0]["is_shape_tensor"] is False
    assert "sequence_batching" not in config and "ensemble_scheduling" not in config

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        message = client.get_model_config("classifier").config
    assert message.input[0].format == mc.ModelInput.FORMAT_NCHW
    assert message.output[0].label_filename == "labels.txt"
    assert message.optimization.input_pinned_memory.enable
    assert message.instance_group[0].rate_limiter.priority == 2

    # What inferd does not act on is still listed as ignored when the model loads.
    log = server.log()
    assert "config fields not supported and ignored" in log and "optimization" in log


def classifier_input(rows: int = 2, binary: bool = True) -> tuple[list[httpclient.InferInput], np.ndarray]:
    x = np.linspace(-1, 1, rows * 16, dtype=np.float32).reshape(rows, 16)
    tensor = httpclient.InferInput("x", [rows, 16], "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return [tensor], x


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_responses(server: ServerProcess, algorithm: str, binary: bool) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs, x = classifier_input(binary=binary)
        outputs = [httpclient.InferRequestedOutput("y", binary_data=binary)]
        plain = client.infer("classifier", inputs, outputs=outputs).as_numpy("y")
        squeezed = client.infer("classifier", inputs, outputs=outputs, request_compression_algorithm=algorithm,
                                response_compression_algorithm=algorithm)  # fmt: skip
        np.testing.assert_array_equal(squeezed.as_numpy("y"), plain)
    # On the wire: the response really is compressed, and says so.
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "data": x.ravel().tolist()}]})
    packed = gzip.compress(body.encode()) if algorithm == "gzip" else zlib.compress(body.encode())
    reply = http_post(server, "/v2/models/classifier/infer", packed,
                      {"Content-Encoding": algorithm, "Accept-Encoding": f"identity;q=0.5, {algorithm}"})  # fmt: skip
    assert reply.status == 200 and reply.headers.get("content-encoding") == algorithm
    answer = json.loads(zlib.decompress(reply.body, 15 | 32))
    np.testing.assert_allclose(np.array(answer["outputs"][0]["data"]).reshape(2, 4), plain, rtol=1e-6)


def test_bad_compressed_bodies_are_the_clients_errors(server: ServerProcess) -> None:
    body = b'{"inputs": []}'
    reply = http_post(server, "/v2/models/classifier/infer", body, {"Content-Encoding": "br"})
    assert reply.status == 415 and "Unsupported compression type" in reply.body.decode()
    assert reply.headers["accept-encoding"] == "gzip, deflate"  # what the server reads, as Triton says
    reply = http_post(server, "/v2/models/classifier/infer", b"not gzip at all", {"Content-Encoding": "gzip"})
    assert reply.status == 400 and "cannot be decompressed" in reply.body.decode()
    reply = http_post(server, "/v2/models/classifier/infer", gzip.compress(body)[:-8], {"Content-Encoding": "gzip"})
    assert reply.status == 400 and "truncated" in reply.body.decode()
    # A small body that inflates past --max-request-bytes (a "zip bomb") is refused at the limit.
    bomb = gzip.compress(b"0" * (MAX_REQUEST_BYTES + 1024))
    assert len(bomb) < MAX_REQUEST_BYTES
    reply = http_post(server, "/v2/models/classifier/infer", bomb, {"Content-Encoding": "gzip"})
    assert reply.status == 413 and "decompresses to more than" in reply.body.decode()
    reply = http_post(server, "/v2/models/classifier/infer", gzip.compress(body), {"Content-Encoding": "gzip",
                      "Accept-Encoding": "gzip"})  # fmt: skip
    assert reply.status == 400 and reply.headers.get("content-encoding") is None  # errors are never compressed


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def http_post(server: ServerProcess, path: str, body: bytes, headers: dict[str, str]) -> Reply:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_grpc_compression_keeps_working(server: ServerProcess, algorithm: str) -> None:
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("x", [2, 16], "FP32")
        tensor.set_data_from_numpy(x)
        plain = client.infer("classifier", [tensor]).as_numpy("y")
        squeezed = client.infer("classifier", [tensor], compression_algorithm=algorithm).as_numpy("y")
    np.testing.assert_array_equal(squeezed, plain)


def expected_classes(scores: np.ndarray, count: int, labels: list[str]) -> list[list[str]]:
    """Triton's answer computed here: per row the top `count` as "%f:index[:label]"."""
    rows = []
    for row in scores.reshape(scores.shape[0], -1):
        order = sorted(range(row.size), key=lambda i: -row[i])[:count]
        rows.append([f"{row[i]:f}:{i}" + (f":{labels[i]}" if i < len(labels) else "") for i in order])
    return rows


@pytest.mark.parametrize("binary", [True, False])
def test_classification_over_http(server: ServerProcess, binary: bool) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs, _ = classifier_input(rows=3, binary=binary)
        scores = client.infer("classifier", inputs).as_numpy("y")
        outputs = [httpclient.InferRequestedOutput("y", binary_data=binary, class_count=2)]
        result = client.infer("classifier", inputs, outputs=outputs)
        classes = result.as_numpy("y")
        assert result.get_output("y")["datatype"] == "BYTES" and classes.shape == (3, 2)
        expected = expected_classes(scores, 2, ["cat", "dog", "bird", "fish"])
        # JSON data comes back as str, binary data as bytes.
        assert [[c.decode() if isinstance(c, bytes) else c for c in row] for row in classes] == expected
        # More classes asked for than there are: all of them.
        many = client.infer("classifier", inputs, outputs=[httpclient.InferRequestedOutput("y", class_count=10)])
        assert many.as_numpy("y").shape == (3, 4)


def test_classification_over_grpc_and_unbatched(server: ServerProcess) -> None:
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("x", [2, 16], "FP32")
        tensor.set_data_from_numpy(x)
        scores = client.infer("whole", [tensor]).as_numpy("y")
        result = client.infer("whole", [tensor], outputs=[grpcclient.InferRequestedOutput("y", class_count=3)])
    classes = result.as_numpy("y")
    assert classes.shape == (3,)  # one ranking over the whole output, flat indices
    expected = expected_classes(scores.reshape(1, -1), 3, ["a", "b", "c", "d"])[0]
    assert [c.decode() for c in classes] == expected


def test_classification_of_what_is_not_scores_is_refused(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP16")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float16))
        with pytest.raises(InferenceServerException, match="class result not available for output due to "
                                                           "unsupported type 'FP16'"):  # fmt: skip
            client.infer("halves", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=1)])
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}],
                       "outputs": [{"name": "y", "parameters": {"classification": -2}}]})  # fmt: skip
    reply = http_post(server, "/v2/models/classifier/infer", body.encode(), {})
    assert reply.status == 400 and "invalid value for the 'classification' parameter" in reply.body.decode()


def fp32(name: str, array: np.ndarray, module: Any) -> Any:
    tensor = module.InferInput(name, list(array.shape), module.np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


# (model, version, inputs, requested outputs) -> the phrase Triton begins its message with
CASES = [
    ("nope", "", [("x", np.zeros((1, 16), np.float32))], [], "Request for unknown model: 'nope' is not found"),
    ("classifier", "9", [("x", np.zeros((1, 16), np.float32))], [],
     "Request for unknown model: 'classifier' version 9 is not found"),
    ("classifier", "", [("z", np.zeros((1, 16), np.float32))], [],
     "unexpected inference input 'z' for model 'classifier'"),
    ("classifier", "", [("x", np.zeros((1, 16), np.float32))], ["q"],
     "unexpected inference output 'q' for model 'classifier'"),
    ("classifier", "", [("x", np.zeros((1, 16), np.float64))], [],
     "inference input 'x' data-type is 'FP64', but model 'classifier' expects 'FP32'"),
    ("classifier", "", [("x", np.zeros((2, 15), np.float32))], [],
     "unexpected shape for input 'x' for model 'classifier'. Expected [-1,16], got [2,15]"),
    ("classifier", "", [("x", np.zeros((9, 16), np.float32))], [],
     "inference request batch-size must be <= 8 for 'classifier'"),
    ("add_sub", "", [("INPUT0", np.zeros((1, 16), np.float32))], [],
     "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing required "
     "input(s) ['INPUT1']. Please provide all required input(s)."),
]  # fmt: skip


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("model", "version", "inputs", "outputs", "phrase"), CASES, ids=[c[4][:40] for c in CASES])
def test_errors_begin_with_tritons_phrase(
    server: ServerProcess, protocol: str, model: str, version: str, inputs: list[Any], outputs: list[str], phrase: str
) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with module.InferenceServerClient(url) as client:
        tensors = [fp32(name, array, module) for name, array in inputs]
        requested = [module.InferRequestedOutput(name) for name in outputs]
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, tensors, model_version=version, outputs=requested or None)
    assert raised.value.message().startswith(phrase), raised.value.message()
    assert len(raised.value.message()) > len(phrase) + 10  # inferd's own explanation follows


def test_unparsable_versions_and_json_carry_tritons_phrase(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client, pytest.raises(InferenceServerException) as raised:
        client.infer("classifier", [fp32("x", np.zeros((1, 16), np.float32), grpcclient)], model_version="abc")
    assert raised.value.message().startswith("failed to get model version from specified version string 'abc'")
    reply = http_post(server, "/v2/models/classifier/infer", b"{not json", {})
    error = json.loads(reply.body)
    assert reply.status == 400 and error["error"].startswith("failed to parse the request JSON buffer")
    assert error["code"] == "MALFORMED_REQUEST"  # the machine-readable fields as they were

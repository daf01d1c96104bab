"""What one request may make `inferd serve` hold, at every door: its elements, its texts' bytes,
its answer's bytes, and what compressed bodies inflate to, one by one and all together; and a
request larger than its model was timed at runs on a worker thread, whatever the model's placement."""

from __future__ import annotations

import http.client
import json
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc
from inferd.testing.models import identity_model, python_model, write_config
from inferd.testing.server import ServerProcess, free_port, run_server
from inferd.types import DataType
from tests.e2e.conftest import HttpReply, http_request, post_binary

pytestmark = pytest.mark.e2e

MAX_ELEMENTS = 1000
MAX_TEXT_BYTES = 4096
MAX_RESPONSE_BYTES = 2000
DECODED_BUDGET = 1_000_000
MAX_RATIO = 20
# Peak RSS may grow this much at most while an attack runs (the attacks below would take gigabytes).
RSS_GROWTH_BYTES = 200 * 2**20

# Counts its texts' bytes; an inline model (it only computes), except that while the test's hold
# file exists it waits (bounded) after touching its started file: on the event loop, that wait
# would stop the server answering anything, so a health check answered meanwhile proves it ran on
# a worker thread.
GATED_MODEL = """
import os
import pathlib
import time

import numpy as np


class Model:
    may_run_inline = True

    def initialize(self, args):
        self.hold = args["parameters"]["hold_file"]
        self.started = args["parameters"]["started_file"]

    def execute(self, inputs):
        if os.path.exists(self.hold):
            pathlib.Path(self.started).touch()
            deadline = time.monotonic() + 30
            while os.path.exists(self.hold) and time.monotonic() < deadline:
                time.sleep(0.005)
        texts = inputs["text"].ravel()
        return {"length": np.array([sum(len(t) for t in texts)], dtype=np.int64)}
"""
GATED_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "text" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "length" data_type: TYPE_INT64 dims: [ 1 ] } ]
parameters { key: "hold_file" value { string_value: "%s" } }
parameters { key: "started_file" value { string_value: "%s" } }
"""
EMBEDDER_MODEL = """
import numpy as np


class Model:
    def execute(self, inputs):
        return {"embedding": np.ones((len(inputs["text"]), 4), dtype=np.float32)}
"""
EMBEDDER_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "embedding" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "embedding_input" value { string_value: "text" } }
"""


def peak_rss_bytes(server: ServerProcess) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("gate")
    return folder / "hold", folder / "started"


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory: pytest.TempPathFactory, gate: tuple[Path, Path]) -> Iterator[ServerProcess]:
    """Small limits, so that each is reached by a small request."""
    root = tmp_path_factory.mktemp("tight")
    identity_model(root / "identity_fp32" / "1" / "model.onnx", DataType.FP32, ["batch", -1])
    identity_model(root / "identity_bytes" / "1" / "model.onnx", DataType.BYTES, ["batch", -1])
    python_model(root / "gated" / "1", GATED_MODEL)
    write_config(root / "gated", GATED_CONFIG % (gate[0], gate[1]))
    python_model(root / "embedder" / "1", EMBEDDER_MODEL)
    write_config(root / "embedder", EMBEDDER_CONFIG)
    flags = {
        "--max-request-elements": MAX_ELEMENTS,
        "--max-request-text-bytes": MAX_TEXT_BYTES,
        "--max-response-bytes": MAX_RESPONSE_BYTES,
        "--max-decoded-bytes-in-flight": DECODED_BUDGET,
        "--max-compression-ratio": MAX_RATIO,
    }
    args = [str(part) for flag in flags.items() for part in flag]
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log", *args) as server:
        yield server


@pytest.fixture(scope="module")
def default_server(
    tmp_path_factory: pytest.TempPathFactory, gate: tuple[Path, Path]
) -> Iterator[tuple[ServerProcess, int]]:
    """The default limits, with TF Serving's gRPC API on."""
    root = tmp_path_factory.mktemp("defaults")
    python_model(root / "gated" / "1", GATED_MODEL)
    write_config(root / "gated", GATED_CONFIG % (gate[0], gate[1]))
    identity_model(root / "identity_bytes" / "1" / "model.onnx", DataType.BYTES, ["batch", -1])
    identity_model(root / "identity_fp32" / "1" / "model.onnx", DataType.FP32, ["batch", -1])
    port = free_port()
    logs = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(root, logs, "--tfserving-grpc-port", str(port)) as server:
        yield server, port


def v2_json(inputs: list[dict[str, object]]) -> bytes:
    return json.dumps({"inputs": inputs}).encode()


def texts_input(texts: list[str]) -> dict[str, object]:
    return {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}


def refused(reply: HttpReply, status: int, flag: str) -> None:
    assert reply.status == status, (reply.status, reply.body[:500])
    assert flag in reply.body.decode(), reply.body[:500]


def test_the_element_limit_holds_at_every_door(tight_server: ServerProcess) -> None:
    values = [0.0] * (MAX_ELEMENTS + 1)
    body = v2_json([{"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}])
    refused(http_request(tight_server, "POST", "/v2/models/identity_fp32/infer", body), 413, "--max-request-elements")
    binary = np.zeros((1, MAX_ELEMENTS + 1), np.float32).tobytes()
    header = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, MAX_ELEMENTS + 1],
                          "parameters": {"binary_data_size": len(binary)}}]}  # fmt: skip
    refused(post_binary(tight_server, "identity_fp32", header, binary), 413, "--max-request-elements")
    tf_rest = json.dumps({"instances": [values]}).encode()
    refused(http_request(tight_server, "POST", "/v1/models/identity_fp32:predict", tf_rest), 413,
            "--max-request-elements")  # fmt: skip
    # Two inputs within the limit each, over it together, at the same model's door.
    half = [0.0] * (MAX_ELEMENTS // 2 + 1)
    pair = [{"name": n, "datatype": "FP32", "shape": [1, len(half)], "data": half} for n in ("INPUT0", "other")]
    refused(http_request(tight_server, "POST", "/v2/models/identity_fp32/infer", v2_json(pair)), 413,
            "--max-request-elements")  # fmt: skip
    with grpcclient.InferenceServerClient(tight_server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, MAX_ELEMENTS + 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, MAX_ELEMENTS + 1), np.float32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("identity_fp32", [tensor])
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "--max-request-elements" in caught.value.message()
        # Within the limit, the same door answers.
        tensor = grpcclient.InferInput("INPUT0", [1, MAX_ELEMENTS // 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, MAX_ELEMENTS // 4), np.float32))
        assert client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0").sum() == MAX_ELEMENTS // 4


def test_the_text_limit_holds_at_every_door(tight_server: ServerProcess) -> None:
    long_text = "x" * MAX_TEXT_BYTES
    body = v2_json([{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": [long_text]}])
    refused(http_request(tight_server, "POST", "/v2/models/identity_bytes/infer", body), 413,
            "--max-request-text-bytes")  # fmt: skip
    # Many one-byte elements, within the element limit, cost 4 bytes more each: refused before any is read.
    count = MAX_TEXT_BYTES // 5 + 1
    assert count <= MAX_ELEMENTS
    binary = b"\1\0\0\0a" * count
    header = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, count],
                          "parameters": {"binary_data_size": len(binary)}}]}  # fmt: skip
    refused(post_binary(tight_server, "identity_bytes", header, binary), 413, "--max-request-text-bytes")
    octets = {"Content-Type": "application/octet-stream"}
    refused(http_request(tight_server, "POST", "/predictions/identity_bytes", long_text.encode(), octets), 413,
            "--max-request-text-bytes")  # fmt: skip
    embeddings = json.dumps({"model": "embedder", "input": ["y" * 1000] * 5}).encode()
    refused(http_request(tight_server, "POST", "/openai/v1/embeddings", embeddings), 413, "--max-request-text-bytes")
    with grpcclient.InferenceServerClient(tight_server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[long_text.encode()]], dtype=object))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("identity_bytes", [tensor])
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "--max-request-text-bytes" in caught.value.message()
    # Within the limit: answered.
    small = json.dumps({"model": "embedder", "input": ["y" * 100] * 5}).encode()
    assert http_request(tight_server, "POST", "/openai/v1/embeddings", small).status == 200


def test_each_door_s_decoder_holds_a_body_to_the_server_s_limits_before_reading_it(
    tight_server: ServerProcess,
) -> None:
    # BYTES framing that no element can be read from, longer than the text limit: the server's limit,
    # which the door's decoder checks before it reads an element, refuses it (413), not the framing (400).
    garbage = b"\xff" * (MAX_TEXT_BYTES + 1)
    header = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1],
                          "parameters": {"binary_data_size": len(garbage)}}]}  # fmt: skip
    refused(post_binary(tight_server, "identity_bytes", header, garbage), 413, "--max-request-text-bytes")
    encoded = json.dumps(header).encode()
    sagemaker = {
        "Content-Type": f"application/vnd.sagemaker-triton.binary+json;json-header-size={len(encoded)}",
        "X-Amzn-SageMaker-Target-Model": "identity_bytes",
    }
    refused(http_request(tight_server, "POST", "/invocations", encoded + garbage, sagemaker), 413,
            "--max-request-text-bytes")  # fmt: skip
    message = service_pb2.ModelInferRequest(model_name="identity_bytes")
    message.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 1])
    message.raw_input_contents.append(garbage)
    with grpc.insecure_channel(tight_server.grpc_url) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-request-text-bytes" in str(caught.value.details())


def test_an_answer_larger_than_the_response_limit_is_refused(tight_server: ServerProcess) -> None:
    values = [1.0] * (MAX_RESPONSE_BYTES // 4 + 1)  # within the element limit; 4 bytes each out
    body = v2_json([{"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}])
    refused(http_request(tight_server, "POST", "/v2/models/identity_fp32/infer", body), 413, "--max-response-bytes")
    smaller = v2_json([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 10], "data": [1.0] * 10}])
    assert http_request(tight_server, "POST", "/v2/models/identity_fp32/infer", smaller).status == 200


def test_an_inline_model_runs_a_request_larger_than_it_was_timed_at_on_a_thread(
    default_server: tuple[ServerProcess, int], gate: tuple[Path, Path]
) -> None:
    server, _ = default_server
    hold, started = gate
    line = next(line for line in server.log().splitlines() if "model gated version 1 loaded" in line)
    assert "inline on the event loop" in line  # the model runs inline: timed on one empty text
    body = v2_json([texts_input(["z" * 30] * 100)])  # 100 texts: larger than the probe's one empty
    started.unlink(missing_ok=True)
    hold.touch()
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(http_request, server, "POST", "/v2/models/gated/infer", body)
            deadline = time.monotonic() + 30
            while not started.exists():
                assert time.monotonic() < deadline and not answer.done(), "the model never started"
                time.sleep(0.01)
            # The model is waiting on the hold file: on the event loop, nothing could answer this.
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=5)
            try:
                connection.request("GET", "/v2/health/live")
                assert connection.getresponse().status == 200
            finally:
                connection.close()
            hold.unlink()
            reply = answer.result(timeout=30)
    finally:
        hold.unlink(missing_ok=True)
    assert reply.status == 200, reply.body[:300]
    assert json.loads(reply.body)["outputs"][0]["data"] == [3000]


def test_compressed_bodies_are_held_to_a_ratio_and_a_budget_in_flight(
    tight_server: ServerProcess, gate: tuple[Path, Path]
) -> None:
    deflate = {"Content-Encoding": "deflate"}
    small = v2_json([texts_input(["a"])])
    # Over the ratio: refused before it inflates past it.
    bomb = zlib.compress(small + b" " * 200_000, 9)
    refused(http_request(tight_server, "POST", "/v2/models/gated/infer", bomb, deflate), 413, "--max-compression-ratio")
    # Stored (level 0) bodies: each may inflate to MAX_RATIO times its size, reserved from the
    # budget before inflating, then its own inflated size held until the answer.
    first = zlib.compress(small + b" " * 40_000, 0)  # 800 KB reserved, then about 40 KB held
    second = zlib.compress(small + b" " * (DECODED_BUDGET // MAX_RATIO - 2_000), 0)  # about 960 KB reserved
    assert MAX_RATIO * len(second) <= DECODED_BUDGET < MAX_RATIO * len(second) + len(first)
    hold, started = gate
    started.unlink(missing_ok=True)
    hold.touch()
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(http_request, tight_server, "POST", "/v2/models/gated/infer", first, deflate)
            deadline = time.monotonic() + 30
            while not started.exists():
                assert time.monotonic() < deadline and not held.done(), "the model never started"
                time.sleep(0.01)
            refused(http_request(tight_server, "POST", "/v2/models/gated/infer", second, deflate), 503,
                    "--max-decoded-bytes-in-flight")  # fmt: skip
            hold.unlink()
            assert held.result(timeout=30).status == 200
    finally:
        hold.unlink(missing_ok=True)
    # Once the first is answered, its bytes are back in the budget.
    assert http_request(tight_server, "POST", "/v2/models/gated/infer", second, deflate).status == 200


def test_many_compressed_bodies_at_once_leave_memory_bounded(default_server: tuple[ServerProcess, int]) -> None:
    server, _ = default_server
    bomb = zlib.compress(b"0" * (64 * 2**20), 9)  # about 65 KB that inflate to 64 MiB
    before = peak_rss_bytes(server)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: http_request(server, "POST", "/v2/models/identity_fp32/infer", bomb,
                                                       {"Content-Encoding": "deflate"}), range(16)))  # fmt: skip
    grown = peak_rss_bytes(server) - before
    assert grown < RSS_GROWTH_BYTES, f"peak RSS grew {grown >> 20} MiB"
    for reply in replies:
        refused(reply, 413, "--max-compression-ratio")
    assert http_request(server, "GET", "/v2/health/live").status == 200


def test_tf_serving_grpc_strings_repeated_over_a_shape_count_their_real_bytes(
    default_server: tuple[ServerProcess, int],
) -> None:
    server, port = default_server
    # 562 bytes on the wire: one 512-byte string repeated over [1, 1000000] would be 512 MB.
    proto = tf_pb.TensorProto(dtype=tf_pb.DT_STRING, string_val=[b"s" * 512])
    proto.tensor_shape.dim.extend([tf_pb.TensorShapeProto.Dim(size=1), tf_pb.TensorShapeProto.Dim(size=1_000_000)])
    request = serving_pb.PredictRequest()
    request.model_spec.name = "identity_bytes"
    request.inputs["INPUT0"].CopyFrom(proto)
    before = peak_rss_bytes(server)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = serving_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=60)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-request-text-bytes" in str(caught.value.details())
        assert peak_rss_bytes(server) - before < RSS_GROWTH_BYTES
        # Past the element limit, refused before the fill: 100 million pointers would be 800 MB, so
        # this shows the decoder itself holds the server's limits (not only the service, after).
        del proto.tensor_shape.dim[1:]
        proto.tensor_shape.dim.add(size=100_000_000)
        proto.string_val[:] = [b"s"]
        request.inputs["INPUT0"].CopyFrom(proto)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=60)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-request-elements" in str(caught.value.details())
        assert peak_rss_bytes(server) - before < RSS_GROWTH_BYTES
        # A fill within the limit is still TensorFlow's: the last string repeated.
        proto.string_val[:] = [b"s" * 512]
        del proto.tensor_shape.dim[1:]
        proto.tensor_shape.dim.add(size=3)
        request.inputs["INPUT0"].CopyFrom(proto)
        answer = stub.Predict(request, timeout=60)
        assert list(answer.outputs["OUTPUT0"].string_val) == [b"s" * 512] * 3

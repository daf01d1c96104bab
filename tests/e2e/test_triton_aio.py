"""Triton's asyncio clients (tritonclient.http.aio and tritonclient.grpc.aio) against a real `inferd
serve`: the configuration echo, classification and compression over HTTP; a sequence and a
decoupled model's stream over gRPC (stream_infer)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

from inferd.testing.models import mlp_model, python_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import ServerProcess, run_server

pytestmark = pytest.mark.e2e

COUNTER = """
import numpy as np


class Model:
    inputs = [{"name": "n", "datatype": "INT32", "shape": [1]}]
    outputs = [{"name": "i", "datatype": "INT32", "shape": [1]}]

    def execute(self, inputs):
        for i in range(int(inputs["n"][0])):
            yield {"i": np.array([i], dtype=np.int32)}
"""
RUNNING_SUM = """
import numpy as np


class Model:
    inputs = [{"name": "x", "datatype": "INT32", "shape": [1]}]
    outputs = [{"name": "total", "datatype": "INT32", "shape": [1]}]

    def initialize(self, args):
        self.totals = {}

    def execute(self, inputs):
        key = int(inputs["CORRID"][0])
        self.totals[key] = (0 if inputs["START"][0] else self.totals[key]) + int(inputs["x"][0])
        return {"total": np.array([self.totals[key]], dtype=np.int32)}
"""
SEQUENCE = """
backend: "python"
max_batch_size: 0
sequence_batching {
  control_input [
    { name: "START", control [{ kind: CONTROL_SEQUENCE_START, int32_false_true: [0, 1] }] },
    { name: "CORRID", control [{ kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64 }] }
  ]
}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    mlp_model(repository / "classifier" / "1" / "model.onnx", seed=3)
    write_model_config(repository / "classifier", """
max_batch_size: 8
input [{ name: "x", data_type: TYPE_FP32, format: FORMAT_NCHW, dims: [16] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [4], label_filename: "labels.txt" }]
""")  # fmt: skip
    (repository / "classifier" / "labels.txt").write_text("cat\ndog\nbird\nfish\n")
    python_model(repository / "counter" / "1", COUNTER)
    write_model_config(repository / "counter", 'backend: "python"\nmodel_transaction_policy { decoupled: true }')
    python_model(repository / "running_sum" / "1", RUNNING_SUM)
    write_model_config(repository / "running_sum", SEQUENCE)
    with run_server(repository, tmp_path_factory.mktemp("logs") / "server.log") as process:
        yield process


async def test_http_aio_config_classification_and_compression(server: ServerProcess) -> None:
    async with httpaio.InferenceServerClient(server.http_url) as client:
        config = await client.get_model_config("classifier")
        assert config["input"][0]["format"] == "FORMAT_NCHW"
        x = httpaio.InferInput("x", [2, 16], "FP32")
        x.set_data_from_numpy(np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16))
        scores = (await client.infer("classifier", [x])).as_numpy("y")
        top = [httpaio.InferRequestedOutput("y", class_count=1)]
        result = await client.infer("classifier", [x], outputs=top, request_compression_algorithm="gzip",
                                    response_compression_algorithm="deflate")  # fmt: skip
        labels = ["cat", "dog", "bird", "fish"]
        expected = [f"{row.max():f}:{row.argmax()}:{labels[row.argmax()]}" for row in scores]
        assert [c.decode() for c in result.as_numpy("y")[:, 0]] == expected


async def test_grpc_aio_sequence_and_decoupled_stream(server: ServerProcess) -> None:
    async with grpcaio.InferenceServerClient(server.grpc_url) as client:
        totals = []
        for index, value in enumerate((3, 4, 5)):
            x = grpcaio.InferInput("x", [1], "INT32")
            x.set_data_from_numpy(np.array([value], dtype=np.int32))
            result = await client.infer("running_sum", [x], sequence_id=42, sequence_start=index == 0,
                                        sequence_end=index == 2)  # fmt: skip
            totals.append(int(result.as_numpy("total")[0]))
        assert totals == [3, 7, 12]

        async def requests() -> AsyncIterator[dict[str, Any]]:
            n = grpcaio.InferInput("n", [1], "INT32")
            n.set_data_from_numpy(np.array([4], dtype=np.int32))
            yield {"model_name": "counter", "inputs": [n], "request_id": "four"}

        values = []
        async for result, error in client.stream_infer(requests()):
            assert error is None
            values.append(int(result.as_numpy("i")[0]))
            if len(values) == 4:
                break
        assert values == [0, 1, 2, 3]

"""Decoupled models (Python models whose `execute` yields responses) streamed over gRPC's
ModelStreamInfer, through tritonclient's start_stream / async_stream_infer against a real `inferd
serve`: every response in order, Triton's final-response flag, errors in the stream without ending
it, other models answered once on the same stream, and HTTP refusing decoupled models."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

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
        count = int(inputs["n"][0])
        if count < 0:
            raise ValueError("a negative count")
        for i in range(count):
            if i == 3 and count == 13:
                raise RuntimeError("unlucky thirteen")
            yield {"i": np.array([i], dtype=np.int32)}
"""
ASYNC_COUNTER = """
import asyncio

import numpy as np


class Model:
    inputs = [{"name": "n", "datatype": "INT32", "shape": [1]}]
    outputs = [{"name": "i", "datatype": "INT32", "shape": [1]}]

    async def execute(self, inputs):
        for i in range(int(inputs["n"][0])):
            await asyncio.sleep(0.001)
            yield {"i": np.array([i * 10], dtype=np.int32)}
"""
DECOUPLED = 'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    python_model(repository / "counter" / "1", COUNTER)
    write_model_config(repository / "counter", DECOUPLED)
    python_model(repository / "async_counter" / "1", ASYNC_COUNTER)
    write_model_config(repository / "async_counter", DECOUPLED)
    python_model(repository / "undeclared" / "1", COUNTER)  # yields, but its config is not decoupled
    write_model_config(repository / "undeclared", 'backend: "python"\nmax_batch_size: 0')
    mlp_model(repository / "mlp" / "1" / "model.onnx", seed=1)
    write_model_config(repository / "mlp", "max_batch_size: 8")
    with run_server(repository, tmp_path_factory.mktemp("logs") / "server.log") as process:
        yield process


class Stream:
    """A tritonclient stream whose callback results land in a queue."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model: str, count: int, request_id: str = "", empty_final: bool = False) -> None:
        n = grpcclient.InferInput("n", [1], "INT32")
        n.set_data_from_numpy(np.array([count], dtype=np.int32))
        self.client.async_stream_infer(model, [n], request_id=request_id, enable_empty_final_response=empty_final)

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.results.get(timeout=30) for _ in range(count)]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: ServerProcess) -> Iterator[Stream]:
    made = Stream(server)
    yield made
    made.close()


def values(results: list[tuple[Any, Any]], output: str = "i") -> list[int]:
    assert all(error is None for _, error in results), [error for _, error in results]
    return [int(result.as_numpy(output)[0]) for result, _ in results]


def final_flag(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def test_a_decoupled_model_streams_every_response_in_order(stream: Stream) -> None:
    stream.send("counter", 5, request_id="five", empty_final=True)
    results = stream.take(6)
    assert values(results[:5]) == [0, 1, 2, 3, 4]
    assert all(result.get_response().id == "five" and not final_flag(result) for result, _ in results[:5])
    last, error = results[5]
    assert error is None and final_flag(last) and not last.get_response().outputs  # the empty final response
    stream.send("async_counter", 3)
    assert values(stream.take(3)) == [0, 10, 20]
    stream.send("counter", 0, empty_final=True)  # no responses at all: only the final flag
    ((result, error),) = stream.take(1)
    assert error is None and final_flag(result)


def test_errors_come_in_the_stream_which_goes_on(stream: Stream) -> None:
    stream.send("counter", 13)  # three responses, then the model raises
    results = stream.take(4)
    assert values(results[:3]) == [0, 1, 2]
    assert "unlucky thirteen" in str(results[3][1])
    stream.send("nope", 1)
    ((_, error),) = stream.take(1)
    assert "Request for unknown model: 'nope' is not found" in str(error)
    # A model that is not decoupled answers once on the stream, flagged final.
    tensor = grpcclient.InferInput("x", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    stream.client.async_stream_infer("mlp", [tensor])
    ((result, error),) = stream.take(1)
    assert error is None and result.as_numpy("y").shape == (1, 4) and final_flag(result)
    stream.send("counter", 2)
    assert values(stream.take(2)) == [0, 1]


def test_interleaved_requests_on_one_stream_all_complete(stream: Stream) -> None:
    for count in (4, 2, 3):
        stream.send("counter", count, request_id=f"r{count}")
    results = stream.take(9)
    by_request: dict[str, list[int]] = {}
    for result, error in results:
        assert error is None
        by_request.setdefault(result.get_response().id, []).append(int(result.as_numpy("i")[0]))
    assert by_request == {"r4": [0, 1, 2, 3], "r2": [0, 1], "r3": [0, 1, 2]}  # each in its own order


def test_http_refuses_decoupled_models_and_yielding_needs_the_policy(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        n = httpclient.InferInput("n", [1], "INT32")
        n.set_data_from_numpy(np.array([2], dtype=np.int32))
        with pytest.raises(InferenceServerException, match="HTTP end point doesn't support models with decoupled"):
            client.infer("counter", [n])
        assert not client.is_model_ready("undeclared")
    log = Path(server.log_path).read_text()
    assert "only a decoupled model may do" in log and "model_transaction_policy { decoupled: true }" in log


def test_a_unary_grpc_call_to_a_decoupled_model_is_refused_in_grpc_words(server: ServerProcess) -> None:
    # The core refuses in no transport's words; each transport names itself, as Triton's do.
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        n = grpcclient.InferInput("n", [1], "INT32")
        n.set_data_from_numpy(np.array([2], dtype=np.int32))
        with pytest.raises(
            InferenceServerException, match="ModelInfer RPC doesn't support models with decoupled"
        ) as caught:
            client.infer("counter", [n])
        assert "HTTP" not in str(caught.value)

"""Python models served by a real `inferd serve`: sync and async, with dynamic batching and two
instances, distinct inputs per request over HTTP and gRPC, and a model that raises for one request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from inferd.testing.models import python_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import Clients
from tests.e2e.test_batching import batch_size_histogram

pytestmark = pytest.mark.e2e

# y = 3x + the instance's number; it raises for a request whose rows hold a negative number. Each
# execution sleeps 20 ms, so that requests arriving meanwhile queue and merge (slow by construction).
SYNC_MODEL = """
import time
import numpy as np

class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 4]},
               {"name": "rows", "datatype": "INT64", "shape": [-1, 1]}]

    def execute(self, inputs):
        x = inputs["x"]
        if (x < 0).any():
            raise ValueError(f"negative input in a batch of {len(x)} rows")
        time.sleep(0.02)
        return {"y": x * np.float32(3), "rows": np.full((len(x), 1), len(x), dtype=np.int64)}
"""
ASYNC_MODEL = """
import asyncio
import numpy as np

class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 4]},
               {"name": "rows", "datatype": "INT64", "shape": [-1, 1]}]

    async def execute(self, inputs):
        x = inputs["x"]
        if (x < 0).any():
            raise ValueError(f"negative input in a batch of {len(x)} rows")
        await asyncio.sleep(0.02)
        return {"y": x * np.float32(3), "rows": np.full((len(x), 1), len(x), dtype=np.int64)}
"""
BATCHING = """
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 5000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def python_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("python")
    for name, source in (("sync_model", SYNC_MODEL), ("async_model", ASYNC_MODEL)):
        python_model(root / name / "1", source)
        write_config(root / name, BATCHING)
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log") as server:
        yield server


def rows_of(index: int) -> np.ndarray:
    rows = 1 + index % 3
    return np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 100 * index


async def http_call(client: httpaio.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    tensor = httpaio.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    result = await client.infer(model, [tensor])
    rows = result.as_numpy("rows")
    np.testing.assert_array_equal(result.as_numpy("y"), x * 3)
    return rows


async def grpc_call(client: grpcaio.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    tensor = grpcaio.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = await client.infer(model, [tensor])
    np.testing.assert_array_equal(result.as_numpy("y"), x * 3)
    return result.as_numpy("rows")


@pytest.mark.parametrize("model", ["sync_model", "async_model"])
async def test_concurrent_requests_batch_and_each_gets_its_own_rows(python_server: ServerProcess, model: str) -> None:
    http = httpaio.InferenceServerClient(python_server.http_url, conn_limit=40)
    grpc = grpcaio.InferenceServerClient(python_server.grpc_url)
    try:
        calls = [http_call(http, model, rows_of(i)) for i in range(40)]
        calls += [grpc_call(grpc, model, rows_of(100 + i)) for i in range(40)]
        batch_rows = await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
    finally:
        await http.close()
        await grpc.close()
    # Requests shared executions: some batch held more rows than its request brought.
    assert any(int(rows.max()) > len(rows) for rows in batch_rows)
    buckets = batch_size_histogram(python_server, model)
    assert buckets["+Inf"] < 80


@pytest.mark.parametrize("model", ["sync_model", "async_model"])
async def test_a_request_that_makes_the_model_raise_fails_alone(python_server: ServerProcess, model: str) -> None:
    client = httpaio.InferenceServerClient(python_server.http_url, conn_limit=16)
    try:
        # Requests that arrive while both instances sleep merge, the bad one among them: its batch
        # raises, and is run again request by request so that only the bad one fails.
        good = [http_call(client, model, rows_of(i)) for i in range(15)]
        bad = http_call(client, model, -np.ones((1, 4), dtype=np.float32))
        outcomes = await asyncio.wait_for(asyncio.gather(*good[:8], bad, *good[8:], return_exceptions=True), 60)
    finally:
        await client.close()
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1, errors
    [error] = errors
    assert isinstance(error, InferenceServerException) and error.status() == "400"
    assert f"model '{model}' version 1 raised ValueError: negative input in a batch of 1 rows" in error.message()
    assert "model.py line" in error.message()


def test_an_unbatched_python_model_serves_bytes_over_http_and_grpc(
    clients: Clients, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("bytes")
    python_model(
        root / "upper" / "1",
        """
        import numpy as np
        class Model:
            inputs = [{"name": "text", "datatype": "BYTES", "shape": [2]}]
            outputs = [{"name": "upper", "datatype": "BYTES", "shape": [2]}]
            def execute(self, inputs):
                return {"upper": np.array([t.upper() for t in inputs["text"]], dtype=object)}
        """,
    )
    write_config(root / "upper", "max_batch_size: 0")
    blobs = np.array([b"abc\xff", b"\x00d"], dtype=object)
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log") as server:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        http_input = httpclient.InferInput("text", [2], "BYTES")
        http_input.set_data_from_numpy(blobs, binary_data=True)
        out = clients.http(server.http_url).infer("upper", [http_input]).as_numpy("upper")
        assert list(out) == [b"ABC\xff", b"\x00D"]
        grpc_input = grpcclient.InferInput("text", [2], "BYTES")
        grpc_input.set_data_from_numpy(blobs)
        assert list(clients.grpc(server.grpc_url).infer("upper", [grpc_input]).as_numpy("upper")) == [
            b"ABC\xff",
            b"\x00D",
        ]
        config = clients.http(server.http_url).get_model_config("upper")
        assert config["backend"] == "python" and config["input"][0]["data_type"] == "TYPE_STRING"

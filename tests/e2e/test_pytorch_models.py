"""PyTorch models served by a real `inferd serve`: TorchScript with Triton's tensor names and a
torch.export program that completes its own config, each with dynamic batching and two instances,
distinct inputs per request over HTTP and gRPC."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

from inferd.testing.models import exported_model, torch_module, torchscript_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import Clients, http_request
from tests.e2e.test_batching import batch_size_histogram

pytestmark = pytest.mark.e2e

BATCHING = """
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
# (model, x's name, scale's name, y's name)
MODELS = [
    ("torchscript", "INPUT__0", "INPUT__1", "OUTPUT__0"),
    ("exported", "x", "scale", "OUTPUT__0"),
]


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("pytorch")
    torchscript_model(root / "torchscript" / "1" / "model.pt", seed=1)
    write_config(
        root / "torchscript",
        BATCHING
        + """
        platform: "pytorch_libtorch"
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
                { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] },
                 { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """,
    )
    exported_model(root / "exported" / "1" / "model.pt2", seed=1)
    write_config(root / "exported", BATCHING)  # the tensors come from the program
    (root / "bf16" / "1").mkdir(parents=True)
    example = torch.ones(2, 3, dtype=torch.bfloat16)
    torch.jit.trace(Bfloat16Affine(), example).save(str(root / "bf16" / "1" / "model.pt"))  # type: ignore[no-untyped-call]
    write_config(
        root / "bf16",
        """
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ { name: "INPUT__0" data_type: TYPE_BF16 dims: [ 3 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_BF16 dims: [ 3 ] } ]
        """,
    )
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log") as server:
        yield server


class Bfloat16Affine(torch.nn.Module):
    """A model whose tensors are bfloat16: y = 2x + 1, computed in bfloat16."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


def request_of(index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = 1 + index % 3
    x = (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) - 5) * (index + 1) / 10
    scale = np.full((rows, 1), index % 7 - 3, dtype=np.float32)
    with torch.inference_mode():
        y, _ = torch_module(1)(torch.tensor(x), torch.tensor(scale))
    return x, scale, y.numpy()


async def http_call(client: httpaio.InferenceServerClient, model: tuple[str, str, str, str], index: int) -> None:
    name, x_name, scale_name, y_name = model
    x, scale, y = request_of(index)
    inputs = [httpaio.InferInput(x_name, list(x.shape), "FP32"), httpaio.InferInput(scale_name, [len(x), 1], "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=index % 2 == 0)
    inputs[1].set_data_from_numpy(scale, binary_data=index % 2 == 0)
    result = await client.infer(name, inputs)
    np.testing.assert_allclose(result.as_numpy(y_name), y, rtol=1e-5, atol=1e-6)


async def grpc_call(client: grpcaio.InferenceServerClient, model: tuple[str, str, str, str], index: int) -> None:
    name, x_name, scale_name, y_name = model
    x, scale, y = request_of(index)
    inputs = [grpcaio.InferInput(x_name, list(x.shape), "FP32"), grpcaio.InferInput(scale_name, [len(x), 1], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(scale)
    result = await client.infer(name, inputs)
    np.testing.assert_allclose(result.as_numpy(y_name), y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", MODELS, ids=[m[0] for m in MODELS])
async def test_concurrent_requests_batch_and_each_gets_its_own_rows(
    torch_server: ServerProcess, model: tuple[str, str, str, str]
) -> None:
    http = httpaio.InferenceServerClient(torch_server.http_url, conn_limit=60)
    grpc = grpcaio.InferenceServerClient(torch_server.grpc_url)
    try:
        calls = [http_call(http, model, i) for i in range(60)] + [grpc_call(grpc, model, 60 + i) for i in range(60)]
        await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
    finally:
        await http.close()
        await grpc.close()
    buckets = batch_size_histogram(torch_server, model[0])
    assert buckets["+Inf"] < 120, "no request was batched with another"


def test_configs_are_reported_with_the_pytorch_platform(clients: Clients, torch_server: ServerProcess) -> None:
    client = clients.http(torch_server.http_url)
    exported = client.get_model_config("exported")
    assert exported["platform"] == "pytorch_libtorch" and exported["backend"] == "pytorch"
    assert [i["name"] for i in exported["input"]] == ["x", "scale"]
    assert [o["name"] for o in exported["output"]] == ["OUTPUT__0", "OUTPUT__1"]
    metadata = client.get_model_metadata("torchscript")
    assert metadata["platform"] == "pytorch_libtorch"
    assert [o["shape"] for o in metadata["outputs"]] == [[-1, 3], [-1, 1]]


def test_torch_export_programs_load_side_by_side(tmp_path: Path) -> None:
    """Models load two at a time, and torch.export.load keeps one deserializer per process: loaded
    together, all but one failed with "_CURRENT_DESERIALIZER is already set" (seen on a GPU machine,
    then here). Each loads now, whatever the others do."""
    for index in range(6):
        exported_model(tmp_path / "repository" / f"program_{index}" / "1" / "model.pt2", seed=index)
    with run_server(tmp_path / "repository", tmp_path / "server.log") as server:
        reply = http_request(server, "POST", "/v2/repository/index")
        states = {entry["name"]: (entry["state"], entry.get("reason", "")) for entry in json.loads(reply.body)}
        assert states == {f"program_{index}": ("READY", "") for index in range(6)}, states


def test_a_bfloat16_model_is_served_bit_for_bit_over_http_and_grpc(torch_server: ServerProcess) -> None:
    import ml_dtypes
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    x = np.array([[0.5, -1.25, 3.0], [100.0, 1e-3, -7.5]], dtype=ml_dtypes.bfloat16)
    with torch.inference_mode():
        expected = Bfloat16Affine()(torch.from_numpy(x.view(np.int16)).view(torch.bfloat16))
    want = expected.view(torch.int16).numpy().view(np.uint16).tolist()

    http_input = httpclient.InferInput("INPUT__0", [2, 3], "BF16")
    http_input.set_data_from_numpy(x, binary_data=True)
    with httpclient.InferenceServerClient(torch_server.http_url) as client:
        answer = client.infer("bf16", [http_input]).as_numpy("OUTPUT__0")
    assert answer.dtype == x.dtype and answer.view(np.uint16).tolist() == want

    grpc_input = grpcclient.InferInput("INPUT__0", [2, 3], "BF16")
    grpc_input.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(torch_server.grpc_url) as client:
        answer = client.infer("bf16", [grpc_input]).as_numpy("OUTPUT__0")
    assert answer.dtype == x.dtype and answer.view(np.uint16).tolist() == want

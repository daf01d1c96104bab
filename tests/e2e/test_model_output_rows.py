"""A model that answers the wrong number of rows fails every request with the same model error, over
HTTP and gRPC, whichever path ran it: a batching Python model that answers one row too many (its
lone requests run at once after a few, merged ones through the batcher), and a stateful model that
answers one row too few (through the sequence batcher)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inferd.testing.models import python_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

ONE_ROW_TOO_MANY = """
import numpy as np

class Model:
    def execute(self, inputs):
        x = inputs["x"]
        return {"y": np.concatenate([x, x[:1]])}
"""
ONE_ROW_TOO_FEW = """
class Model:
    def execute(self, inputs):
        return {"y": inputs["x"][:-1]}
"""
TENSORS = """
backend: "python"
max_batch_size: 4
input [{ name: "x", data_type: TYPE_FP32, dims: [4] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [4] }]
"""
MODELS = {
    "too_many": (ONE_ROW_TOO_MANY, TENSORS + "dynamic_batching { }"),
    "too_few": (ONE_ROW_TOO_FEW, TENSORS + "sequence_batching { direct { } }"),
}
CALLS = 50
# Sequence ids, distinct across the module: each request is a whole sequence (START and END).
SEQUENCE_IDS = itertools.count(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("rows")
    for name, (source, config) in MODELS.items():
        python_model(root / name / "1", source)
        write_config(root / name, config)
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log") as process:
        yield process


def sequence(model: str) -> dict[str, Any]:
    if model != "too_few":
        return {}
    return {"sequence_id": next(SEQUENCE_IDS), "sequence_start": True, "sequence_end": True}


async def tritonclient_call(client: Any, module: Any, model: str) -> InferenceServerException:
    x = module.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException) as raised:
        await client.infer(model, [x], **sequence(model))
    return raised.value


async def every_call(call: Any) -> list[Any]:
    """`call()` 50 times one after another, then 50 times at once."""
    answers = [await call() for _ in range(CALLS)]
    return answers + list(await asyncio.gather(*(call() for _ in range(CALLS))))


def assert_model_output_error(model: str, message: str) -> None:
    assert f"model '{model}' output 'y' has shape" in message, message
    assert "but the batch had" in message, message


@pytest.mark.parametrize("model", MODELS)
async def test_every_answer_is_the_model_error_with_tritonclient(server: ServerProcess, model: str) -> None:
    http = httpaio.InferenceServerClient(server.http_url, conn_limit=CALLS)
    grpc_client = grpcaio.InferenceServerClient(server.grpc_url)
    try:
        over_http = await asyncio.wait_for(every_call(lambda: tritonclient_call(http, httpaio, model)), 120)
        over_grpc = await asyncio.wait_for(every_call(lambda: tritonclient_call(grpc_client, grpcaio, model)), 120)
    finally:
        await http.close()
        await grpc_client.close()
    assert {error.status() for error in over_http} == {"500"}
    assert {error.status() for error in over_grpc} == {"StatusCode.INTERNAL"}
    for error in over_http + over_grpc:
        assert_model_output_error(model, error.message())


async def http_error(server: ServerProcess, model: str) -> tuple[int, str, str]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}
    if parameters := sequence(model):
        body["parameters"] = parameters
    reply = await asyncio.to_thread(http_request, server, "POST", f"/v2/models/{model}/infer", orjson.dumps(body))
    answer = orjson.loads(reply.body)
    return reply.status, answer["code"], answer["error"]


async def grpc_error(stub: Any, model: str) -> tuple[str, str, str]:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([1.0] * 4)
    for key, value in sequence(model).items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        else:
            request.parameters[key].int64_param = value
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.ModelInfer(request, timeout=30)
    trailers = dict(raised.value.trailing_metadata() or ())
    return str(raised.value.code()), str(trailers["inferd-code"]), raised.value.details() or ""


@pytest.mark.parametrize("model", MODELS)
async def test_every_answer_carries_the_code_model_output_invalid(server: ServerProcess, model: str) -> None:
    over_http = await asyncio.wait_for(every_call(lambda: http_error(server, model)), 120)
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        over_grpc = await asyncio.wait_for(every_call(lambda: grpc_error(stub, model)), 120)
    assert {(status, code) for status, code, _ in over_http} == {(500, "MODEL_OUTPUT_INVALID")}
    assert {(status, code) for status, code, _ in over_grpc} == {("StatusCode.INTERNAL", "MODEL_OUTPUT_INVALID")}
    for _, _, message in over_http + over_grpc:
        assert_model_output_error(model, message)

"""inferd.client's HTTP client against a real `inferd serve`: binary tensors both ways, kept-alive
connections (and a connection the server closed while idle, which the client replaces), errors as
inferd's own, deadlines."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferd.client import HttpInferenceClient
from inferd.errors import ModelNotFoundError, UnavailableError, UnknownTensorError
from inferd.testing.server import ServerProcess, free_port, run_server
from inferd.types import DataType, InferRequest, RequestContext, RequestedOutput, Tensor

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def idle_closing_server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The test repository, served by a server that closes connections idle for 0.2 s."""
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(repository, log, "--keep-alive-timeout", "0.2") as server:
        yield server


def identity_request(values: np.ndarray, request_id: str = "r1") -> InferRequest:
    return InferRequest(
        "identity_fp32", "", (Tensor("INPUT0", DataType.FP32, values.shape, values),),
        outputs=(RequestedOutput("OUTPUT0"),), context=RequestContext(request_id),
    )  # fmt: skip


async def until_closed_by_the_server(client: HttpInferenceClient) -> None:
    """Wait (bounded) until the server has closed every connection the client keeps idle: a
    condition, not a duration, so the test means the same on any machine."""
    for _ in range(1000):
        idle = client._idle  # the kept connections are what this test is about
        if idle and all(connection.reader.at_eof() for connection in idle):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server kept the idle connections open")


async def test_binary_tensors_both_ways_over_kept_alive_connections(idle_closing_server: ServerProcess) -> None:
    client = HttpInferenceClient(idle_closing_server.http_url, max_in_flight=4)
    try:
        values = np.arange(12, dtype=np.float32).reshape(3, 4)
        responses = await asyncio.gather(
            *(client.infer(identity_request(values + i, f"r{i}"), timeout_s=10) for i in range(8))
        )
        for i, response in enumerate(responses):
            assert response.request_id == f"r{i}" and response.model_name == "identity_fp32"
            assert np.array_equal(response.outputs[0].data, values + i)
        await until_closed_by_the_server(client)
        again = await client.infer(identity_request(values), timeout_s=10)
        assert np.array_equal(again.outputs[0].data, values)
        metadata = await client.model_metadata("identity_fp32", timeout_s=10)
        assert [t.name for t in metadata.inputs] == ["INPUT0"]
    finally:
        await client.close()


async def test_errors_come_back_as_inferds_own(idle_closing_server: ServerProcess) -> None:
    client = HttpInferenceClient(idle_closing_server.http_url)
    try:
        wrong = InferRequest("identity_fp32", "", (Tensor("nope", DataType.FP32, (1, 1), np.ones((1, 1), "f4")),))
        with pytest.raises(UnknownTensorError, match=r"has no input 'nope'"):
            await client.infer(wrong, timeout_s=10)
        with pytest.raises(ModelNotFoundError, match=r"unknown_model"):
            await client.infer(InferRequest("unknown_model", "", wrong.inputs), timeout_s=10)
    finally:
        await client.close()
    nobody = HttpInferenceClient(f"127.0.0.1:{free_port()}")
    with pytest.raises(UnavailableError, match=r"server 127\.0\.0\.1:\d+ is unavailable"):
        await nobody.infer(identity_request(np.ones((1, 4), "f4")), timeout_s=5)

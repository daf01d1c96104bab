"""The sentence-similarity pipeline split across two `inferd serve` processes: the front serves the
tokenizer, pooling and cosine models and the ensemble, and reaches the encoder in the model
process as a `remote` model over KServe v2, gRPC or HTTP with binary tensors (every test runs with
each). Scores match tokenizers + onnxruntime called directly; a slow remote (by construction: a
held model) and a stopped one are 503s that say why, answered within the deadline the client gave,
not hangs; a request the remote refuses stays a 400."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

from inferd.testing.models import sleepy_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request
from tests.e2e.test_pipeline import PAIRS, grpc_similarity, http_similarity, reference_similarity

pytestmark = pytest.mark.e2e

FRONT_MODELS = ("tokenizer", "mean_pooling", "cosine", "sentence_similarity")


def remote_config(
    url: str, protocol: str, *, model_name: str = "", timeout_ms: int = 10_000, max_batch_size: int = 32
) -> str:
    name = f'parameters {{ key: "model_name" value {{ string_value: "{model_name}" }} }}' if model_name else ""
    return f"""
    backend: "remote"
    max_batch_size: {max_batch_size}
    dynamic_batching {{ }}
    parameters {{ key: "url" value {{ string_value: "{url}" }} }}
    parameters {{ key: "protocol" value {{ string_value: "{protocol}" }} }}
    parameters {{ key: "timeout_ms" value {{ string_value: "{timeout_ms}" }} }}
    {name}
    """


@pytest.fixture(scope="module", params=["grpc", "http"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def remote_url(server: ServerProcess, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


@pytest.fixture(scope="module")
def hold_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hold") / "held"


@pytest.fixture(scope="module")
def model_server(
    pipeline_repository: Path, hold_file: Path, protocol: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The heavy side: the encoder (the shared export, linked) and a model slow by construction."""
    root = tmp_path_factory.mktemp("model_side")
    (root / "minilm" / "1").mkdir(parents=True)
    shutil.copyfile(pipeline_repository / "minilm" / "config.pbtxt", root / "minilm" / "config.pbtxt")
    (root / "minilm" / "1" / "model.onnx").symlink_to(pipeline_repository / "minilm" / "1" / "model.onnx")
    sleepy_model(root / "sleepy", sleep_ms=0, max_batch_size=8, hold_file=hold_file)
    with run_server(root, tmp_path_factory.mktemp("logs") / "model.log") as server:
        yield server


@pytest.fixture(scope="module")
def front_server(
    pipeline_repository: Path, model_server: ServerProcess, protocol: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("front_side")
    for name in FRONT_MODELS:
        shutil.copytree(pipeline_repository / name, root / name)
    url = remote_url(model_server, protocol)
    # The same ensemble config: its `minilm` step is now the remote model (tensors read from it).
    write_config(root / "minilm", remote_config(url, protocol))
    write_config(root / "slow_remote", remote_config(url, protocol, model_name="sleepy", timeout_ms=500))
    write_config(root / "patient_remote", remote_config(url, protocol, model_name="sleepy"))
    with run_server(root, tmp_path_factory.mktemp("logs") / "front.log") as server:
        yield server


async def test_split_scores_match_tokenizers_and_onnxruntime_called_directly(
    front_server: ServerProcess, pipeline_repository: Path
) -> None:
    want = reference_similarity(pipeline_repository, PAIRS)
    async with (
        httpaio.InferenceServerClient(front_server.http_url) as http_client,
        grpcaio.InferenceServerClient(front_server.grpc_url) as grpc_client,
    ):
        np.testing.assert_allclose(await http_similarity(http_client, PAIRS), want, rtol=0, atol=1e-5)
        np.testing.assert_allclose(await grpc_similarity(grpc_client, PAIRS), want, rtol=0, atol=1e-5)
        metadata = await http_client.get_model_metadata("minilm")
    # The remote model's tensors, as the model process declares them.
    assert [i["name"] for i in metadata["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]


def test_a_slow_remote_is_a_503_within_the_timeout_or_the_clients_deadline(
    front_server: ServerProcess, hold_file: Path
) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
    hold_file.touch()  # the remote model now waits, for as long as the file exists
    try:
        started = time.monotonic()
        reply = http_request(front_server, "POST", "/v2/models/slow_remote/infer", json.dumps(body).encode())
        elapsed = time.monotonic() - started
        assert reply.status == 503, reply.body
        error = json.loads(reply.body)["error"]
        assert "remote model 'sleepy': server 127.0.0.1:" in error
        assert "did not answer within 500 ms" in error
        assert elapsed < 10

        # The client's deadline (Triton's `timeout` parameter, 300 ms) travels with the call: the
        # remote model's own 10 s timeout is not waited for.
        patient = {**body, "parameters": {"timeout": 300_000}}
        started = time.monotonic()
        reply = http_request(front_server, "POST", "/v2/models/patient_remote/infer", json.dumps(patient).encode())
        elapsed = time.monotonic() - started
        assert reply.status == 503, reply.body
        assert "did not answer within 300 ms" in json.loads(reply.body)["error"]
        assert elapsed < 5
    finally:
        hold_file.unlink(missing_ok=True)
    reply = http_request(front_server, "POST", "/v2/models/patient_remote/infer", json.dumps(body).encode())
    assert reply.status == 200, reply.body


def test_a_request_the_remote_refuses_stays_the_clients_400(front_server: ServerProcess) -> None:
    # 9 rows: within the front's max_batch_size (32), beyond the remote model's (8).
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 2], "data": [1.0] * 18}]}
    reply = http_request(front_server, "POST", "/v2/models/patient_remote/infer", json.dumps(body).encode())
    assert reply.status == 400, reply.body
    error = json.loads(reply.body)["error"]
    assert "remote model 'sleepy': server 127.0.0.1:" in error and "refused the request" in error


def test_a_stopped_remote_is_a_503_naming_it_and_the_front_serves_on(
    front_server: ServerProcess, model_server: ServerProcess, protocol: str
) -> None:
    body = {
        "inputs": [
            {"name": "SENTENCE_A", "datatype": "BYTES", "shape": [1, 1], "data": ["one"]},
            {"name": "SENTENCE_B", "datatype": "BYTES", "shape": [1, 1], "data": ["two"]},
        ]
    }
    assert (
        http_request(front_server, "POST", "/v2/models/sentence_similarity/infer", json.dumps(body).encode()).status
        == 200
    )
    model_server.terminate()
    started = time.monotonic()
    reply = http_request(front_server, "POST", "/v2/models/sentence_similarity/infer", json.dumps(body).encode())
    assert time.monotonic() - started < 15
    assert reply.status == 503, reply.body
    error = json.loads(reply.body)["error"]
    # The two sentences' encoder steps, which went to the remote model as one request.
    assert "ensemble 'sentence_similarity' steps 1, 4 (model 'minilm')" in error, error
    assert f"remote model 'minilm': server {remote_url(model_server, protocol)}" in error
    # The front's own models keep serving.
    tokenized = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["still here"]}]}
    assert (
        http_request(front_server, "POST", "/v2/models/tokenizer/infer", json.dumps(tokenized).encode()).status == 200
    )

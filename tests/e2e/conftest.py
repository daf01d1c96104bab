"""One real `inferd serve` subprocess over a repository of models built by code, shared by the
end-to-end tests; clients are tritonclient's and plain HTTP."""

from __future__ import annotations

import gc
import http.client
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from inferd.testing.doors import EveryDoor, serve_every_door
from inferd.testing.models import add_sub_model, cast_model, identity_model, mlp_model, write_config
from inferd.testing.server import ServerProcess, run_server
from inferd.types import DataType

MAX_REQUEST_BYTES = 4 * 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parents[2]
PIPELINE_MODELS = ("minilm", "tokenizer", "mean_pooling", "cosine", "sentence_similarity", "sentence_embedding")


def build_repository(root: Path) -> Path:
    # One identity model per datatype, with no config.pbtxt: inferd completes it from the file.
    for datatype in DataType:
        identity_model(root / f"identity_{datatype.value.lower()}" / "1" / "model.onnx", datatype, ["batch", -1])
    # A model whose answer is BF16 to a request JSON can carry (FP32).
    cast_model(root / "to_bf16" / "1" / "model.onnx", DataType.FP32, DataType.BF16)
    # Inputs given, outputs left to auto-complete.
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    write_config(
        root / "add_sub",
        """
        name: "add_sub"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [
          { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
          { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
        ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        """,
    )
    # Three versions on disk, the latest two served.
    for version in (1, 2, 3):
        mlp_model(root / "mlp" / str(version) / "model.onnx", seed=version)
    write_config(
        root / "mlp",
        """
        max_batch_size: 32
        version_policy: { latest: { num_versions: 2 } }
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
        model_transaction_policy { decoupled: false }
        parameters { key: "version_labels" value { string_value: "stable:2,canary:3" } }
        """,
    )
    for version in (1, 2, 3):
        mlp_model(root / "mlp_specific" / str(version) / "model.onnx", seed=version)
    write_config(root / "mlp_specific", "max_batch_size: 32\nversion_policy: { specific: { versions: [ 1, 3 ] } }")
    # A model without batching: shapes are the dims as they are.
    identity_model(root / "unbatched" / "1" / "model.onnx", DataType.INT32, [2, 3])
    write_config(root / "unbatched", "max_batch_size: 0")
    # Models that must fail alone.
    (root / "broken_file" / "1").mkdir(parents=True)
    (root / "broken_file" / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    mlp_model(root / "bad_config" / "1" / "model.onnx")
    write_config(root / "bad_config", 'max_batch_size: 8\ninput [ { name: "x" data_typo: TYPE_FP32 } ]')
    mlp_model(root / "needs_gpu" / "1" / "model.onnx")
    write_config(root / "needs_gpu", "max_batch_size: 8\ninstance_group [ { kind: KIND_GPU } ]")
    mlp_model(root / "auto_kind" / "1" / "model.onnx")
    write_config(root / "auto_kind", "max_batch_size: 8\ninstance_group [ { kind: KIND_AUTO } ]")
    write_config(root / "no_versions", "max_batch_size: 8")
    # Warm-up with every kind of data; and one whose sample names an input the model lacks.
    mlp_model(root / "warmed" / "1" / "model.onnx")
    (root / "warmed" / "warmup").mkdir(parents=True)
    (root / "warmed" / "warmup" / "x.bin").write_bytes(b"\x00" * 4 * 16 * 2)
    write_config(
        root / "warmed",
        """
        max_batch_size: 8
        instance_group [ { count: 2 kind: KIND_CPU } ]
        model_warmup [
          { name: "zeros" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [16] zero_data: true } } },
          { name: "noise" batch_size: 4 count: 2
            inputs { key: "x" value { data_type: TYPE_FP32 dims: [16] random_data: true } } },
          { name: "file" batch_size: 2
            inputs { key: "x" value { data_type: TYPE_FP32 dims: [16] input_data_file: "x.bin" } } }
        ]
        """,
    )
    mlp_model(root / "bad_warmup" / "1" / "model.onnx")
    write_config(
        root / "bad_warmup",
        """
        max_batch_size: 8
        model_warmup [ { name: "typo" batch_size: 1
                         inputs { key: "xx" value { data_type: TYPE_FP32 dims: [16] zero_data: true } } } ]
        """,
    )
    mlp_model(root / "wrong_dims" / "1" / "model.onnx")
    write_config(root / "wrong_dims", 'max_batch_size: 8\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 17 ] } ]')
    return root


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="session")
def pipeline_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's sentence-similarity pipeline (tokenizer → minilm → mean_pooling → cosine),
    built by the example's own script: the one MiniLM export of the test run, shared."""
    root = tmp_path_factory.mktemp("pipeline")
    subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "build_example_repository.py"),
            "--output",
            str(root),
            "--requests-output",
            str(root / ".requests"),
            "--models",
            *PIPELINE_MODELS,
        ],
        check=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
    )
    return root


@pytest.fixture(scope="session")
def pipeline_server(pipeline_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The pipeline repository served, shared by the pipeline's tests through every door."""
    with run_server(pipeline_repository, tmp_path_factory.mktemp("logs") / "server.log") as server:
        yield server


@pytest.fixture(scope="session")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(repository, log_path, "--max-request-bytes", str(MAX_REQUEST_BYTES)) as process:
        yield process


@pytest.fixture(scope="session")
def every_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EveryDoor]:
    """A server with every REST door on (--sagemaker, explicit model control) over models each door
    can serve (inferd.testing.doors), shared by the OpenAPI conformance test and the fuzz tests;
    whatever a test changes there (a model unloaded, a region registered) it puts back."""
    with serve_every_door(tmp_path_factory.mktemp("every-door")) as door:
        yield door


class Clients:
    """tritonclient clients closed when the test ends, in the test's own thread.

    tritonclient's HTTP client joins a gevent pool when it closes. Left to the garbage collector
    (an exception kept by `pytest.raises` holds one in a reference cycle) it is closed from
    whichever thread runs the next collection, where gevent may have no hub, and whatever test is
    running then fails with an unraisable-exception warning. A client made in a worker thread is
    closed in that thread instead (`with ... as client`).
    """

    def __init__(self) -> None:
        self._made: list[httpclient.InferenceServerClient | grpcclient.InferenceServerClient] = []

    def http(self, url: str) -> httpclient.InferenceServerClient:
        client = httpclient.InferenceServerClient(url)
        self._made.append(client)
        return client

    def grpc(self, url: str) -> grpcclient.InferenceServerClient:
        client = grpcclient.InferenceServerClient(url)
        self._made.append(client)
        return client

    def close(self) -> None:
        for client in self._made:
            client.close()


@pytest.fixture(autouse=True)
def collect_garbage_after_each_test() -> Iterator[None]:
    """Whatever a test leaves in a reference cycle is collected now, in the test's thread, so a
    client it forgot to close fails that test rather than a later one at random."""
    yield
    gc.collect()


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    try:
        yield made
    finally:
        made.close()


@dataclass
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes


def post_binary(server: ServerProcess, model: str, header: dict[str, Any], binary: bytes) -> HttpReply:
    """POST a v2 request whose tensors follow its JSON header (the binary tensor extension)."""
    encoded = orjson.dumps(header)
    return http_request(
        server,
        "POST",
        f"/v2/models/{model}/infer",
        encoded + binary,
        {"Inference-Header-Content-Length": str(len(encoded))},
    )


def http_request(
    server: ServerProcess, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> HttpReply:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return HttpReply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()

"""Answers to clients never name the server's paths: a model's files are named relative to its
folder (`1/model.py`), the repository's location is left out, and ONNX Runtime's source paths never
leave the server; its log keeps all of them. Through tritonclient over HTTP and gRPC against a real
`inferd serve`, with models built by code: one whose graph takes at most 8 positions (MiniLM's 512
in small), Python models that fail to load or raise naming files of their folder, a config.pbtxt
that does not parse."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.testing.models import positions_model, python_model, write_config
from inferd.testing.server import ServerProcess, run_server

pytestmark = pytest.mark.e2e

OPENS_A_MISSING_FILE = """
import os

class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]

    def execute(self, inputs):
        with open(os.path.join(os.path.dirname(__file__), "vocab.txt")) as vocabulary:
            return {"y": inputs["x"] * len(vocabulary.read())}
"""
CLIENTS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paths-repository")
    positions_model(root / "positions" / "1" / "model.onnx", max_positions=8)
    write_config(root / "positions", "max_batch_size: 4")
    python_model(root / "opens_a_file" / "1", OPENS_A_MISSING_FILE)
    python_model(root / "missing_file" / "1", OPENS_A_MISSING_FILE)
    write_config(root / "missing_file", 'backend: "python"\ndefault_model_filename: "absent.py"')
    (root / "bad_config" / "1").mkdir(parents=True)
    write_config(root / "bad_config", "max_batch_size: [ 8")
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("paths-logs") / "server.log"
    args = ("--model-control-mode", "explicit", "--load-model", "positions", "--load-model", "opens_a_file")
    with run_server(repository, logs, *args) as process:
        yield process


def client(server: ServerProcess, protocol: str) -> Any:
    url = server.http_url if protocol == "http" else server.grpc_url
    return CLIENTS[protocol].InferenceServerClient(url)


def answer_to(call: Callable[[], object]) -> str:
    with pytest.raises(InferenceServerException) as raised:
        call()
    return str(raised.value.message())


def assert_no_server_path(message: str, repository: Path) -> None:
    for path in (str(repository), str(repository.resolve()), "/onnxruntime"):
        assert path not in message, message


@pytest.mark.parametrize("protocol", CLIENTS)
def test_an_input_longer_than_the_graph_takes_is_a_400_naming_the_limit(
    server: ServerProcess, repository: Path, protocol: str
) -> None:
    module = CLIENTS[protocol]

    def infer(length: int) -> Any:
        ids = module.InferInput("input_ids", [1, length], "INT64")
        ids.set_data_from_numpy(np.zeros((1, length), dtype=np.int64))
        with client(server, protocol) as connection:
            return connection.infer("positions", [ids])

    assert infer(8).as_numpy("y").shape == (1, 8, 4)
    with pytest.raises(InferenceServerException) as raised:
        infer(9)
    assert raised.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    message = raised.value.message()
    assert "cannot run on these inputs ('input_ids' [1, 9])" in message and "at most 8" in message, message
    assert_no_server_path(message, repository)
    # The log keeps what ONNX Runtime said, with where in its sources.
    assert "onnxruntime/core/providers/cpu/math/element_wise_ops.h" in server.log()


@pytest.mark.parametrize("protocol", CLIENTS)
def test_load_failures_name_files_relative_to_the_models_folder(
    server: ServerProcess, repository: Path, protocol: str
) -> None:
    with client(server, protocol) as connection:
        missing = answer_to(lambda: connection.load_model("missing_file"))
        config = answer_to(lambda: connection.load_model("bad_config"))
        unknown = answer_to(lambda: connection.load_model("nope"))
        x = CLIENTS[protocol].InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
        not_ready = answer_to(lambda: connection.infer("missing_file", [x]))
    assert "model file 1/absent.py not found" in missing, missing
    assert "config.pbtxt" in config, config
    assert "not in the model repository" in unknown, unknown
    assert "1/absent.py" in not_ready, not_ready
    for message in (missing, config, unknown, not_ready):
        assert_no_server_path(message, repository)
    log = server.log()
    assert str(repository / "missing_file" / "1" / "absent.py") in log
    assert str(repository / "bad_config" / "config.pbtxt") in log


@pytest.mark.parametrize("protocol", CLIENTS)
def test_a_models_exception_names_its_files_relative_to_its_folder(
    server: ServerProcess, repository: Path, protocol: str
) -> None:
    x = CLIENTS[protocol].InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    with client(server, protocol) as connection:
        message = answer_to(lambda: connection.infer("opens_a_file", [x]))
    assert "FileNotFoundError" in message and "'1/vocab.txt'" in message, message
    assert_no_server_path(message, repository)
    assert str(repository / "opens_a_file" / "1" / "vocab.txt") in server.log()

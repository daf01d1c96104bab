"""A server with every door on (`--sagemaker`, explicit model control, TF Serving's gRPC port) over
models that every door can reach with a 2xx, for the OpenAPI conformance test and the fuzzers (tests and
`benchmarks/fuzz.py`):

    add_sub             INPUT0, INPUT1 FP32 [-1, 16] -> OUTPUT0 (sum), OUTPUT1 (difference): the
                        model the OpenAPI document's examples name; version label "stable" is 1
    mlp                 x FP32 [-1, 16] -> y [-1, 4]: one input, for SageMaker's .npy and CSV bodies
    sentence_embedding  a Python model, TEXT BYTES [-1, 1] -> a 4-dimension EMBEDDING and TOKENS,
                        served at /openai/v1/embeddings; also TorchServe's raw bodies (a BYTES input)
    scratch             an mlp copy that tests may unload and load again without disturbing the others

and under the SageMaker model root, `mme_add_sub/model` (an add_sub copy) for POST /models.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from inferd.server.openapi.schemas import V2_EXAMPLE
from inferd.testing.models import add_sub_model, mlp_model, python_model, write_config
from inferd.testing.server import ServerProcess, run_server
from inferd.tools.ports import free_ports

SAGEMAKER_MODEL = "mme_add_sub"

EMBEDDING_MODEL = """
import numpy as np


class Model:
    may_run_inline = True

    def execute(self, inputs):
        texts = inputs["TEXT"][:, 0]
        vectors = np.array(
            [[len(t), t.count(b" ") + 1, sum(t) % 97, 1.0] for t in texts], dtype=np.float32
        )
        tokens = np.array([[t.count(b" ") + 1] for t in texts], dtype=np.int64)
        return {"EMBEDDING": vectors, "TOKENS": tokens}
"""


@dataclass(frozen=True, slots=True)
class EveryDoor:
    server: ServerProcess
    repository: Path
    # --sagemaker-model-root: POST /models loads folders under it.
    model_root: Path
    tfserving_grpc_port: int

    @property
    def async_input(self) -> str:
        """An object a SageMaker async invocation may name (a v2 request of add_sub, under the
        server's --async-input-root)."""
        return (self.repository.parent / "async-inputs" / "add_sub.json").as_uri()

    @property
    def sagemaker_url(self) -> str:
        """The `url` of a POST /models that loads SAGEMAKER_MODEL."""
        return str(self.model_root / SAGEMAKER_MODEL / "model")


def build_repository(root: Path) -> Path:
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    write_config(
        root / "add_sub",
        """
        max_batch_size: 8
        parameters { key: "version_labels" value { string_value: "stable:1" } }
        """,
    )
    mlp_model(root / "mlp" / "1" / "model.onnx", seed=1)
    write_config(root / "mlp", "max_batch_size: 32")
    mlp_model(root / "scratch" / "1" / "model.onnx", seed=2)
    write_config(root / "scratch", "max_batch_size: 32")
    python_model(root / "sentence_embedding" / "1", EMBEDDING_MODEL)
    write_config(
        root / "sentence_embedding",
        """
        backend: "python"
        max_batch_size: 32
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [
          { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] },
          { name: "TOKENS" data_type: TYPE_INT64 dims: [ 1 ] }
        ]
        parameters { key: "embedding_input" value { string_value: "TEXT" } }
        parameters { key: "embedding_output" value { string_value: "EMBEDDING" } }
        parameters { key: "embedding_token_count" value { string_value: "TOKENS" } }
        parameters { key: "embedding_dimensions" value { string_value: "truncate" } }
        """,
    )
    return root


def build_model_root(root: Path) -> Path:
    model = root / SAGEMAKER_MODEL / "model"
    add_sub_model(model / "1" / "model.onnx")
    write_config(model, "max_batch_size: 8")
    return root


@contextlib.contextmanager
def serve_every_door(workspace: Path, *extra_args: str) -> Iterator[EveryDoor]:
    """Build the repository and the model root in `workspace` and serve them, every door on."""
    repository = build_repository(workspace / "repository")
    model_root = build_model_root(workspace / "sagemaker-models")
    (workspace / "async-inputs").mkdir(exist_ok=True)
    (workspace / "async-inputs" / "add_sub.json").write_text(json.dumps(V2_EXAMPLE))
    http_port, grpc_port, metrics_port, tfserving_grpc_port = free_ports(4)
    ports = (http_port, grpc_port, metrics_port)
    args = (
        "--sagemaker",
        "--sagemaker-model-root",
        str(model_root),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--tfserving-grpc-port",
        str(tfserving_grpc_port),
        # Async inference too: its jobs kept in the workspace, its inputs read from one folder of it.
        "--state-dir",
        str(workspace / "state"),
        "--async-input-root",
        str(workspace / "async-inputs"),
        *extra_args,
    )
    # With --sagemaker the HTTP port is SageMaker's variable, as the platform sets it.
    env = {"SAGEMAKER_BIND_TO_PORT": str(ports[0])}
    with run_server(repository, workspace / "server.log", *args, ports=ports, env=env) as server:
        yield EveryDoor(server, repository, model_root, tfserving_grpc_port)

"""The docs' door x feature conformance table (docs/call/conformance.md), generated from probes of a real server with every
door on: each row's "inferd" cell is what the probe saw, so the table cannot claim what the server
does not do. The test fails when the page's table differs from the probes' (a stale table);
`INFERD_WRITE_CONFORMANCE=1 pytest tests/e2e/test_conformance.py` rewrites it."""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest

from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc
from inferd.testing.server import ServerProcess, run_server
from inferd.tools.ports import free_ports
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

PAGE = Path(__file__).resolve().parents[2] / "docs" / "call" / "conformance.md"
BEGIN, END = "<!-- conformance:begin -->", "<!-- conformance:end -->"
MLP_ROW = [0.5] * 16


@dataclass(frozen=True)
class Doors:
    server: ServerProcess
    tf_grpc: int
    management: int

    def http(
        self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        raw = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
        reply = http_request(self.server, method, path, raw, headers)
        return reply.status, reply.body

    def management_get(self, path: str) -> tuple[int, bytes]:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", self.management, timeout=10)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def tf_predict(self, request: serving_pb.PredictRequest) -> tuple[str, serving_pb.PredictResponse | None]:
        with grpc.insecure_channel(f"127.0.0.1:{self.tf_grpc}") as channel:
            try:
                return "OK", serving_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
            except grpc.RpcError as error:
                return error.code().name, None

    def tf_unimplemented(self, method: str) -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{self.tf_grpc}") as channel:
            call = channel.unary_unary(f"/tensorflow.serving.PredictionService/{method}")
            try:
                call(b"", timeout=10)
            except grpc.RpcError as error:
                return error.code() is grpc.StatusCode.UNIMPLEMENTED
        return False


@pytest.fixture(scope="module")
def doors(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    http_port, grpc_port, metrics_port, tf_grpc, management = free_ports(5)
    ports = (http_port, grpc_port, metrics_port)
    root = tmp_path_factory.mktemp("opt-ml-models")
    args = (
        "--sagemaker", "--sagemaker-model-root", str(root),
        "--tfserving-grpc-port", str(tf_grpc), "--torchserve-management-port", str(management),
    )  # fmt: skip
    logs = tmp_path_factory.mktemp("logs") / "server.log"
    env = {"SAGEMAKER_BIND_TO_PORT": str(ports[0]), "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "mlp"}
    with run_server(repository, logs, *args, ports=ports, env=env) as server:
        yield Doors(server, tf_grpc, management)


def _tf_request(model: str, dtype: int, shape: list[int], **values: list) -> serving_pb.PredictRequest:
    request = serving_pb.PredictRequest()
    request.model_spec.name = model
    proto = request.inputs["x" if model == "mlp" else "INPUT0"]
    proto.dtype = dtype  # type: ignore[assignment]
    proto.tensor_shape.dim.extend(tf_pb.TensorShapeProto.Dim(size=s) for s in shape)
    for field, data in values.items():
        if field == "tensor_content":
            proto.tensor_content = np.array(data, dtype=np.float32).tobytes()
        else:
            getattr(proto, field).extend(data)
    return request


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


# (door, feature, probe, what the original server does where inferd differs)
Probe = Callable[[Doors], bool]
ROWS: list[tuple[str, str, Probe, str]] = [
    ("TF Serving REST", "predict, row format (`instances`, named or not)",
     lambda d: d.http("POST", "/v1/models/mlp:predict", {"instances": [MLP_ROW]})[0] == 200, ""),
    ("TF Serving REST", "predict, columnar format (`inputs`)",
     lambda d: d.http("POST", "/v1/models/add_sub:predict", {"inputs": {"INPUT0": [MLP_ROW], "INPUT1": [MLP_ROW]}})[0] == 200, ""),
    ("TF Serving REST", "versions and labels (`/versions/3`, `/labels/stable`)",
     lambda d: d.http("POST", "/v1/models/mlp/labels/stable:predict", {"instances": [MLP_ROW]})[0] == 200,
     "labels come from the model's `version_labels` parameter, not a server config file"),
    ("TF Serving REST", "`{\"b64\": ...}` strings",
     lambda d: d.http("POST", "/v1/models/identity_bytes:predict", {"instances": [[{"b64": base64.b64encode(b"\xff").decode()}]]})[1]
     == b'{"predictions":[[{"b64":"/w=="}]]}',
     "strings that are not UTF-8 come back as b64 too (TF Serving writes invalid JSON)"),
    ("TF Serving REST", "model status and metadata (signature_def)",
     lambda d: d.http("GET", "/v1/models/mlp")[0] == 200 and d.http("GET", "/v1/models/mlp/metadata")[0] == 200, ""),
    ("TF Serving REST", "FP16 inputs from JSON numbers are served",
     lambda d: d.http("POST", "/v1/models/identity_fp16:predict", {"instances": [[1.5]]})[0] == 200,
     "TF Serving answers 501 (half from JSON is not implemented)"),
    ("TF Serving REST", "`:classify`, `:regress` answer 501",
     lambda d: d.http("POST", "/v1/models/mlp:classify", {"examples": []})[0] == 501,
     "TF Serving runs them on Example-based signatures inferd does not have"),
    ("TF Serving gRPC", "Predict: `*_val` fields and `tensor_content`",
     lambda d: d.tf_predict(_tf_request("mlp", tf_pb.DT_FLOAT, [1, 16], float_val=MLP_ROW))[0] == "OK"
     and d.tf_predict(_tf_request("mlp", tf_pb.DT_FLOAT, [1, 16], tensor_content=MLP_ROW))[0] == "OK", ""),
    ("TF Serving gRPC", "Predict: DT_HALF in `half_val`",
     lambda d: d.tf_predict(_tf_request("identity_fp16", tf_pb.DT_HALF, [1, 1], half_val=[15872]))[0] == "OK", ""),
    ("TF Serving gRPC", "Classify, Regress, MultiInference answer UNIMPLEMENTED",
     lambda d: all(d.tf_unimplemented(m) for m in ("Classify", "Regress", "MultiInference")),
     "TF Serving runs them on Example-based signatures"),
    ("SageMaker", "`/ping`, `/invocations` with a v2 or TF Serving JSON body",
     lambda d: d.http("GET", "/ping")[0] == 200
     and d.http("POST", "/invocations", {"instances": [MLP_ROW]}, {"Content-Type": "application/json"})[0] == 200, ""),
    ("SageMaker", "`application/x-npy` and `text/csv` bodies and answers",
     lambda d: d.http("POST", "/invocations", _npy(np.ones((1, 16))), {"Content-Type": "application/x-npy", "Accept": "text/csv"})[0] == 200, ""),
    ("SageMaker", "an unsupported Content-Type / Accept is 415 / 406",
     lambda d: d.http("POST", "/invocations", b"x", {"Content-Type": "image/png"})[0] == 415,
     "the inference toolkit answers 500"),
    ("SageMaker", "multi-model endpoints (`/models`, `/models/{m}/invoke`)",
     lambda d: d.http("GET", "/models")[0] == 200 and d.http("POST", "/models/ghost/invoke", {})[0] == 404, ""),
    ("OpenAI", "`GET /openai/v1/models`",
     lambda d: d.http("GET", "/openai/v1/models")[0] == 200, "lists the models that declare `embedding_input`"),
    ("OpenAI", "`input` as token ids is a 400 (send text)",
     lambda d: d.http("POST", "/openai/v1/embeddings", {"model": "mlp", "input": [[1, 2]]})[0] == 400,
     "OpenAI accepts token ids; inferd's models tokenize their own text"),
    ("TorchServe", "`POST /predictions/{m}[/{v}]` (JSON or raw body)",
     lambda d: d.http("POST", "/predictions/mlp/3", [MLP_ROW], {"Content-Type": "application/json"})[0] == 200, ""),
    ("TorchServe", "management: `GET /models`, `GET /models/{m}`",
     lambda d: d.management_get("/models")[0] == 200 and d.management_get("/models/mlp")[0] == 200,
     "read side only: register, scale and unregister are inferd's repository API"),
]  # fmt: skip


def table(results: list[bool]) -> str:
    lines = ["| door | what inferd does | probe | where the original server differs |", "|---|---|---|---|"]
    for (door, feature, _, note), ok in zip(ROWS, results, strict=True):
        lines.append(f"| {door} | {feature} | {'passes' if ok else 'FAILS'} | {note} |")
    return "\n".join(lines)


def test_conformance_table_is_what_the_server_does(doors: Doors) -> None:
    results = [probe(doors) for _, _, probe, _ in ROWS]
    generated = table(results)
    failed = [f"{door}: {feature}" for (door, feature, _, _), ok in zip(ROWS, results, strict=True) if not ok]
    assert not failed, failed
    text = PAGE.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    current = rest.partition(END)[0].strip()
    if os.environ.get("INFERD_WRITE_CONFORMANCE") == "1":
        PAGE.write_text(f"{head}{BEGIN}\n{generated}\n{END}{tail}", encoding="utf-8")
        current = generated
    assert current == generated, "docs/call/conformance.md's table is stale: INFERD_WRITE_CONFORMANCE=1 rewrites it"

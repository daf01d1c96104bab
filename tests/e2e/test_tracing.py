"""OpenTelemetry tracing end to end: a real `inferd serve` exporting by OTLP/gRPC to a real receiver
on 127.0.0.1 (inferd.testing.otlp), requests by several doors carrying W3C traceparents. Waits
are bounded polls of the receiver and of the server's metrics, never sleeps."""

from __future__ import annotations

import json
import os
import queue
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inferd.protocol.tfserving_grpc import tensor_to_proto
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2, tensorflow_serving_pb2_grpc
from inferd.testing.models import add_sub_model, python_model, sleepy_model, write_config
from inferd.testing.otlp import OtlpReceiver, ReceivedSpan
from inferd.testing.server import ServerProcess, free_port, run_server
from inferd.types import DataType, Tensor
from tests.e2e.conftest import HttpReply, http_request
from tests.e2e.test_batching import wait_until_in_flight
from tests.e2e.test_observability import sample, scrape
from tests.e2e.test_triton_aio import COUNTER

pytestmark = pytest.mark.e2e

SERVER, INTERNAL = 2, 1  # OTLP's span kinds
ERROR = 2  # OTLP's status code
CHILDREN = ("decode", "queue", "batch-wait", "compute", "encode")
# Spans leave the server's batch span processor every 20 ms instead of every 5 s.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "20"}
# Tracing is configured by each test's server alone, whatever the environment running the tests says.
NO_OTEL = {name: "" for name in os.environ if name.startswith("OTEL_")}


@dataclass(frozen=True)
class ClientSpan:
    """The client's side of a W3C traceparent."""

    trace_id: str
    span_id: str
    sampled: bool = True

    @classmethod
    def new(cls, sampled: bool = True) -> ClientSpan:
        return cls(secrets.token_hex(16), secrets.token_hex(8), sampled)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"

    def headers(self) -> dict[str, str]:
        return {"traceparent": self.traceparent, "tracestate": "client=7,other=x"}


def build_repository(root: Path, hold_file: Path) -> Path:
    python_model(root / "counter" / "1", COUNTER)  # decoupled: n responses to a request for n
    write_config(root / "counter", 'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }')
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    write_config(root / "add_sub", "max_batch_size: 8\ndynamic_batching { }")
    add_sub_model(root / "add_sub_unbatched" / "1" / "model.onnx")
    write_config(root / "add_sub_unbatched", "max_batch_size: 8")
    # One instance, held while the hold file exists: requests that come meanwhile queue, and go
    # as one batch when it is removed, on any machine.
    sleepy_model(
        root / "held",
        sleep_ms=0,
        max_batch_size=8,
        hold_file=hold_file,
        config="dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]",
    )
    return root


@pytest.fixture(scope="module")
def hold_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, hold_file: Path) -> Path:
    return build_repository(tmp_path_factory.mktemp("traced"), hold_file)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def tfserving_grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def traced(
    repository: Path, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory, tfserving_grpc_port: int
) -> Iterator[ServerProcess]:
    """Tracing on by the flag, every request sampled (the default ratio); TF Serving's gRPC door too."""
    log = tmp_path_factory.mktemp("logs") / "server.log"
    args = ("--otlp-endpoint", receiver.endpoint, "--tfserving-grpc-port", str(tfserving_grpc_port))
    with run_server(repository, log, *args, env={**NO_OTEL, **FAST_EXPORT}) as server:
        yield server


# -- helpers ------------------------------------------------------------------------------------


def v2_body(rows: int = 1, width: int = 16) -> bytes:
    data = [1.0] * rows * width
    tensors = [{"name": n, "datatype": "FP32", "shape": [rows, width], "data": data} for n in ("INPUT0", "INPUT1")]
    return json.dumps({"inputs": tensors}).encode()


def post(server: ServerProcess, path: str, body: bytes, client: ClientSpan | None) -> HttpReply:
    headers = {"Content-Type": "application/json", **(client.headers() if client else {})}
    return http_request(server, "POST", path, body, headers)


def trace(receiver: OtlpReceiver, client: ClientSpan, children: tuple[str, ...] = CHILDREN) -> list[ReceivedSpan]:
    """The spans of the client's trace, once its request span and `children` arrived."""

    def arrived(spans: list[ReceivedSpan]) -> bool:
        names = {s.name for s in spans if s.trace_id == client.trace_id}
        return set(children) <= names and any(name.startswith("infer") for name in names)

    spans = receiver.wait_for(arrived, what=f"the spans of trace {client.trace_id}")
    return [s for s in spans if s.trace_id == client.trace_id]


def add_sub_inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        inputs.append(tensor)
    return inputs


def request_span(spans: list[ReceivedSpan]) -> ReceivedSpan:
    found = [s for s in spans if s.kind == SERVER]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def children_of(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans if s.parent_span_id == parent.span_id}


def execution_of(receiver: OtlpReceiver, compute: ReceivedSpan) -> ReceivedSpan:
    """The execution span the compute span links to (in a trace of its own)."""
    assert len(compute.links) == 1, compute.links
    trace_id, span_id = compute.links[0]
    spans = receiver.wait_for(lambda spans: any(s.span_id == span_id for s in spans), what="the execution span")
    (execution,) = [s for s in spans if s.span_id == span_id]
    assert execution.trace_id == trace_id and execution.name.startswith("execute ")
    return execution


# -- the span model -----------------------------------------------------------------------------


def test_a_kserve_request_continues_the_clients_trace_with_its_time_split(
    traced: ServerProcess, receiver: OtlpReceiver
) -> None:
    client = ClientSpan.new()
    reply = post(traced, "/v2/models/add_sub/infer", v2_body(rows=2), client)
    assert reply.status == 200
    spans = trace(receiver, client)
    root = request_span(spans)
    assert root.parent_span_id == client.span_id
    assert root.trace_state == "client=7,other=x"
    assert root.name == "infer add_sub"
    assert root.service_name == "inferd"
    assert root.attributes["inferd.model.name"] == "add_sub"
    assert root.attributes["inferd.model.version"] == "1"
    assert root.attributes["inferd.protocol"] == "kserve_http"
    assert root.attributes["inferd.request.id"] == reply.headers["x-request-id"]
    assert root.attributes["inferd.request.rows"] == 2
    assert root.attributes["inferd.batch.size"] == 2
    assert root.attributes["http.response.status_code"] == 200
    assert root.status_code != ERROR
    children = children_of(spans, root)
    assert set(children) == set(CHILDREN)
    for child in children.values():
        assert child.kind == INTERNAL
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns, child.name
    assert children["decode"].start_ns == root.start_ns and children["encode"].end_ns == root.end_ns
    assert children["queue"].end_ns <= children["batch-wait"].start_ns + 1
    assert children["batch-wait"].end_ns <= children["compute"].start_ns + 1
    # The execution that served it is its own span, linked both ways.
    execution = execution_of(receiver, children["compute"])
    assert execution.trace_id != client.trace_id and execution.parent_span_id == ""
    assert execution.links == ((client.trace_id, root.span_id),)
    assert execution.attributes["inferd.model.name"] == "add_sub"
    assert execution.attributes["inferd.batch.size"] == 2
    assert execution.attributes["inferd.batch.requests"] == 1


def test_a_malformed_traceparent_starts_a_trace_of_its_own(traced: ServerProcess, receiver: OtlpReceiver) -> None:
    headers = {"Content-Type": "application/json", "traceparent": "00-not-a-trace-01"}
    reply = http_request(traced, "POST", "/v2/models/add_sub/infer", v2_body(), headers)
    assert reply.status == 200
    request_id = reply.headers["x-request-id"]

    def arrived(spans: list[ReceivedSpan]) -> bool:
        return any(s.attributes.get("inferd.request.id") == request_id for s in spans)

    (root,) = [s for s in receiver.wait_for(arrived) if s.attributes.get("inferd.request.id") == request_id]
    assert root.parent_span_id == "" and root.kind == SERVER


@pytest.mark.parametrize(
    ("door", "path", "body", "children"),
    [
        pytest.param(
            "tfserving_rest",
            "/v1/models/add_sub:predict",
            json.dumps({"instances": [{"INPUT0": [1.0] * 16, "INPUT1": [2.0] * 16}]}).encode(),
            CHILDREN,
            id="tfserving_rest",
        ),
        # TorchServe's door does not time its encoding: no encode span.
        pytest.param("torchserve", "/predictions/add_sub", v2_body(), CHILDREN[:-1], id="torchserve"),
    ],
)
def test_other_http_doors_continue_the_trace(
    traced: ServerProcess, receiver: OtlpReceiver, door: str, path: str, body: bytes, children: tuple[str, ...]
) -> None:
    client = ClientSpan.new()
    assert post(traced, path, body, client).status == 200
    spans = trace(receiver, client, children)
    root = request_span(spans)
    assert root.parent_span_id == client.span_id
    assert root.attributes["inferd.protocol"] == door
    assert set(children) <= set(children_of(spans, root))


def test_a_grpc_request_continues_the_trace_from_its_metadata(traced: ServerProcess, receiver: OtlpReceiver) -> None:
    client = ClientSpan.new()
    with grpcclient.InferenceServerClient(traced.grpc_url) as grpc_client:
        grpc_client.infer("add_sub_unbatched", add_sub_inputs(), headers=client.headers())
    spans = trace(receiver, client)
    root = request_span(spans)
    assert root.parent_span_id == client.span_id
    assert root.trace_state == "client=7,other=x"
    assert root.name == "infer add_sub_unbatched"
    assert root.attributes["inferd.protocol"] == "kserve_grpc"
    assert root.attributes["rpc.system"] == "grpc"
    assert root.attributes["rpc.method"] == "ModelInfer"
    assert root.attributes["rpc.grpc.status_code"] == 0
    # A model without a batcher: its execution is a span too, of one request.
    execution = execution_of(receiver, children_of(spans, root)["compute"])
    assert execution.links == ((client.trace_id, root.span_id),)
    assert execution.attributes["inferd.batch.requests"] == 1


def test_each_request_of_a_grpc_stream_is_a_span_continuing_the_stream_s_trace(
    traced: ServerProcess, receiver: OtlpReceiver
) -> None:
    client = ClientSpan.new()
    results: queue.Queue[tuple[object, object]] = queue.Queue()
    n = grpcclient.InferInput("n", [1], "INT32")
    n.set_data_from_numpy(np.array([3], dtype=np.int32))
    pair = add_sub_inputs()
    with grpcclient.InferenceServerClient(traced.grpc_url) as grpc_client:
        grpc_client.start_stream(callback=lambda result, error: results.put((result, error)), headers=client.headers())
        grpc_client.async_stream_infer("counter", [n])  # decoupled: three responses
        grpc_client.async_stream_infer("add_sub_unbatched", pair)
        grpc_client.async_stream_infer("no_such_model", pair)  # an error sent in the stream
        answers = [results.get(timeout=30) for _ in range(5)]
        grpc_client.stop_stream()
    assert sum(error is not None for _, error in answers) == 1

    def requests_ended(spans: list[ReceivedSpan]) -> bool:
        return len([s for s in spans if s.trace_id == client.trace_id and s.kind == SERVER]) == 3

    spans = [s for s in receiver.wait_for(requests_ended, what="three request spans") if s.trace_id == client.trace_id]
    roots = {s.name: s for s in spans if s.kind == SERVER}
    assert set(roots) == {"infer counter", "infer add_sub_unbatched", "infer no_such_model"}
    for root in roots.values():
        assert root.parent_span_id == client.span_id and root.trace_state == "client=7,other=x"
        assert root.attributes["rpc.method"] == "ModelStreamInfer"
        assert root.attributes["inferd.protocol"] == "kserve_grpc"
    assert set(CHILDREN) <= set(children_of(spans, roots["infer add_sub_unbatched"]))
    assert {"decode", "encode"} <= set(children_of(spans, roots["infer counter"]))
    assert roots["infer counter"].status_code != ERROR
    failed = roots["infer no_such_model"]
    assert failed.status_code == ERROR and failed.attributes["inferd.error.code"] == "MODEL_NOT_FOUND"


def test_a_streamed_request_whose_stream_closes_is_a_cancelled_span(
    traced: ServerProcess, receiver: OtlpReceiver, hold_file: Path
) -> None:
    client = ClientSpan.new()
    x = grpcclient.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    hold_file.touch()
    try:
        with grpcclient.InferenceServerClient(traced.grpc_url) as grpc_client:
            grpc_client.start_stream(callback=lambda result, error: None, headers=client.headers())
            grpc_client.async_stream_infer("held", [x])
            wait_until_in_flight(traced, "held")
            grpc_client.stop_stream(cancel_requests=True)  # the client goes before its answer
    finally:
        hold_file.unlink()

    def roots(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in spans if s.trace_id == client.trace_id and s.kind == SERVER]

    (root,) = roots(receiver.wait_for(lambda spans: bool(roots(spans)), what="the request span"))
    assert root.name == "infer held" and root.status_code == ERROR
    assert root.attributes["inferd.error.code"] == "CANCELLED"


def test_a_tfserving_grpc_predict_continues_the_trace(
    traced: ServerProcess, receiver: OtlpReceiver, tfserving_grpc_port: int
) -> None:
    client = ClientSpan.new()
    message = tensorflow_serving_pb2.PredictRequest()
    message.model_spec.name = "add_sub"
    for name in ("INPUT0", "INPUT1"):
        data = np.ones((1, 16), np.float32)
        message.inputs[name].CopyFrom(tensor_to_proto(Tensor(name, DataType.FP32, data.shape, data)))
    with grpc.insecure_channel(f"127.0.0.1:{tfserving_grpc_port}") as channel:
        stub = tensorflow_serving_pb2_grpc.PredictionServiceStub(channel)
        stub.Predict(message, metadata=tuple(client.headers().items()), timeout=30)
    spans = trace(receiver, client)
    root = request_span(spans)
    assert root.parent_span_id == client.span_id
    assert root.attributes["inferd.protocol"] == "tfserving_grpc"
    assert root.attributes["rpc.service"] == "tensorflow.serving.PredictionService"
    assert root.attributes["rpc.grpc.status_code"] == 0
    assert set(children_of(spans, root)) == set(CHILDREN)


def test_a_batch_is_one_span_linked_to_every_request_in_it(
    traced: ServerProcess, receiver: OtlpReceiver, hold_file: Path
) -> None:
    clients = [ClientSpan.new() for _ in range(4)]
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}).encode()
    replies: dict[int, HttpReply] = {}

    def send(index: int) -> None:
        replies[index] = post(traced, "/v2/models/held/infer", body, clients[index])

    hold_file.touch()
    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    try:
        threads[0].start()
        wait_until_in_flight(traced, "held")  # the first runs, held: the only instance is busy
        for thread in threads[1:]:
            thread.start()
        wait_until_queued(traced, "held", 3)
    finally:
        hold_file.unlink()
        for thread in threads:
            thread.join(timeout=60)
    assert [replies[i].status for i in range(4)] == [200] * 4
    roots = [request_span(trace(receiver, client)) for client in clients]
    computes = [children_of(trace(receiver, c), root)["compute"] for c, root in zip(clients, roots, strict=True)]
    executions = [execution_of(receiver, compute) for compute in computes]
    # The first ran alone; the three that queued behind it, together.
    assert executions[0].links == ((clients[0].trace_id, roots[0].span_id),)
    batch = executions[1]
    assert executions[2] == executions[3] == batch
    assert set(batch.links) == {(c.trace_id, root.span_id) for c, root in zip(clients[1:], roots[1:], strict=True)}
    assert batch.attributes["inferd.batch.requests"] == 3
    assert batch.attributes["inferd.batch.size"] == 3
    assert all(root.attributes["inferd.batch.size"] == 3 for root in roots[1:])
    assert batch.start_ns <= min(c.start_ns for c in computes[1:])
    assert batch.end_ns >= max(c.end_ns for c in computes[1:])


def wait_until_queued(server: ServerProcess, model: str, count: int) -> None:
    """Until `count` requests of `model` wait in its batcher's queue (polled, bounded)."""
    import time

    deadline = time.monotonic() + 60
    while sample(scrape(server), "inferd_queue_depth", missing=0.0, model=model) < count:
        assert time.monotonic() < deadline, f"never {count} request(s) of {model} queued"
        time.sleep(0.005)


# -- failures -----------------------------------------------------------------------------------


def test_a_failed_http_request_is_an_error_span(traced: ServerProcess, receiver: OtlpReceiver) -> None:
    client = ClientSpan.new()
    reply = post(traced, "/v2/models/add_sub/infer", v2_body(width=15), client)
    assert reply.status == 400
    code = json.loads(reply.body)["code"]
    root = request_span(trace(receiver, client, ("decode",)))
    assert root.status_code == ERROR and root.status_message
    assert root.attributes["inferd.error.code"] == code
    assert root.attributes["http.response.status_code"] == 400
    assert root.attributes["inferd.model.name"] == "add_sub"


def test_a_failed_grpc_request_is_an_error_span(traced: ServerProcess, receiver: OtlpReceiver) -> None:
    client = ClientSpan.new()
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    with grpcclient.InferenceServerClient(traced.grpc_url) as grpc_client, pytest.raises(InferenceServerException):
        grpc_client.infer("no_such_model", [tensor], headers=client.headers())
    root = request_span(trace(receiver, client, ("decode",)))
    assert root.parent_span_id == client.span_id
    assert root.name == "infer no_such_model"
    assert root.status_code == ERROR and "no_such_model" in root.status_message
    assert root.attributes["inferd.error.code"] == "MODEL_NOT_FOUND"
    assert root.attributes["rpc.grpc.status_code"] == 5  # NOT_FOUND


# -- configuration ------------------------------------------------------------------------------


def test_environment_configures_tracing_and_the_ratio_leaves_parents_decisions(
    repository: Path, tmp_path: Path
) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_SERVICE_NAME alone turn tracing on; at ratio 0 only
    requests whose client sampled them are traced."""
    with OtlpReceiver() as own:
        env = {**NO_OTEL, **FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": own.endpoint, "OTEL_SERVICE_NAME": "scorer"}
        with run_server(repository, tmp_path / "server.log", "--trace-sample-ratio", "0", env=env) as server:
            not_sampled = ClientSpan.new(sampled=False)
            assert post(server, "/v2/models/add_sub/infer", v2_body(), None).status == 200
            assert post(server, "/v2/models/add_sub/infer", v2_body(), not_sampled).status == 200
            sampled = ClientSpan.new()
            assert post(server, "/v2/models/add_sub/infer", v2_body(), sampled).status == 200
            spans = trace(own, sampled)
            # The two earlier requests ended first: their spans would have left in the same export or before.
            everything = own.spans()
        assert request_span(spans).service_name == "scorer"
        assert {s.trace_id for s in everything if not s.name.startswith("execute ")} == {sampled.trace_id}
        executions = [s for s in everything if s.name.startswith("execute ")]
        assert executions and all(link[0] == sampled.trace_id for s in executions for link in s.links)


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="nothing-configured"),
        pytest.param({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "RECEIVER"}, id="exporter-none"),
    ],
)
def test_without_tracing_the_server_imports_no_opentelemetry_and_exports_nothing(
    repository: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    log = tmp_path / "server.log"
    with OtlpReceiver() as own:
        server_env = {**NO_OTEL, **{k: own.endpoint if v == "RECEIVER" else v for k, v in env.items()}}
        # Python writes every module it imports to stderr, the server's log.
        server_env["PYTHONPROFILEIMPORTTIME"] = "1"
        with run_server(repository, log, env=server_env) as server:
            client = ClientSpan.new()
            assert post(server, "/v2/models/add_sub/infer", v2_body(), client).status == 200
            assert http_request(server, "GET", "/v2/health/ready").status == 200
        # Stopped: an exporter, had there been one, would have flushed what it held.
        imports = [line for line in log.read_text().splitlines() if line.startswith("import time:")]
        assert any("inferd.server.app" in line for line in imports), "the import log is missing"
        assert not [line for line in imports if "opentelemetry" in line]
        assert own.count == 0 and own.exports == 0


def test_tracing_without_opentelemetry_installed_is_a_clear_error(repository: Path, tmp_path: Path) -> None:
    # A site customization that hides OpenTelemetry, as an install without the tracing extra would.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class HideOpenTelemetry:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'opentelemetry':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, HideOpenTelemetry())\n"
    )
    pythonpath = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    completed = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository),
         "--otlp-endpoint", "http://127.0.0.1:4317"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **NO_OTEL, "PYTHONPATH": pythonpath},
    )  # fmt: skip
    assert completed.returncode == 2, completed.stderr
    assert "OpenTelemetry is not installed" in completed.stderr
    assert "pip install 'inferd[tracing]'" in completed.stderr

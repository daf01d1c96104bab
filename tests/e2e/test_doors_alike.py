"""Every door admits, times and counts alike (issue 29, "What users must see"): one table of the
eight entry points (SageMaker's in its three bodies), and for each door

- a body it cannot decode, sent while the model's queue is full, is answered with that door's own
  "overloaded, retry" (no decoding error): the refusal comes before the body is read;
- N requests add exactly N to the model's statistics and to the `inferd_*` metrics under that
  door's `protocol` label, with a non-zero encode time;
- asked with `Inferd-Server-Timing: 1`, it answers the time split (a header over HTTP, trailing
  metadata over gRPC; a stream's answers carry neither, so the stream has no row there);
- an ensemble reached through it still counts its steps in the step model's statistics.

A new door is one row of DOORS. One server serves every door over one model, `held`, that each
door can feed (one BYTES input: the OpenAI door's `embedding_input`, TorchServe's raw body,
SageMaker's single-array bodies). Its queue holds one request, executing ones included, and its
executions wait while a file the test controls exists, so "full" holds by construction on any
machine; the tests wait on the server's own gauges, never on sleeps.

Clients: the `openai` package for OpenAI; tritonclient's request builder (HTTP) and its compiled
messages (gRPC) for v2, since its clients show neither response headers nor trailers; tritonclient's
stream client for ModelStreamInfer; TF Serving's messages compiled in inferd.protocol.tfserving_pb;
plain HTTP for SageMaker and TorchServe (what their clients send).
"""

from __future__ import annotations

import io
import json
import queue
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import openai
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferd.protocol import server_timing
from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc
from inferd.testing.models import python_model, write_config
from inferd.testing.server import ServerProcess, free_port, run_server
from tests.e2e.conftest import http_request
from tests.e2e.test_observability import sample, scrape

pytestmark = pytest.mark.e2e

HELD = "held"  # the model whose queue the tests fill
PIPELINE = "held_pipeline"  # an ensemble of one step, STEP
STEP = "step_text"
TEXT = "hello doors"
# Requests per door in the counting tests: more than one, so "once per request" shows.
N = 3
PHASES = ("decode", "queue", "batch-wait", "compute", "encode")
TIMED = {server_timing.REQUEST_HEADER: "1"}
# What every overload refusal says, whatever the door's shape around it.
RETRY = "retry later"
# A counter read right after an answer may still be on its way (a stream's request ends after its
# answer is sent): the counting tests wait this long, at most, for the numbers to arrive.
SETTLE_S = 10.0

# Embeds each text as (length, 1, 2, 3); waits first while the hold file exists (bounded).
TEXT_MODEL = """
import os
import time

import numpy as np


class Model:
    def initialize(self, args):
        self.hold = args["parameters"].get("hold_file", "")

    def execute(self, inputs):
        deadline = time.monotonic() + 60
        while self.hold and os.path.exists(self.hold) and time.monotonic() < deadline:
            time.sleep(0.005)
        texts = inputs["TEXT"][:, 0]
        vectors = np.array([[len(t), 1.0, 2.0, 3.0] for t in texts], dtype=np.float32)
        tokens = np.array([[t.count(b" ") + 1] for t in texts], dtype=np.int64)
        return {"EMBEDDING": vectors, "TOKENS": tokens}
"""
TENSORS = """
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "TOKENS" data_type: TYPE_INT64 dims: [ 1 ] }
]
parameters { key: "embedding_input" value { string_value: "TEXT" } }
parameters { key: "embedding_output" value { string_value: "EMBEDDING" } }
parameters { key: "embedding_token_count" value { string_value: "TOKENS" } }
parameters { key: "torchserve_body_input" value { string_value: "TEXT" } }
"""


@dataclass(frozen=True, slots=True)
class Doors:
    server: ServerProcess
    tfserving_grpc_port: int
    hold_file: Path


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    root = tmp_path_factory.mktemp("repository")
    hold_file = tmp_path_factory.mktemp("hold") / "hold"
    python_model(root / HELD / "1", TEXT_MODEL)
    write_config(
        root / HELD,
        f"""
        backend: "python"
        {TENSORS}
        dynamic_batching {{ default_queue_policy {{ max_queue_size: 1 }} }}
        parameters {{ key: "hold_file" value {{ string_value: "{hold_file}" }} }}
        """,
    )
    python_model(root / STEP / "1", TEXT_MODEL)
    write_config(root / STEP, f'backend: "python"\n{TENSORS}')
    write_config(
        root / PIPELINE,
        f"""
        platform: "ensemble"
        {TENSORS}
        ensemble_scheduling {{ step [ {{
          model_name: "{STEP}" model_version: -1
          input_map {{ key: "TEXT" value: "TEXT" }}
          output_map {{ key: "EMBEDDING" value: "EMBEDDING" }}
          output_map {{ key: "TOKENS" value: "TOKENS" }}
        }} ] }}
        """,
    )
    port = free_port()
    logs = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(root, logs, "--tfserving-grpc-port", str(port)) as server:
        yield Doors(server, port, hold_file)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a door answered, one shape for all: `status` is the HTTP status, the gRPC code's name,
    or STREAM_OK / STREAM_ERROR; `headers` the HTTP headers or the gRPC trailing metadata (names in
    lower case); `body` the HTTP body, the gRPC details, or the stream's error_message."""

    status: int | str
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


# --- HTTP doors --------------------------------------------------------------------------------


def post(doors: Doors, path: str, body: bytes, headers: dict[str, str]) -> Answer:
    reply = http_request(doors.server, "POST", path, body, headers)
    return Answer(reply.status, reply.headers, reply.body)


def json_error(answer: Answer) -> dict[str, Any]:
    assert answer.headers.get("content-type", "").startswith("application/json"), answer
    document = orjson.loads(answer.body)
    assert isinstance(document, dict), answer
    return document


def kserve_overloaded(answer: Answer) -> None:
    """v2's `{"error": ...}` with inferd's code, 503 and Retry-After (TF Serving REST and SageMaker
    answer in the same shape: TF Serving's error body is `{"error": ...}` too)."""
    assert answer.status == 503, answer
    error = json_error(answer)
    assert error["code"] == "OVERLOADED" and RETRY in error["error"], answer
    assert int(answer.headers["retry-after"]) >= 1, answer


def kserve_refused(answer: Answer) -> None:
    assert answer.status == 400, answer
    assert "error" in json_error(answer), answer


def v2_rest_infer(doors: Doors, model: str, headers: dict[str, str]) -> Answer:
    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[TEXT.encode()]], dtype=object), binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor])
    framing = {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
    return post(doors, f"/v2/models/{model}/infer", body, {**framing, **headers})


def v2_rest_undecodable(doors: Doors, model: str) -> Answer:
    return post(doors, f"/v2/models/{model}/infer", b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [', {})


def tf_rest_infer(doors: Doors, model: str, headers: dict[str, str]) -> Answer:
    return post(doors, f"/v1/models/{model}:predict", orjson.dumps({"instances": [[TEXT]]}), headers)


def tf_rest_undecodable(doors: Doors, model: str) -> Answer:
    return post(doors, f"/v1/models/{model}:predict", b'{"instances": [[', {})


def invocation(doors: Doors, model: str, content_type: str, body: bytes, headers: dict[str, str]) -> Answer:
    target = {"Content-Type": content_type, "X-Amzn-SageMaker-Target-Model": model}
    return post(doors, "/invocations", body, {**target, **headers})


def sagemaker_json_infer(doors: Doors, model: str, headers: dict[str, str]) -> Answer:
    return invocation(doors, model, "application/json", orjson.dumps({"instances": [[TEXT]]}), headers)


def sagemaker_json_undecodable(doors: Doors, model: str) -> Answer:
    return invocation(doors, model, "application/json", b'{"instances": [[', {})


def sagemaker_npy_infer(doors: Doors, model: str, headers: dict[str, str]) -> Answer:
    buffer = io.BytesIO()
    np.save(buffer, np.array([[TEXT]]))  # a unicode array: no pickled objects
    return invocation(doors, model, "application/x-npy", buffer.getvalue(), headers)


def sagemaker_npy_undecodable(doors: Doors, model: str) -> Answer:
    return invocation(doors, model, "application/x-npy", b"\x93NUMPY this is no array", {})


def sagemaker_csv_infer(doors: Doors, model: str, headers: dict[str, str]) -> Answer:
    return invocation(doors, model, "text/csv", f"{TEXT}\n".encode(), headers)


def sagemaker_csv_undecodable(doors: Doors, model: str) -> Answer:
    return invocation(doors, model, "text/csv", b"\xff\xfe not UTF-8\n", {})


def torchserve_infer(doors: Doors, model: str, headers: dict[str, str]) -> Answer:
    # No Content-Type, as `curl -T` and `requests.post(data=...)` send: the raw body is the text.
    return post(doors, f"/predictions/{model}", TEXT.encode(), headers)


def torchserve_undecodable(doors: Doors, model: str) -> Answer:
    return post(doors, f"/predictions/{model}", b'{"TEXT": [', {"Content-Type": "application/json"})


def torchserve_overloaded(answer: Answer) -> None:
    """TorchServe's `{"code", "type", "message"}`, with inferd's code as `error_code`."""
    assert answer.status == 503, answer
    error = json_error(answer)
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableException", answer
    assert error["error_code"] == "OVERLOADED" and RETRY in error["message"], answer
    assert int(answer.headers["retry-after"]) >= 1, answer


def torchserve_refused(answer: Answer) -> None:
    assert answer.status == 400, answer
    assert json_error(answer)["type"] == "BadRequestException", answer


def openai_client(doors: Doors) -> openai.OpenAI:
    # No retries: the client would otherwise retry a 503 itself, after its Retry-After.
    return openai.OpenAI(
        base_url=f"http://{doors.server.http_url}/openai/v1", api_key="unused", max_retries=0, timeout=30
    )


def openai_infer(doors: Doors, model: str, headers: dict[str, str]) -> Answer:
    with openai_client(doors) as client:
        raw = client.embeddings.with_raw_response.create(
            model=model, input=TEXT, encoding_format="float", extra_headers=headers
        )
        assert len(raw.parse().data[0].embedding) == 4
    return Answer(raw.status_code, {k.lower(): v for k, v in raw.headers.items()}, raw.content)


def openai_undecodable(doors: Doors, model: str) -> Answer:
    """The door reads `model` first: this body names the right model and an invalid `input`."""
    with openai_client(doors) as client, pytest.raises(openai.APIStatusError) as raised:
        client.embeddings.create(model=model, input="", encoding_format="float")
    response = raised.value.response
    return Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.content)


def openai_overloaded(answer: Answer) -> None:
    """OpenAI's `{"error": {"message", "type", "param", "code"}}`, 503 and Retry-After."""
    assert answer.status == 503, answer
    error = json_error(answer)["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "OVERLOADED", answer
    assert RETRY in error["message"], answer
    assert int(answer.headers["retry-after"]) >= 1, answer


def openai_refused(answer: Answer) -> None:
    assert answer.status == 400, answer
    assert json_error(answer)["error"]["type"] == "invalid_request_error", answer


# --- gRPC doors --------------------------------------------------------------------------------


def unary(target: str, method: Callable[[grpc.Channel], Any], message: Any, metadata: dict[str, str]) -> Answer:
    with grpc.insecure_channel(target) as channel:
        try:
            _, call = method(channel).with_call(message, timeout=30, metadata=tuple(metadata.items()))
        except grpc.RpcError as error:
            trailers = {str(k): str(v) for k, v in error.trailing_metadata() or ()}
            return Answer(error.code().name, trailers, str(error.details()).encode())
    return Answer("OK", {str(k): str(v) for k, v in call.trailing_metadata() or ()}, b"")


def grpc_overloaded(answer: Answer) -> None:
    """UNAVAILABLE, the overload's message, and Retry-After's seconds as trailing metadata."""
    assert answer.status == "UNAVAILABLE" and RETRY in answer.text(), answer
    assert int(answer.headers["retry-after"]) >= 1, answer


def grpc_refused(answer: Answer) -> None:
    assert answer.status == "INVALID_ARGUMENT", answer


def v2_request(model: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.append(TEXT.encode())
    return request


def undecodable_v2_request(model: str) -> service_pb2.ModelInferRequest:
    # The raw BYTES element's length prefix claims 2 GiB that the message does not hold.
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(b"\xff\xff\xff\x7fhello")
    return request


def kserve_stub(channel: grpc.Channel) -> Any:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer


def v2_grpc_infer(doors: Doors, model: str, metadata: dict[str, str]) -> Answer:
    return unary(doors.server.grpc_url, kserve_stub, v2_request(model), metadata)


def v2_grpc_undecodable(doors: Doors, model: str) -> Answer:
    return unary(doors.server.grpc_url, kserve_stub, undecodable_v2_request(model), {})


def v2_stream_infer(doors: Doors, model: str, metadata: dict[str, str]) -> Answer:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[TEXT.encode()]], dtype=object))
    with grpcclient.InferenceServerClient(doors.server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=metadata)
        try:
            client.async_stream_infer(model, [tensor])
            result, error = answers.get(timeout=30)
        finally:
            client.stop_stream()
    if error is not None:
        return Answer("STREAM_ERROR", {}, str(error).encode())
    assert result.as_numpy("EMBEDDING").shape == (1, 4)
    return Answer("STREAM_OK", {}, b"")


def v2_stream_undecodable(doors: Doors, model: str) -> Answer:
    """One undecodable request on a stream, which then closes: the stream's one answer."""
    with grpc.insecure_channel(doors.server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        replies = list(stub.ModelStreamInfer(iter([undecodable_v2_request(model)]), timeout=30))
    assert len(replies) == 1, replies
    message = replies[0].error_message
    return Answer("STREAM_ERROR" if message else "STREAM_OK", {}, message.encode())


def stream_overloaded(answer: Answer) -> None:
    """A stream goes on after a request's error: the error is that request's `error_message`."""
    assert answer.status == "STREAM_ERROR" and RETRY in answer.text(), answer


def stream_refused(answer: Answer) -> None:
    assert answer.status == "STREAM_ERROR" and RETRY not in answer.text(), answer


def tf_request(model: str, values: list[bytes]) -> serving_pb.PredictRequest:
    request = serving_pb.PredictRequest()
    request.model_spec.name = model
    proto = request.inputs["TEXT"]
    proto.dtype = tf_pb.DT_STRING
    proto.tensor_shape.dim.extend(tf_pb.TensorShapeProto.Dim(size=s) for s in (1, 1))
    proto.string_val.extend(values)
    return request


def tf_stub(channel: grpc.Channel) -> Any:
    return serving_grpc.PredictionServiceStub(channel).Predict


def tf_grpc_infer(doors: Doors, model: str, metadata: dict[str, str]) -> Answer:
    return unary(f"127.0.0.1:{doors.tfserving_grpc_port}", tf_stub, tf_request(model, [TEXT.encode()]), metadata)


def tf_grpc_undecodable(doors: Doors, model: str) -> Answer:
    # Two strings for a shape that holds one.
    return unary(f"127.0.0.1:{doors.tfserving_grpc_port}", tf_stub, tf_request(model, [b"a", b"b"]), {})


# --- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Says:
    """How a door answers "overloaded, retry" and "this body cannot be decoded" (each asserts it)."""

    overloaded: Callable[[Answer], None]
    refused: Callable[[Answer], None]


V2_JSON = Says(kserve_overloaded, kserve_refused)  # v2's, TF Serving REST's and SageMaker's bodies
TORCHSERVE = Says(torchserve_overloaded, torchserve_refused)
OPENAI = Says(openai_overloaded, openai_refused)
GRPC = Says(grpc_overloaded, grpc_refused)
STREAM = Says(stream_overloaded, stream_refused)


@dataclass(frozen=True, slots=True)
class Door:
    name: str
    # The `protocol` label its requests count under.
    protocol: str
    # A request the model answers, with these headers (HTTP) or metadata (gRPC) added.
    infer: Callable[[Doors, str, dict[str, str]], Answer]
    # A request whose body this door cannot decode.
    undecodable: Callable[[Doors, str], Answer]
    says: Says
    # Whether its answers can carry the time split (a stream's answers have no headers of their own).
    timed: bool = True


DOORS = [
    Door("v2_rest", "kserve_http", v2_rest_infer, v2_rest_undecodable, V2_JSON),
    Door("v2_grpc", "kserve_grpc", v2_grpc_infer, v2_grpc_undecodable, GRPC),
    Door("v2_grpc_stream", "kserve_grpc", v2_stream_infer, v2_stream_undecodable, STREAM, timed=False),
    Door("tfserving_rest", "tfserving_rest", tf_rest_infer, tf_rest_undecodable, V2_JSON),
    Door("tfserving_grpc", "tfserving_grpc", tf_grpc_infer, tf_grpc_undecodable, GRPC),
    Door("sagemaker_json", "sagemaker", sagemaker_json_infer, sagemaker_json_undecodable, V2_JSON),
    Door("sagemaker_npy", "sagemaker", sagemaker_npy_infer, sagemaker_npy_undecodable, V2_JSON),
    Door("sagemaker_csv", "sagemaker", sagemaker_csv_infer, sagemaker_csv_undecodable, V2_JSON),
    Door("torchserve", "torchserve", torchserve_infer, torchserve_undecodable, TORCHSERVE),
    Door("openai", "openai", openai_infer, openai_undecodable, OPENAI),
]
every_door = pytest.mark.parametrize("door", DOORS, ids=[door.name for door in DOORS])
timed_doors = [door for door in DOORS if door.timed]


def answered(answer: Answer) -> Answer:
    assert answer.status in (200, "OK", "STREAM_OK"), answer
    return answer


# --- reading the server's numbers ----------------------------------------------------------------


def gauges(doors: Doors, model: str) -> tuple[float, float]:
    """(requests in flight, requests queued) of `model`, from /metrics."""
    text = scrape(doors.server)

    def gauge(name: str) -> float:
        found = re.search(rf'^{name}\{{model="{model}",version="1"\}} (\S+)$', text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    return gauge("inferd_requests_in_flight"), gauge("inferd_queue_depth")


def wait_for_in_flight(doors: Doors, model: str, in_flight: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if gauges(doors, model) == (in_flight, 0):
            return
        time.sleep(0.02)
    raise AssertionError(f"{model} never had {in_flight} in flight and none queued: {gauges(doors, model)}")


@dataclass(frozen=True, slots=True)
class Counts:
    """What the statistics extension and the metrics say of one model, under one door."""

    inference_count: int
    execution_count: int
    success_count: int
    requests: float  # inferd_requests_total{protocol, outcome="success"}
    encode_count: float  # inferd_request_encode_duration_seconds{protocol}: the door's own
    encode_s: float

    def minus(self, other: Counts) -> Counts:
        return Counts(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def requests_counted(self) -> tuple[float, ...]:
        """The statistics' three counts and the door's requests counter."""
        return (self.inference_count, self.execution_count, self.success_count, self.requests)


def counts(doors: Doors, model: str, protocol: str) -> Counts:
    reply = http_request(doors.server, "GET", f"/v2/models/{model}/stats")
    assert reply.status == 200, reply
    stats = json.loads(reply.body)["model_stats"][0]
    text = scrape(doors.server)
    labels = {"model": model, "version": "1"}
    return Counts(
        inference_count=int(stats["inference_count"]),
        execution_count=int(stats["execution_count"]),
        success_count=int(stats["inference_stats"]["success"]["count"]),
        requests=sample(text, "inferd_requests_total", 0.0, **labels, protocol=protocol, outcome="success"),
        encode_count=sample(text, "inferd_request_encode_duration_seconds_count", 0.0, **labels, protocol=protocol),
        encode_s=sample(text, "inferd_request_encode_duration_seconds_sum", 0.0, **labels, protocol=protocol),
    )


def grown(doors: Doors, model: str, protocol: str, before: Counts, until: Callable[[Counts], bool]) -> Counts:
    """How the counts grew since `before`, once `until` holds of the growth or SETTLE_S passed."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        growth = counts(doors, model, protocol).minus(before)
        if until(growth) or time.monotonic() > deadline:
            return growth
        time.sleep(0.05)


def timing_of(answer: Answer) -> dict[str, float]:
    value = answer.headers.get(server_timing.RESPONSE_HEADER)
    assert value, f"no {server_timing.RESPONSE_HEADER} in {answer.headers}"
    entries = [part.strip().split(";dur=") for part in value.split(",")]
    return {name: float(duration) for name, duration in entries}


# --- the tests -----------------------------------------------------------------------------------


@pytest.fixture
def held(doors: Doors) -> Iterator[ThreadPoolExecutor]:
    """Executions of HELD wait while the test runs; whatever a test sent finishes after it."""
    doors.hold_file.touch()
    pool = ThreadPoolExecutor(2)
    try:
        yield pool
    finally:
        doors.hold_file.unlink(missing_ok=True)
        pool.shutdown(wait=True)
        wait_for_in_flight(doors, HELD, 0)


@every_door
def test_the_undecodable_body_is_a_decoding_error_when_the_model_has_room(doors: Doors, door: Door) -> None:
    """What the overload test sends really is undecodable: with room, the door says so."""
    door.says.refused(door.undecodable(doors, HELD))


@every_door
def test_a_full_queue_refuses_before_the_body_is_decoded(doors: Doors, door: Door, held: ThreadPoolExecutor) -> None:
    executing = held.submit(v2_rest_infer, doors, HELD, {})
    wait_for_in_flight(doors, HELD, 1)  # the queue's one place, taken (the bound counts executing requests)
    answer = door.undecodable(doors, HELD)
    doors.hold_file.unlink()
    assert answered(executing.result(timeout=30))
    door.says.overloaded(answer)


@every_door
def test_each_request_counts_once_and_is_timed(doors: Doors, door: Door) -> None:
    """N requests: N in the statistics (rows, executions, successes), N in the door's requests
    counter, N encode times under the door's own `protocol` label that add up to more than nothing
    (an encode time counted under another door would leave this door's short)."""
    before = counts(doors, HELD, door.protocol)
    for _ in range(N):
        answered(door.infer(doors, HELD, {}))
    growth = grown(
        doors, HELD, door.protocol, before, lambda g: g.requests_counted() == (N, N, N, N) and g.encode_count == N
    )
    assert (growth.inference_count, growth.execution_count, growth.success_count) == (N, N, N), growth
    assert growth.requests == N, f"inferd_requests_total{{protocol={door.protocol!r}}}: {growth}"
    assert growth.encode_count == N and growth.encode_s > 0, f"encode time not recorded: {growth}"


@pytest.mark.parametrize("door", timed_doors, ids=[door.name for door in timed_doors])
def test_the_time_split_is_answered_when_asked(doors: Doors, door: Door) -> None:
    """Server-Timing over HTTP, the same name as trailing metadata over gRPC."""
    timing = timing_of(answered(door.infer(doors, HELD, TIMED)))
    assert tuple(timing) == PHASES, timing
    assert timing["decode"] > 0 and timing["encode"] > 0, timing


@every_door
def test_an_ensemble_counts_its_steps_in_the_step_model(doors: Doors, door: Door) -> None:
    """An ensemble reached by any door: each step is a request to the step model, counted there
    (protocol `ensemble`), and the ensemble's own request under the door's label."""
    step_before = counts(doors, STEP, "ensemble")
    pipeline_before = counts(doors, PIPELINE, door.protocol)
    for _ in range(N):
        answered(door.infer(doors, PIPELINE, {}))
    step = grown(doors, STEP, "ensemble", step_before, lambda g: g.requests_counted() == (N, N, N, N))
    assert step.requests_counted() == (N, N, N, N), step
    pipeline = grown(doors, PIPELINE, door.protocol, pipeline_before, lambda g: g.requests == N)
    assert pipeline.requests == N, pipeline

"""Ensembles served by a real `inferd serve`: a branching DAG of Python models over string tensors
(bytes that are not UTF-8 included), batched per step, over HTTP and gRPC with tritonclient;
independent steps proven concurrent; a step's error named; load errors that say where; step
models unloaded and reloaded under the ensemble; unload_dependents."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from inferd.testing.models import python_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import Clients, http_request
from tests.e2e.test_batching import batch_size_histogram

pytestmark = pytest.mark.e2e

# Each execution sleeps 20 ms (slow by construction), so that concurrent requests queue and merge.
UPPER = """
import time
import numpy as np

class Model:
    inputs = [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    outputs = [{"name": "UPPER", "datatype": "BYTES", "shape": [-1, 1]}]

    def execute(self, inputs):
        time.sleep(0.02)
        text = inputs["TEXT"]
        return {"UPPER": np.array([[t.upper()] for t in text[:, 0]], dtype=object)}
"""
LENGTH = """
import time
import numpy as np

class Model:
    inputs = [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    outputs = [{"name": "LENGTH", "datatype": "INT64", "shape": [-1, 1]}]

    def execute(self, inputs):
        time.sleep(0.02)
        return {"LENGTH": np.array([[len(t)] for t in inputs["TEXT"][:, 0]], dtype=np.int64)}
"""
DESCRIBE = """
import numpy as np

class Model:
    inputs = [{"name": "UPPER", "datatype": "BYTES", "shape": [-1, 1]},
              {"name": "LENGTH", "datatype": "INT64", "shape": [-1, 1]}]
    outputs = [{"name": "DESCRIPTION", "datatype": "BYTES", "shape": [-1, 1]}]

    def execute(self, inputs):
        rows = zip(inputs["UPPER"][:, 0], inputs["LENGTH"][:, 0])
        out = []
        for upper, length in rows:
            if b"BOOM" in upper:
                raise ValueError("cannot describe a text that says boom")
            out.append([upper + b"|" + str(length).encode()])
        return {"DESCRIPTION": np.array(out, dtype=object)}
"""
STEP_BATCHING = """
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
# TEXT ─┬─ upper ──UPPER──┐
#       │                 ├─ describe ── DESCRIPTION
#       └─ length ─LENGTH─┘                (LENGTH is an output as well)
TEXT_DAG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "DESCRIPTION" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "LENGTH" data_type: TYPE_INT64 dims: [ 1 ] }
]
ensemble_scheduling {
  step [
    { model_name: "describe" model_version: -1
      input_map { key: "UPPER" value: "upper_text" } input_map { key: "LENGTH" value: "LENGTH" }
      output_map { key: "DESCRIPTION" value: "DESCRIPTION" } },
    { model_name: "upper" model_version: 1
      input_map { key: "TEXT" value: "TEXT" } output_map { key: "UPPER" value: "upper_text" } },
    { model_name: "length" model_version: -1
      input_map { key: "TEXT" value: "TEXT" } output_map { key: "LENGTH" value: "LENGTH" } }
  ]
}
"""
# Each side writes its marker and waits (bounded) for the other's: run one after the other, the
# first would give up. Concurrency proven by construction, whatever the machine's speed.
RENDEZVOUS = """
import os
import time
import numpy as np

class Model:
    inputs = [{"name": "X", "datatype": "BYTES", "shape": [1]}]
    outputs = [{"name": "Y", "datatype": "BYTES", "shape": [1]}]

    def initialize(self, args):
        self.me = args["model_name"]
        self.other = args["parameters"]["other"]
        self.folder = args["parameters"]["folder"]

    def execute(self, inputs):
        token = inputs["X"][0].hex()
        open(os.path.join(self.folder, f"{self.me}-{token}"), "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(self.folder, f"{self.other}-{token}")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.other} never ran beside {self.me}")
            time.sleep(0.002)
        return {"Y": np.array([self.me.encode()], dtype=object)}
"""
PAIR = """
platform: "ensemble"
input [ { name: "X" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "LEFT" data_type: TYPE_STRING dims: [ 1 ] }, { name: "RIGHT" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "left" input_map { key: "X" value: "X" } output_map { key: "Y" value: "LEFT" } },
    { model_name: "right" input_map { key: "X" value: "X" } output_map { key: "Y" value: "RIGHT" } }
  ]
}
"""


def rendezvous_config(me: str, other: str, folder: Path) -> str:
    return f"""
    backend: "python"
    parameters {{ key: "other" value {{ string_value: "{other}" }} }}
    parameters {{ key: "folder" value {{ string_value: "{folder}" }} }}
    """


def build_repository(root: Path, markers: Path) -> None:
    for name, source in (("upper", UPPER), ("length", LENGTH), ("describe", DESCRIBE)):
        python_model(root / name / "1", source)
        write_config(root / name, STEP_BATCHING)
    write_config(root / "text_dag", TEXT_DAG)
    (root / "text_dag" / "1").mkdir()
    for me, other in (("left", "right"), ("right", "left")):
        python_model(root / me / "1", RENDEZVOUS)
        write_config(root / me, rendezvous_config(me, other, markers))
    write_config(root / "pair", PAIR)  # no version folder: an ensemble may leave out the empty `1/`


@pytest.fixture(scope="module")
def ensemble_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ensembles")
    build_repository(root, tmp_path_factory.mktemp("markers"))
    with run_server(
        root, tmp_path_factory.mktemp("logs") / "server.log", "--model-control-mode", "explicit", "--load-model", "*"
    ) as server:
        yield server


def texts(index: int) -> np.ndarray:
    """1-3 rows of distinct text per request; every third request carries bytes that are not UTF-8."""
    rows = [f"request {index} row {r}".encode() for r in range(1 + index % 3)]
    if index % 3 == 0:
        rows[0] = b"\xff\xfe raw \x00 bytes " + str(index).encode()
    return np.array([[row] for row in rows], dtype=object)


def expected(text: np.ndarray) -> tuple[list[bytes], list[int]]:
    return [t.upper() + b"|" + str(len(t)).encode() for t in text[:, 0]], [len(t) for t in text[:, 0]]


async def http_dag(client: httpaio.InferenceServerClient, text: np.ndarray) -> tuple[list[bytes], list[int]]:
    tensor = httpaio.InferInput("TEXT", list(text.shape), "BYTES")
    tensor.set_data_from_numpy(text, binary_data=True)
    outputs = [httpaio.InferRequestedOutput(n, binary_data=True) for n in ("DESCRIPTION", "LENGTH")]
    result = await client.infer("text_dag", [tensor], outputs=outputs)
    return list(result.as_numpy("DESCRIPTION")[:, 0]), list(result.as_numpy("LENGTH")[:, 0])


async def grpc_dag(client: grpcaio.InferenceServerClient, text: np.ndarray) -> tuple[list[bytes], list[int]]:
    tensor = grpcaio.InferInput("TEXT", list(text.shape), "BYTES")
    tensor.set_data_from_numpy(text)
    result = await client.infer("text_dag", [tensor])
    return list(result.as_numpy("DESCRIPTION")[:, 0]), list(result.as_numpy("LENGTH")[:, 0])


async def test_branching_dag_over_strings_answers_every_request_with_its_own_rows(
    ensemble_server: ServerProcess,
) -> None:
    async with (
        httpaio.InferenceServerClient(ensemble_server.http_url, conn_limit=64) as http_client,
        grpcaio.InferenceServerClient(ensemble_server.grpc_url) as grpc_client,
    ):
        calls = [
            (http_dag(http_client, texts(i)) if i % 2 else grpc_dag(grpc_client, texts(i)), texts(i)) for i in range(48)
        ]
        results = await asyncio.gather(*(call for call, _ in calls))
    for (_, text), (descriptions, lengths) in zip(calls, results, strict=True):
        want_descriptions, want_lengths = expected(text)
        assert descriptions == want_descriptions
        assert lengths == want_lengths
    # Each step batched on its own scheduler: some executions carried more than one request's rows.
    for model in ("upper", "length", "describe"):
        histogram = batch_size_histogram(ensemble_server, model)
        assert histogram["+Inf"] < 48, f"{model} never merged requests: {histogram}"


def test_independent_steps_run_concurrently(ensemble_server: ServerProcess, clients: Clients) -> None:
    import tritonclient.http as httpclient

    client = clients.http(ensemble_server.http_url)
    for index in range(3):
        tensor = httpclient.InferInput("X", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([f"token {index}".encode()], dtype=object))
        result = client.infer("pair", [tensor])
        assert result.as_numpy("LEFT").tolist() == [b"left"]
        assert result.as_numpy("RIGHT").tolist() == [b"right"]


def test_a_failing_step_answers_with_its_error_naming_the_step(ensemble_server: ServerProcess) -> None:
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2, 1], "data": ["fine", "boom"]}]}
    reply = http_request(ensemble_server, "POST", "/v2/models/text_dag/infer", json.dumps(body).encode())
    assert reply.status == 400
    error = json.loads(reply.body)
    assert error["code"] == "MODEL_RAISED"
    assert "ensemble 'text_dag' step 0 (model 'describe')" in error["error"]
    assert "cannot describe a text that says boom" in error["error"]
    # The ensemble and its steps keep serving.
    body["inputs"][0]["data"] = ["fine", "still fine"]
    reply = http_request(ensemble_server, "POST", "/v2/models/text_dag/infer", json.dumps(body).encode())
    assert reply.status == 200, reply.body
    outputs = {o["name"]: o["data"] for o in json.loads(reply.body)["outputs"]}
    assert outputs == {"DESCRIPTION": ["FINE|4", "STILL FINE|10"], "LENGTH": [4, 10]}


def test_requested_outputs_run_only_the_steps_they_need(ensemble_server: ServerProcess) -> None:
    # "boom" would fail the describe step; asking only for LENGTH leaves that step out.
    body = {
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["boom"]}],
        "outputs": [{"name": "LENGTH"}],
    }
    reply = http_request(ensemble_server, "POST", "/v2/models/text_dag/infer", json.dumps(body).encode())
    assert reply.status == 200, reply.body
    assert json.loads(reply.body)["outputs"][0]["data"] == [4]


def test_ensemble_inputs_are_checked_like_any_model(ensemble_server: ServerProcess) -> None:
    body = {"inputs": [{"name": "TEXT", "datatype": "INT64", "shape": [1, 1], "data": [1]}]}
    reply = http_request(ensemble_server, "POST", "/v2/models/text_dag/infer", json.dumps(body).encode())
    assert reply.status == 400
    assert json.loads(reply.body)["code"] == "DATATYPE_MISMATCH"


def test_steps_count_in_their_own_models_statistics(ensemble_server: ServerProcess, clients: Clients) -> None:
    client = clients.http(ensemble_server.http_url)
    before = client.get_inference_statistics("length")["model_stats"][0]["inference_count"]
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [3, 1], "data": ["a", "b", "c"]}]}
    reply = http_request(ensemble_server, "POST", "/v2/models/text_dag/infer", json.dumps(body).encode())
    assert reply.status == 200
    after = client.get_inference_statistics("length")["model_stats"][0]["inference_count"]
    assert after - before == 3
    metadata = client.get_model_metadata("text_dag")
    assert metadata["platform"] == "ensemble"


BROKEN = {
    "unknown_step_model": (
        """
        platform: "ensemble"
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
        ensemble_scheduling { step [ { model_name: "no_such_model"
          input_map { key: "TEXT" value: "TEXT" } output_map { key: "UPPER" value: "OUT" } } ] }
        """,
        "step model 'no_such_model' cannot load",
    ),
    "unmatched_tensor": (
        """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
        ensemble_scheduling { step [ { model_name: "upper"
          input_map { key: "TEXT" value: "TXET" } output_map { key: "UPPER" value: "OUT" } } ] }
        """,
        "step 0 (model 'upper'): input 'TEXT' reads ensemble tensor 'TXET', which is neither",
    ),
    "wrong_datatype": (
        """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
        ensemble_scheduling { step [ { model_name: "length"
          input_map { key: "TEXT" value: "TEXT" } output_map { key: "LENGTH" value: "OUT" } } ] }
        """,
        "ensemble output 'OUT': ensemble tensor 'OUT' is INT64 but FP32 is expected",
    ),
    "steps_in_a_cycle": (
        """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
        ensemble_scheduling { step [
          { model_name: "upper" input_map { key: "TEXT" value: "b" } output_map { key: "UPPER" value: "a" } },
          { model_name: "upper" input_map { key: "TEXT" value: "a" } output_map { key: "UPPER" value: "b" } },
          { model_name: "upper" input_map { key: "TEXT" value: "a" } output_map { key: "UPPER" value: "OUT" } }
        ] }
        """,
        "its steps form a cycle: step 0 (upper) → step 1 (upper) → step 0 (upper)",
    ),
    "ensembles_in_a_cycle": (
        """
        platform: "ensemble"
        input [ { name: "X" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] } ]
        ensemble_scheduling { step [ { model_name: "cycle_partner"
          input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
        """,
        "ensembles depend on each other in a cycle: ensembles_in_a_cycle → cycle_partner → ensembles_in_a_cycle",
    ),
}
CYCLE_PARTNER = """
platform: "ensemble"
input [ { name: "X" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "ensembles_in_a_cycle"
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
"""


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("explicit")
    build_repository(root, tmp_path_factory.mktemp("markers"))
    for name, (config, _) in BROKEN.items():
        write_config(root / name, config)
    write_config(root / "cycle_partner", CYCLE_PARTNER)
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log", "--model-control-mode", "explicit") as server:
        yield server


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_ensembles_fail_to_load_saying_where(explicit_server: ServerProcess, name: str) -> None:
    reply = http_request(explicit_server, "POST", f"/v2/repository/models/{name}/load", b"")
    assert reply.status == 400, reply.body
    message = json.loads(reply.body)["error"]
    assert BROKEN[name][1] in message, message


def test_loading_an_ensemble_loads_its_steps_and_unload_dependents_unloads_them(
    explicit_server: ServerProcess, clients: Clients
) -> None:
    client = clients.http(explicit_server.http_url)
    client.load_model("text_dag")
    assert all(client.is_model_ready(name) for name in ("text_dag", "upper", "length", "describe"))
    import tritonclient.http as httpclient

    def describe(text: bytes) -> bytes:
        tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[text]], dtype=object))
        return bytes(client.infer("text_dag", [tensor]).as_numpy("DESCRIPTION")[0, 0])

    assert describe(b"abc") == b"ABC|3"
    # A step model leaves: the ensemble is not ready, and its requests say which step cannot run.
    client.unload_model("length")
    assert not client.is_model_ready("text_dag")
    with pytest.raises(InferenceServerException) as raised:
        describe(b"abc")
    assert "step 2 (model 'length')" in str(raised.value)
    # It comes back: so does the ensemble, without being reloaded.
    client.load_model("length")
    assert client.is_model_ready("text_dag")
    assert describe(b"\xffabc") == b"\xffABC|4"

    # Plain unload leaves the steps; unload_dependents takes them along.
    client.unload_model("text_dag")
    assert client.is_model_ready("upper")
    client.load_model("text_dag")
    client.unload_model("text_dag", unload_dependents=True)
    index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
    assert [index[name] for name in ("text_dag", "upper", "length", "describe")] == ["UNAVAILABLE"] * 4
    assert index["left"] is None  # never loaded, left alone


async def test_grpc_unload_dependents(explicit_server: ServerProcess) -> None:
    async with grpcaio.InferenceServerClient(explicit_server.grpc_url) as client:
        await client.load_model("pair")
        assert await client.is_model_ready("left")
        await client.unload_model("pair", unload_dependents=True)
        assert not await client.is_model_ready("left")
        assert not await client.is_model_ready("right")

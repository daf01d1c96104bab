"""TorchServe's inference API (POST /predictions/...) and its management API's read side on a port of
its own, called as TorchServe's users call them (requests, curl-like raw bodies)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate
from schemathesis import GenerationMode

from inferd.server.openapi import MANAGEMENT_DOCUMENT_PATH, management_document
from inferd.testing.models import add_sub_model, identity_model, mlp_model, python_model, write_config
from inferd.testing.server import ServerProcess, free_port, run_server
from inferd.types import DataType
from tests.e2e.test_observability import grew, scrape
from tests.e2e.test_openapi import CONFORMANCE

pytestmark = pytest.mark.e2e

ROWS = np.random.default_rng(11).standard_normal((2, 16)).astype(np.float32)
# A model whose output is a view numpy lays out column-first (not C-contiguous), as a handler's
# `x.T` or `x[:, ::2]` would be.
TRANSPOSE_MODEL = """
class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [2, 3]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [3, 2]}]

    def execute(self, inputs):
        return {"y": inputs["x"].T}
"""


@pytest.fixture(scope="module")
def torchserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    repository = tmp_path_factory.mktemp("torchserve-models")
    for version in (1, 2):
        mlp_model(repository / "mlp" / str(version) / "model.onnx", seed=version)
    write_config(
        repository / "mlp",
        "max_batch_size: 8\nversion_policy: { all: { } }\ndynamic_batching { max_queue_delay_microseconds: 500 }\n"
        "instance_group [ { count: 2 kind: KIND_CPU } ]",
    )
    add_sub_model(repository / "add_sub" / "1" / "model.onnx")
    identity_model(repository / "echo" / "1" / "model.onnx", DataType.BYTES, ["batch", -1])
    python_model(repository / "transpose" / "1", TRANSPOSE_MODEL)
    management_port = free_port()
    logs = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(repository, logs, "--torchserve-management-port", str(management_port)) as server:
        yield server, management_port


def url(server: ServerProcess, path: str) -> str:
    return f"http://{server.http_url}{path}"


def v2_reference(server: ServerProcess, model: str, version: str) -> np.ndarray:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "data": ROWS.ravel().tolist()}]}
    reply = requests.post(url(server, f"/v2/models/{model}/versions/{version}/infer"), json=body, timeout=10)
    return np.array(reply.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 4)


def test_json_bodies_reach_the_inputs_the_config_declares(torchserve: tuple[ServerProcess, int]) -> None:
    server, _ = torchserve
    unnamed = requests.post(url(server, "/predictions/mlp"), json=ROWS.tolist(), timeout=10)
    assert unnamed.status_code == 200, unnamed.text
    np.testing.assert_allclose(unnamed.json(), v2_reference(server, "mlp", "2"), rtol=1e-6)  # the newest version
    named = requests.post(url(server, "/predictions/mlp/1"), json={"x": ROWS.tolist()}, timeout=10)
    np.testing.assert_allclose(named.json(), v2_reference(server, "mlp", "1"), rtol=1e-6)
    both = requests.post(
        url(server, "/predictions/add_sub"), json={"INPUT0": ROWS.tolist(), "INPUT1": ROWS.tolist()}, timeout=10
    )
    assert set(both.json()) == {"OUTPUT0", "OUTPUT1"}
    np.testing.assert_allclose(both.json()["OUTPUT0"], ROWS * 2, rtol=1e-6)
    v2 = requests.post(
        url(server, "/predictions/mlp/1"),
        json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "data": ROWS.ravel().tolist()}]},
        timeout=10,
    )
    assert v2.json()["model_name"] == "mlp" and v2.json()["model_version"] == "1"


def test_nan_infinities_and_any_output_layout_are_answered(torchserve: tuple[ServerProcess, int]) -> None:
    # Python's json writes NaN, Infinity and -Infinity, and TorchServe's handlers read and answer
    # them so; the model's transposed output is answered, not a 500.
    server, _ = torchserve
    x = [[float("nan"), float("inf"), 0.1], [2.0, -float("inf"), 3.0]]
    body, headers = json.dumps(x), {"Content-Type": "application/json"}
    reply = requests.post(url(server, "/predictions/transpose"), data=body, headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.content == b"[[NaN,2.0],[Infinity,-Infinity],[0.1,3.0]]"
    np.testing.assert_array_equal(np.array(reply.json(), np.float32), np.array(x, np.float32).T)


def test_a_raw_body_is_one_element_of_the_bytes_input(torchserve: tuple[ServerProcess, int]) -> None:
    server, _ = torchserve
    reply = requests.post(
        url(server, "/predictions/echo"),
        data=b"a raw text body",
        headers={"Content-Type": "text/plain"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json() == [["a raw text body"]]


def test_a_body_without_a_content_type_is_handed_over_as_torchserve_hands_it(
    torchserve: tuple[ServerProcess, int],
) -> None:
    """TorchServe's documented `curl http://host:8080/predictions/m -T file` is a PUT without a
    Content-Type, and so is `requests.post(url, data=b"...")`: raw bytes to the model's BYTES input,
    JSON for a model without one, and a 404 for a model that does not exist whatever the body."""
    server, _ = torchserve
    document = orjson.dumps(ROWS.tolist())
    calls = [
        ("PUT", "/predictions/echo", b"\x89PNG raw file bytes", 200),  # curl -T
        ("POST", "/predictions/echo", b'{"looks": "like JSON"}', 200),  # bytes for a BYTES input, unread
        ("POST", "/predictions/mlp/1", document, 200),  # no BYTES input: JSON
        ("PUT", "/predictions/ghost", b"\x89PNG raw file bytes", 404),
        ("POST", "/predictions/ghost", b"not json", 404),
    ]
    for method, path, body, status in calls:
        reply = requests.request(method, url(server, path), data=body, timeout=10)
        assert "Content-Type" not in reply.request.headers  # as curl -T sends it
        assert reply.status_code == status, (method, path, reply.text)
        if path == "/predictions/echo":  # the body itself, as the model's one element
            assert reply.json() == [[body.decode("utf-8", "replace")]]
        elif path == "/predictions/mlp/1":
            np.testing.assert_allclose(reply.json(), v2_reference(server, "mlp", "1"), rtol=1e-6)
        else:
            assert reply.json()["type"] == "ModelNotFoundException" and "ghost" in reply.json()["message"]


def test_errors_in_torchserve_shape(torchserve: tuple[ServerProcess, int]) -> None:
    server, _ = torchserve
    cases = [
        ("POST", "/predictions/ghost", {"json": [1]}, 404, "ModelNotFoundException"),
        ("POST", "/predictions/mlp/7", {"json": ROWS.tolist()}, 404, "ModelVersionNotFoundException"),
        ("GET", "/predictions/mlp", {}, 405, "MethodNotAllowedException"),
        (
            "POST",
            "/predictions/mlp",
            {"data": b"\x00raw", "headers": {"Content-Type": "image/png"}},
            400,
            "BadRequestException",
        ),
        ("POST", "/predictions/mlp", {"json": [[1.0] * 3]}, 400, "BadRequestException"),
    ]
    for method, path, kwargs, status, kind in cases:
        reply = requests.request(method, url(server, path), timeout=10, **kwargs)  # type: ignore[arg-type]
        assert reply.status_code == status, (path, reply.text)
        body = reply.json()
        assert body["code"] == status and body["type"] == kind and body["message"], body


def test_management_api_lists_and_describes(torchserve: tuple[ServerProcess, int]) -> None:
    _, port = torchserve
    management = f"http://127.0.0.1:{port}"
    listing = requests.get(f"{management}/models", timeout=10).json()
    assert [m["modelName"] for m in listing["models"]] == ["add_sub", "echo", "mlp", "transpose"]
    assert "nextPageToken" not in listing
    page = requests.get(f"{management}/models", params={"limit": 2}, timeout=10).json()
    assert [m["modelName"] for m in page["models"]] == ["add_sub", "echo"] and page["nextPageToken"] == "2"
    rest = requests.get(f"{management}/models", params={"limit": 2, "next_page_token": 2}, timeout=10).json()
    assert [m["modelName"] for m in rest["models"]] == ["mlp", "transpose"]
    (described,) = requests.get(f"{management}/models/mlp", timeout=10).json()
    assert described["modelName"] == "mlp" and described["modelVersion"] == "2"
    assert described["batchSize"] == 8 and described["maxBatchDelay"] == 0.5
    assert described["minWorkers"] == described["maxWorkers"] == 2 and len(described["workers"]) == 2
    assert [d["modelVersion"] for d in requests.get(f"{management}/models/mlp/all", timeout=10).json()] == ["1", "2"]
    assert requests.get(f"{management}/models/mlp/1", timeout=10).json()[0]["modelVersion"] == "1"
    missing = requests.get(f"{management}/models/ghost", timeout=10)
    assert missing.status_code == 404 and missing.json()["type"] == "ModelNotFoundException"
    # The management port serves management only.
    assert requests.post(f"{management}/predictions/mlp", json=[1], timeout=10).status_code == 404


def test_the_management_port_serves_its_api_description_and_answers_as_it_says(
    torchserve: tuple[ServerProcess, int],
) -> None:
    _, port = torchserve
    management = f"http://127.0.0.1:{port}"
    served = requests.get(management + MANAGEMENT_DOCUMENT_PATH, timeout=10).json()
    assert served == orjson.loads(orjson.dumps(management_document()))
    validate(served)
    schema = schemathesis.openapi.from_dict(served)
    statuses: dict[str, list[int]] = {}
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            examples = schema.get_strategies_from_examples(operation)
            strategies = [*examples, operation.as_strategy(GenerationMode.POSITIVE)]
            for strategy in strategies:

                @given(case=strategy)
                @settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
                def conforms(case: schemathesis.Case) -> None:
                    response = case.call(base_url=management, session=session, timeout=30)
                    statuses.setdefault(case.operation.label, []).append(response.status_code)
                    case.validate_response(response, checks=CONFORMANCE)

                conforms()
    assert set(statuses) == {f"GET {path}" for path in served["paths"]}
    assert all(200 in answered for answered in statuses.values()), statuses  # each answered with a 2xx too


def test_predictions_count_under_their_door(torchserve: tuple[ServerProcess, int]) -> None:
    server, _ = torchserve
    before = scrape(server)
    requests.post(url(server, "/predictions/mlp/1"), json=ROWS.tolist(), timeout=10).raise_for_status()
    labels = {"model": "mlp", "version": "1", "protocol": "torchserve", "outcome": "success"}
    after = scrape(server)
    assert grew(before, after, "inferd_requests_total", **labels) == 1
    assert orjson.loads(requests.get(url(server, "/ping"), timeout=10).content) == {"status": "Healthy"}

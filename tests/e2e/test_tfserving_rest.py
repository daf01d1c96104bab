"""TF Serving's REST API (`/v1/models/...`), called with `requests` as TF Serving's users call it,
checked against the same models' answers over KServe v2."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
import requests

from inferd.testing.server import ServerProcess
from tests.e2e.conftest import Clients, http_request
from tests.e2e.test_observability import grew, scrape

pytestmark = pytest.mark.e2e

ROWS = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)


def url(server: ServerProcess, path: str) -> str:
    return f"http://{server.http_url}{path}"


def v2_answer(clients: Clients, server: ServerProcess, model: str, version: str = "", **inputs: np.ndarray) -> dict:
    import tritonclient.http as httpclient

    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = clients.http(server.http_url).infer(model, tensors, model_version=version)
    return {output["name"]: result.as_numpy(output["name"]) for output in result.get_response()["outputs"]}


def predict(server: ServerProcess, path: str, body: Any) -> requests.Response:
    return requests.post(url(server, f"/v1/models/{path}:predict"), json=body, timeout=30)


def test_row_format_single_input_answers_predictions(clients: Clients, server: ServerProcess) -> None:
    reply = predict(server, "mlp", {"instances": ROWS.tolist()})
    assert reply.status_code == 200, reply.text
    predictions = np.array(reply.json()["predictions"], dtype=np.float32)
    np.testing.assert_allclose(predictions, v2_answer(clients, server, "mlp", x=ROWS)["y"], rtol=1e-6)
    assert predictions.shape == (3, 4)


def test_columnar_format_single_input_answers_outputs(clients: Clients, server: ServerProcess) -> None:
    reply = predict(server, "mlp", {"signature_name": "serving_default", "inputs": ROWS[:2].tolist()})
    assert reply.status_code == 200, reply.text
    assert set(reply.json()) == {"outputs"}
    outputs = np.array(reply.json()["outputs"], dtype=np.float32)
    np.testing.assert_allclose(outputs, v2_answer(clients, server, "mlp", x=ROWS[:2])["y"], rtol=1e-6)


def test_several_inputs_and_outputs_by_name_in_both_formats(clients: Clients, server: ServerProcess) -> None:
    a, b = ROWS[:2], ROWS[1:]
    expected = v2_answer(clients, server, "add_sub", INPUT0=a, INPUT1=b)
    rows = predict(
        server,
        "add_sub",
        {"instances": [{"INPUT0": x.tolist(), "INPUT1": y.tolist()} for x, y in zip(a, b, strict=True)]},
    )
    assert rows.status_code == 200, rows.text
    predictions = rows.json()["predictions"]
    assert [set(row) for row in predictions] == [{"OUTPUT0", "OUTPUT1"}] * 2
    for name in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_allclose([row[name] for row in predictions], expected[name], rtol=1e-6)
    columns = predict(server, "add_sub", {"inputs": {"INPUT0": a.tolist(), "INPUT1": b.tolist()}})
    assert columns.status_code == 200, columns.text
    outputs = columns.json()["outputs"]
    assert set(outputs) == {"OUTPUT0", "OUTPUT1"}
    for name in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_allclose(outputs[name], expected[name], rtol=1e-6)


def test_versions_and_labels_choose_the_version(clients: Clients, server: ServerProcess) -> None:
    by_version = {
        v: np.array(predict(server, f"mlp/versions/{v}", {"instances": ROWS.tolist()}).json()["predictions"])
        for v in ("2", "3")
    }
    assert not np.allclose(by_version["2"], by_version["3"])  # seeded apart: the version matters
    np.testing.assert_allclose(by_version["2"], v2_answer(clients, server, "mlp", "2", x=ROWS)["y"], rtol=1e-6)
    stable = predict(server, "mlp/labels/stable", {"instances": ROWS.tolist()})
    canary = predict(server, "mlp/labels/canary", {"instances": ROWS.tolist()})
    np.testing.assert_allclose(stable.json()["predictions"], by_version["2"], rtol=1e-6)
    np.testing.assert_allclose(canary.json()["predictions"], by_version["3"], rtol=1e-6)
    unknown = predict(server, "mlp/labels/nightly", {"instances": ROWS.tolist()})
    assert unknown.status_code == 400
    assert "Unrecognized servable version label: nightly" in unknown.json()["error"]
    assert "canary, stable" in unknown.json()["error"]


def test_model_status_lists_versions_newest_first(server: ServerProcess) -> None:
    reply = requests.get(url(server, "/v1/models/mlp"), timeout=10)
    assert reply.status_code == 200
    ok = {"error_code": "OK", "error_message": ""}
    assert reply.json() == {
        "model_version_status": [
            {"version": "3", "state": "AVAILABLE", "status": ok},
            {"version": "2", "state": "AVAILABLE", "status": ok},
        ]
    }
    one = requests.get(url(server, "/v1/models/mlp/versions/2"), timeout=10).json()
    assert one == {"model_version_status": [{"version": "2", "state": "AVAILABLE", "status": ok}]}
    broken = requests.get(url(server, "/v1/models/broken_file"), timeout=10).json()["model_version_status"]
    assert broken[0]["state"] == "END" and broken[0]["status"]["error_code"] == "UNKNOWN"
    assert broken[0]["status"]["error_message"]
    missing = requests.get(url(server, "/v1/models/ghost"), timeout=10)
    assert missing.status_code == 404 and "ghost" in missing.json()["error"]


def test_metadata_is_a_signature_def(server: ServerProcess) -> None:
    for path in ("/v1/models/add_sub/metadata", "/v1/models/add_sub/versions/1/metadata"):
        reply = requests.get(url(server, path), timeout=10)
        assert reply.status_code == 200, reply.text
        document = reply.json()
        assert document["model_spec"] == {"name": "add_sub", "signature_name": "", "version": "1"}
        signature = document["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert signature["method_name"] == "tensorflow/serving/predict"
        assert set(signature["inputs"]) == {"INPUT0", "INPUT1"} and set(signature["outputs"]) == {"OUTPUT0", "OUTPUT1"}
        assert signature["inputs"]["INPUT0"] == {
            "dtype": "DT_FLOAT",
            "tensor_shape": {"dim": [{"size": "-1", "name": ""}, {"size": "16", "name": ""}], "unknown_rank": False},
            "name": "INPUT0",
        }
    labelled = requests.get(url(server, "/v1/models/mlp/labels/stable/metadata"), timeout=10).json()
    assert labelled["model_spec"]["version"] == "2"


def test_strings_travel_as_text_or_base64(server: ServerProcess) -> None:
    blob = b"\x89PNG\r\n\x1a\n\xff\x00"
    rows = [[{"b64": base64.b64encode(blob).decode()}, "hello"], ["wörld", {"b64": base64.b64encode(b"ok").decode()}]]
    reply = predict(server, "identity_bytes", {"instances": rows})
    assert reply.status_code == 200, reply.text
    # Text that is UTF-8 comes back as text; what is not comes back as base64, byte for byte.
    assert reply.json()["predictions"] == [[{"b64": base64.b64encode(blob).decode()}, "hello"], ["wörld", "ok"]]


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("mlp", {"instances": [[0.0] * 16], "inputs": [[0.0] * 16]}, 400, "exactly one of"),
        ("mlp", {"signature": "x"}, 400, "exactly one of"),
        ("mlp", {"instances": []}, 400, "non-empty list"),
        ("mlp", {"instances": [[0.0] * 16, [0.0] * 15]}, 400, "differ in length"),
        ("mlp", {"instances": [["a"] * 16]}, 400, "holds strings but the datatype is FP32"),
        ("mlp", {"instances": [[0.0] * 8]}, 400, "SHAPE_MISMATCH"),
        ("mlp", {"instances": [{"z": [0.0] * 16}]}, 400, "no input 'z'"),
        ("mlp", {"signature_name": "classify_x", "instances": [[0.0] * 16]}, 400, "not found in signature def"),
        ("add_sub", {"instances": [[0.0] * 16]}, 400, "name each input"),
        (
            "add_sub",
            {"instances": [{"INPUT0": [0.0] * 16, "INPUT1": [0.0] * 16}, {"INPUT0": [0.0] * 16}]},
            400,
            "same inputs",
        ),
        ("identity_bytes", {"instances": [[{"b64": "%%%"}]]}, 400, "base64"),
        ("identity_int32", {"instances": [[1.5]]}, 400, "holds floats"),
        ("ghost", {"instances": [[0.0]]}, 404, "ghost"),
        ("mlp/versions/9", {"instances": [[0.0] * 16]}, 404, "version 9"),
    ],
)
def test_bad_predict_requests_get_tf_serving_errors(
    server: ServerProcess, path: str, body: Any, status: int, words: str
) -> None:
    reply = predict(server, path, body)
    assert reply.status_code == status, reply.text
    document = reply.json()
    assert isinstance(document["error"], str) and "code" in document and document["request_id"]
    assert words in document["error"] or words == document["code"], document
    assert reply.headers["x-request-id"] == document["request_id"]


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_nan_and_infinities_travel_as_tf_serving_writes_them(server: ServerProcess, datatype: str) -> None:
    # TF Serving reads and writes NaN, Infinity and -Infinity (rapidjson's kParseNanAndInfFlag and its
    # own writer); Python's json, which its users post with and read answers with, does the same.
    rows = [[float("nan"), float("inf"), -float("inf"), 0.1]]
    model, headers = f"identity_{datatype.lower()}", {"Content-Type": "application/json"}
    for key, answer_key in (("instances", "predictions"), ("inputs", "outputs")):
        body = json.dumps({key: rows})
        reply = requests.post(url(server, f"/v1/models/{model}:predict"), data=body, headers=headers, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.content == b'{"%s":[[NaN,Infinity,-Infinity,0.1]]}' % answer_key.encode()  # 0.1 in its type
        np.testing.assert_array_equal(reply.json()[answer_key], rows)


def test_malformed_json_and_unsupported_verbs(server: ServerProcess) -> None:
    reply = http_request(server, "POST", "/v1/models/mlp:predict", b'{"instances": [')
    assert reply.status == 400 and b"not valid JSON" in reply.body
    deep = b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert http_request(server, "POST", "/v1/models/mlp:predict", deep).status == 400
    for verb in ("classify", "regress"):
        reply = http_request(server, "POST", f"/v1/models/mlp:{verb}", b"{}")
        assert reply.status == 501 and b"not supported" in reply.body
    wrong_method = http_request(server, "GET", "/v1/models/mlp:predict")
    assert wrong_method.status == 405 and wrong_method.headers["allow"] == "POST"
    assert http_request(server, "POST", "/v1/models/mlp:explain", b"{}").status == 404


def test_requests_count_under_their_door(server: ServerProcess) -> None:
    before = scrape(server)
    assert predict(server, "mlp/versions/3", {"instances": ROWS.tolist()}).status_code == 200
    labels = {"model": "mlp", "version": "3", "protocol": "tfserving_rest", "outcome": "success"}
    after = scrape(server)
    assert grew(before, after, "inferd_requests_total", **labels) == 1

"""KServe v2 REST endpoints through tritonclient.http and raw HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.testing.server import ServerProcess
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.http_url) as made:
        yield made


def add_sub_inputs(rows: int = 1, binary: bool = True) -> tuple[list[httpclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    b = np.full((rows, 16), 0.5, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [rows, 16], "FP32"), httpclient.InferInput("INPUT1", [rows, 16], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs, a, b


def test_health(client: httpclient.InferenceServerClient, server: ServerProcess) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert http_request(server, "GET", "/v2/health/live").status == 200


def kserve_sdk_health(server: ServerProcess, path: str, field: str) -> object:
    """What KServe's SDK does with a health answer (kserve 0.21, `InferenceRESTClient.is_server_live()`
    / `is_server_ready()`): a status outside 2xx raises, else it returns the body's JSON `field`. The
    SDK itself is not a test dependency: kserve 0.21 pins pandas<3 and psutil<6, below this
    project's."""
    reply = http_request(server, "GET", path)
    assert 200 <= reply.status < 300, reply
    document = orjson.loads(reply.body)  # an empty body raised JSONDecodeError here
    assert isinstance(document, dict)
    return document.get(field)


def test_health_answers_kserve_s_client_with_its_bodies(
    client: httpclient.InferenceServerClient, server: ServerProcess
) -> None:
    assert kserve_sdk_health(server, "/v2/health/live", "live") is True
    assert kserve_sdk_health(server, "/v2/health/ready", "ready") is True
    assert client.is_server_live() and client.is_server_ready()  # tritonclient reads the status: still 200


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "inferd"
    assert "binary_tensor_data" in metadata["extensions"]
    assert "model_configuration" in metadata["extensions"]


def test_model_metadata_and_versions(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("mlp")
    assert metadata["versions"] == ["2", "3"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    assert client.get_model_metadata("mlp", "2")["versions"] == ["2"]
    assert client.get_model_metadata("mlp_specific")["versions"] == ["1", "3"]


def test_model_ready(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("mlp", "3")
    assert not client.is_model_ready("mlp", "1")  # on disk, not selected by the policy: 404
    assert not client.is_model_ready("broken_file")
    assert not client.is_model_ready("no_such_model")


def test_model_config_completed_from_file(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("add_sub")
    assert config["max_batch_size"] == 8
    assert [o["name"] for o in config["output"]] == ["OUTPUT0", "OUTPUT1"]  # auto-completed
    assert config["output"][0]["dims"] == [16]
    assert config["output"][0]["data_type"] == "TYPE_FP32"
    assert config["instance_group"][0]["count"] == 2
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    # No config.pbtxt at all: everything from the ONNX file; the dynamic first dim makes it batch.
    identity = client.get_model_config("identity_fp32")
    assert identity["max_batch_size"] == 4
    # Triton's form: every scalar printed, at its default too.
    assert identity["input"] == [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [-1], "is_shape_tensor": False,
         "allow_ragged_batch": False, "optional": False, "is_non_linear_format_io": False}
    ]  # fmt: skip


def test_model_config_of_version(server: ServerProcess) -> None:
    reply = http_request(server, "GET", "/v2/models/mlp/versions/2/config")
    assert reply.status == 200
    assert orjson.loads(reply.body)["version_policy"] == {"latest": {"num_versions": 2}}


@pytest.mark.parametrize("binary", [False, True])
def test_infer_add_sub(client: httpclient.InferenceServerClient, binary: bool) -> None:
    inputs, a, b = add_sub_inputs(rows=3, binary=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id="my-request-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "my-request-7"
    assert response["model_name"] == "add_sub"
    assert response["model_version"] == "1"


def test_infer_requested_outputs_only(client: httpclient.InferenceServerClient) -> None:
    inputs, a, b = add_sub_inputs()
    result = client.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_specific_version(client: httpclient.InferenceServerClient) -> None:
    x = np.ones((2, 16), dtype=np.float32)
    tensor = httpclient.InferInput("x", [2, 16], "FP32")
    tensor.set_data_from_numpy(x)
    v2 = client.infer("mlp", [tensor], model_version="2").as_numpy("y")
    v3 = client.infer("mlp", [tensor], model_version="3").as_numpy("y")
    latest = client.infer("mlp", [tensor]).as_numpy("y")
    assert v2.shape == (2, 4)
    assert not np.array_equal(v2, v3)  # different seeded weights
    np.testing.assert_array_equal(latest, v3)


def test_infer_unbatched_model(client: httpclient.InferenceServerClient) -> None:
    data = np.arange(6, dtype=np.int32).reshape(2, 3)
    tensor = httpclient.InferInput("INPUT0", [2, 3], "INT32")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("unbatched", [tensor]).as_numpy("OUTPUT0"), data)


def test_auto_kind_falls_back_to_cpu(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("auto_kind")


def test_binary_output_for_json_input_with_request_parameter(server: ServerProcess) -> None:
    body = orjson.dumps(
        {
            "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [5, 6]}],
            "parameters": {"binary_data_output": True},
        }
    )
    reply = http_request(server, "POST", "/v2/models/identity_int32/infer", body)
    assert reply.status == 200
    header_length = int(reply.headers["inference-header-content-length"])
    header = orjson.loads(reply.body[:header_length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 8
    assert np.frombuffer(reply.body[header_length:], dtype="<i4").tolist() == [5, 6]


def test_nested_json_data(server: ServerProcess) -> None:
    body = orjson.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP64", "shape": [2, 2], "data": [[1, 2], [3, 4.5]]}]}
    )
    reply = http_request(server, "POST", "/v2/models/identity_fp64/infer", body)
    assert reply.status == 200, reply.body
    assert orjson.loads(reply.body)["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.5]


def test_request_id_header_is_echoed_and_logged(server: ServerProcess) -> None:
    body = orjson.dumps(
        {"id": "v2-id", "inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1, 1], "data": [3]}]}
    )
    reply = http_request(server, "POST", "/v2/models/identity_int8/infer", body, {"X-Request-ID": "trace-abc-123"})
    assert reply.status == 200
    assert reply.headers["x-request-id"] == "trace-abc-123"
    assert orjson.loads(reply.body)["id"] == "v2-id"
    # Without the header, the v2 id becomes the request id.
    reply = http_request(server, "POST", "/v2/models/identity_int8/infer", body)
    assert reply.headers["x-request-id"] == "v2-id"
    # Without either, one is generated.
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1, 1], "data": [3]}]})
    reply = http_request(server, "POST", "/v2/models/identity_int8/infer", body)
    assert len(reply.headers["x-request-id"]) == 16


def test_tritonclient_error_on_unknown_model(client: httpclient.InferenceServerClient) -> None:
    inputs, _, _ = add_sub_inputs()
    with pytest.raises(InferenceServerException) as raised:
        client.infer("no_such_model", inputs)
    assert raised.value.status() == "404"
    assert "no_such_model" in raised.value.message()


def test_warm_up_runs_before_ready(client: httpclient.InferenceServerClient, server: ServerProcess) -> None:
    assert client.is_model_ready("warmed")
    for sample in ("zeros", "noise", "file"):
        assert f"warm-up '{sample}'" in server.log()


def int8_request(v2_id: str) -> bytes:
    return orjson.dumps({"id": v2_id, "inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1, 1], "data": [3]}]})


def test_request_id_with_control_characters_is_refused_and_never_becomes_a_header(server: ServerProcess) -> None:
    reply = http_request(server, "POST", "/v2/models/identity_int8/infer", int8_request("a\r\nSet-Cookie: x=1"))
    assert reply.status == 400
    assert orjson.loads(reply.body)["code"] == "MALFORMED_REQUEST"
    assert "control characters" in orjson.loads(reply.body)["error"]
    assert "set-cookie" not in reply.headers
    assert "\r" not in reply.headers["x-request-id"] and "\n" not in reply.headers["x-request-id"]
    # The same refusal for a header that smuggles one in (a tab is the one control octet HTTP lets through).
    reply = http_request(server, "POST", "/v2/models/identity_int8/infer", int8_request("ok"), {"X-Request-ID": "a\tb"})
    assert reply.status == 400
    assert "X-Request-ID" in orjson.loads(reply.body)["error"]


@pytest.mark.parametrize("v2_id", ["résumé ✓", "50% of 日本", " padded "])
def test_any_printable_request_id_is_echoed_in_the_body_and_percent_encoded_in_the_header(
    server: ServerProcess, v2_id: str
) -> None:
    import urllib.parse

    reply = http_request(server, "POST", "/v2/models/identity_int8/infer", int8_request(v2_id))
    assert reply.status == 200, reply.body
    assert orjson.loads(reply.body)["id"] == v2_id
    header = reply.headers["x-request-id"]
    assert header.isascii() and urllib.parse.unquote(header) == v2_id
    # On an error too (the answer is a 4xx, never a 500 from writing the header).
    body = orjson.dumps({"id": v2_id, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [3]}]})
    reply = http_request(server, "POST", "/v2/models/identity_int8/infer", body)
    assert reply.status == 400
    assert urllib.parse.unquote(reply.headers["x-request-id"]) == v2_id
    assert orjson.loads(reply.body)["request_id"] == v2_id

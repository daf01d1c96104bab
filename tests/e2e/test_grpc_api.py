"""KServe v2 gRPC endpoints through tritonclient.grpc."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferd.testing.server import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as made:
        yield made


def test_health(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("broken_file")


def test_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata.name == "inferd"
    assert "binary_tensor_data" in metadata.extensions


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("mlp")
    assert list(metadata.versions) == ["2", "3"]
    assert metadata.inputs[0].name == "x"
    assert list(metadata.inputs[0].shape) == [-1, 16]
    assert metadata.outputs[0].datatype == "FP32"


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("add_sub").config
    assert config.max_batch_size == 8
    assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]
    assert config.instance_group[0].count == 2


def test_infer(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [2, 16], "FP32"), grpcclient.InferInput("INPUT1", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT0")], request_id="grpc-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert result.as_numpy("OUTPUT1") is None
    response = result.get_response()
    assert response.id == "grpc-7"
    assert response.model_version == "1"

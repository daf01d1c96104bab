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


def test_contents_and_raw_input_contents_together_are_refused(server: ServerProcess) -> None:
    """Triton refuses a request that sends one input in `contents` while using raw_input_contents;
    inferd used to answer from the raw contents and ignore the typed ones."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    request = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        request.raw_input_contents.append(np.ones((1, 16), dtype=np.float32).tobytes())
    tensor.contents.fp32_contents.extend([2.0] * 16)  # INPUT1 also typed: the mix
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details().startswith(
            "contents field must not be specified when using raw_input_contents for 'INPUT1' for model 'add_sub'"
        )
        del request.inputs[1].contents.fp32_contents[:]  # the same request without the mix is answered
        assert len(stub.ModelInfer(request, timeout=10).raw_output_contents) == 2


def test_methods_inferd_does_not_serve_answer_unimplemented_by_name(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    from tritonclient.utils import InferenceServerException

    for _ in range(2):
        with pytest.raises(InferenceServerException) as raised:
            client.get_log_settings()
        assert raised.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "inferd does not implement inference.GRPCInferenceService/LogSettings" in str(raised.value)
    log = server.log()
    assert "NotImplementedError" not in log and "Traceback" not in log
    assert log.count("GRPCInferenceService/LogSettings, which inferd does not implement") == 1

"""What Triton's own client programs tripped on (issue 28), through tritonclient (HTTP and gRPC)
against a real `inferd serve`: the CUDA shared memory calls a program makes to clean up before it
starts (status and unregister answer no regions, register says the server has no GPU
registration); classification over ModelStreamInfer; requests with mistakes answered with the
error Triton gives first, in Triton's words; an ensemble answering classification with its step's
labels (or its own, when it has a label file)."""

from __future__ import annotations

import base64
import json
import queue
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inferd.testing.models import add_sub_model, identity_model, mlp_model, python_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import ServerProcess, run_server
from inferd.types import DataType
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

LABELS = ["cat", "dog", "bird", "fish"]
OWN_LABELS = ["one", "two", "three", "four"]
CLASSIFIER = """
max_batch_size: 8
input [{ name: "x", data_type: TYPE_FP32, dims: [16] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [4], label_filename: "labels.txt" }]
"""
# The ensemble's output comes from the classifier's `y`; the ensemble has no label file of its own.
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 8
input [{ name: "pixels", data_type: TYPE_FP32, dims: [16] }]
output [{ name: "scores", data_type: TYPE_FP32, dims: [4] }]
ensemble_scheduling {
  step [{ model_name: "classifier" model_version: -1
          input_map { key: "x" value: "pixels" } output_map { key: "y" value: "scores" } }]
}
"""
X = np.linspace(-1, 1, 48, dtype=np.float32).reshape(3, 16)
# L0_input_validation's two models: three required FP32 [1] inputs, and the same with a fourth, optional.
SUM = """
import numpy as np

class Model:
    def execute(self, inputs):
        return {"OUTPUT0": sum(inputs.values())}
"""
INPUTS = """
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [1] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [1] },
       { name: "INPUT2", data_type: TYPE_FP32, dims: [1] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [1] }]
"""
OPTIONAL_INPUT = INPUTS.replace(
    "dims: [1] }]\noutput",
    'dims: [1] },\n       { name: "INPUT3", data_type: TYPE_FP32, dims: [1], optional: true }]\noutput',
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    mlp_model(repository / "classifier" / "1" / "model.onnx", seed=3)
    write_model_config(repository / "classifier", CLASSIFIER)
    (repository / "classifier" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    write_model_config(repository / "classify_ensemble", ENSEMBLE)
    (repository / "classify_ensemble" / "1").mkdir()
    own_labels = ENSEMBLE.replace("dims: [4] }", 'dims: [4], label_filename: "names.txt" }')
    write_model_config(repository / "relabelled_ensemble", own_labels)
    (repository / "relabelled_ensemble" / "1").mkdir()
    (repository / "relabelled_ensemble" / "names.txt").write_text("\n".join(OWN_LABELS) + "\n")
    add_sub_model(repository / "simple" / "1" / "model.onnx")
    identity_model(repository / "strings" / "1" / "model.onnx", DataType.BYTES, ["batch", -1])
    write_model_config(repository / "strings", "max_batch_size: 8")
    for name, config in (("input_all_required", INPUTS), ("input_optional", OPTIONAL_INPUT)):
        python_model(repository / name / "1", SUM)
        write_model_config(repository / name, config)
    with run_server(repository, tmp_path_factory.mktemp("logs") / "server.log") as process:
        yield process


def top_classes(scores: np.ndarray, count: int, labels: list[str] = LABELS) -> list[list[str]]:
    """Triton's "score:index:label" of each row's `count` highest scores."""
    return [[f"{row[i]:f}:{i}:{labels[i]}" for i in np.argsort(-row, kind="stable")[:count]] for row in scores]


def as_text(classes: np.ndarray) -> list[list[str]]:
    return [[c.decode() if isinstance(c, bytes) else c for c in row] for row in classes]


# -- CUDA shared memory on a server without GPU registration ----------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_status_and_unregister_answer_no_regions(server: ServerProcess, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    key = f"/inferd_cuda_{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("input_data", key, X.nbytes)
    try:
        with module.InferenceServerClient(url) as client:
            # What Triton's example programs do before their first inference (simple_*_shm_client.py).
            client.unregister_system_shared_memory()
            client.unregister_cuda_shared_memory()
            client.unregister_cuda_shared_memory("never_registered")
            status = client.get_cuda_shared_memory_status()
            assert status == [] if protocol == "http" else len(status.regions) == 0, status
            with pytest.raises(InferenceServerException) as missing:
                client.get_cuda_shared_memory_status("output_data")
            assert missing.value.message().startswith("Unable to find cuda shared memory region: 'output_data'")
            # A system region asked for as a CUDA one: Triton says which kind it is.
            shm.set_shared_memory_region(region, [X])
            client.register_system_shared_memory("input_data", key, X.nbytes)
            with pytest.raises(InferenceServerException) as other_kind:
                client.get_cuda_shared_memory_status("input_data")
            assert "'input_data' is registered as system shared memory, not CUDA shared memory" in str(other_kind.value)
            # ... and the program goes on to its inference from system shared memory.
            tensor = module.InferInput("x", [3, 16], "FP32")
            tensor.set_shared_memory("input_data", X.nbytes)
            result = client.infer("classifier", [tensor])
            assert result.as_numpy("y").shape == (3, 4)
            client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(region)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_register_says_this_server_has_no_gpu_registration(server: ServerProcess, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    # A cudaIpcMemHandle_t's 64 bytes (base64 in HTTP's JSON body, as cudashm.get_raw_handle gives them).
    handle = base64.b64encode(bytes(64)).decode() if protocol == "http" else bytes(64)
    with module.InferenceServerClient(url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.register_cuda_shared_memory("gpu_input", handle, 0, 64)
        status = client.get_cuda_shared_memory_status()
    message = refused.value.message()
    # Triton's own answer when built without GPUs, then inferd's explanation.
    assert message.startswith("failed to register CUDA shared memory region: 'gpu_input', GPUs not supported")
    assert "system shared memory" in message
    if protocol == "grpc":
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert len(status.regions) == 0
    else:
        assert refused.value.status() == "400"
        assert status == []


# -- classification over the stream -----------------------------------------------------------------


def test_classification_over_model_stream_infer(server: ServerProcess) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("x", [3, 16], "FP32")
        tensor.set_data_from_numpy(X)
        scores = client.infer("classifier", [tensor]).as_numpy("y")
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for count in (1, 3):
                outputs = [grpcclient.InferRequestedOutput("y", class_count=count)]
                client.async_stream_infer("classifier", [tensor], outputs=outputs, request_id=str(count))
                result, error = answers.get(timeout=30)
                assert error is None, error
                classes = result.as_numpy("y")
                assert result.get_output("y").datatype == "BYTES" and classes.shape == (3, count)
                assert as_text(classes) == top_classes(scores, count)
            # A bad value is the stream's error for that request, as the unary call's is.
            outputs = [grpcclient.InferRequestedOutput("y")]
            outputs[0]._output.parameters["classification"].int64_param = -1
            client.async_stream_infer("classifier", [tensor], outputs=outputs)
            result, error = answers.get(timeout=30)
            assert result is None and "invalid value for the 'classification' parameter" in str(error)
        finally:
            client.stop_stream()


# -- Triton's errors first ----------------------------------------------------------------------------


def _model_infer(server: ServerProcess, request: Any) -> grpc.RpcError:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return raised.value


def test_typed_contents_beside_raw_contents_is_tritons_error_for_the_first_input(server: ServerProcess) -> None:
    """grpc_explicit_int_content_client.py's last request: both inputs typed, then one raw entry and
    typed contents on the first input; the program looks for Triton's sentence naming INPUT0."""
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16]).contents.fp32_contents.extend([1.0] * 16)
    request.raw_input_contents.append(np.zeros(8, dtype=np.float32).tobytes())
    error = _model_infer(server, request)
    assert error.details().startswith(
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple': "
    ), error.details()


def test_an_input_without_data_is_tritons_unable_to_find_data(server: ServerProcess) -> None:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.zeros(16, dtype=np.float32).tobytes())
    error = _model_infer(server, request)
    assert error.details().startswith(
        "unable to find data for input tensor 'INPUT1' for model 'simple' in request: "
    ), error.details()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_that_do_not_fit_the_shape_are_tritons_byte_size_mismatch(server: ServerProcess, protocol: str) -> None:
    """What Triton's shared memory and input validation tests look for: 128 bytes sent for [1, 16] FP32."""
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with module.InferenceServerClient(url) as client:
        inputs = [module.InferInput(name, [1, 32], "FP32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 32), dtype=np.float32))
        inputs[0].set_shape([1, 16])
        with pytest.raises(InferenceServerException) as raised:
            client.infer("simple", inputs)
    assert raised.value.message().startswith(
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 128: "
    ), raised.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("sent", "phrase"),
    [
        (3, "expected 5 string elements for inference input 'INPUT0' for model 'strings', got 3: "),
        (6, "unexpected number of string elements 6 for inference input 'INPUT0' for model 'strings', expecting 5: "),
    ],
    ids=["fewer", "more"],
)
def test_string_elements_that_do_not_fit_the_shape_are_tritons_errors(
    server: ServerProcess, protocol: str, sent: int, phrase: str
) -> None:
    """L0_input_validation's string checks: the data holds `sent` elements, the shape declares 5."""
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with module.InferenceServerClient(url) as client:
        tensor = module.InferInput("INPUT0", [1, sent], "BYTES")
        if protocol == "http":
            tensor.set_data_from_numpy(np.array([[b"ab"] * sent], dtype=object), binary_data=True)
        else:
            tensor.set_data_from_numpy(np.array([[b"ab"] * sent], dtype=object))
        tensor.set_shape([1, 5])
        with pytest.raises(InferenceServerException) as raised:
            client.infer("strings", [tensor])
    assert raised.value.message().startswith(phrase), raised.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("model", "sent", "sentence"),
    [
        ("input_all_required", [], "expected 3 inputs but got 0 inputs for model 'input_all_required'. Got input(s) "
         "[], but missing required input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all required input(s)."),
        ("input_optional", [], "expected number of inputs between 3 and 4 but got 0 inputs for model "
         "'input_optional'. Got input(s) [], but missing required input(s) ['INPUT0','INPUT1','INPUT2']. Please "
         "provide all required input(s)."),
        ("input_all_required", ["INPUT0"], "expected 3 inputs but got 1 inputs for model 'input_all_required'. Got "
         "input(s) ['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. Please provide all required "
         "input(s)."),
        ("input_optional", ["INPUT3"], "expected number of inputs between 3 and 4 but got 1 inputs for model "
         "'input_optional'. Got input(s) ['INPUT3'], but missing required input(s) ['INPUT0','INPUT1','INPUT2']. "
         "Please provide all required input(s)."),
        # Too many: counted before the unknown name is looked at, as Triton does.
        ("input_all_required", ["INPUT0", "INPUT1", "INPUT2", "EXTRA"], "expected 3 inputs but got 4 inputs for "
         "model 'input_all_required'. Got input(s) ['INPUT0','INPUT1','INPUT2','EXTRA'], but missing required "
         "input(s) []"),
    ],
    ids=["required-none", "optional-none", "required-one", "optional-only-optional", "one-too-many"],
)  # fmt: skip
def test_missing_inputs_are_tritons_whole_sentence(
    server: ServerProcess, protocol: str, model: str, sent: list[str], sentence: str
) -> None:
    """L0_input_validation compares Triton's whole sentence (assertIn)."""
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with module.InferenceServerClient(url) as client:
        inputs = [module.InferInput(name, [1], "FP32") for name in sent]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, inputs)
        assert sentence in str(raised.value), str(raised.value)
        # All three given: answered.
        complete = [module.InferInput(f"INPUT{i}", [1], "FP32") for i in range(3)]
        for tensor in complete:
            tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        assert client.infer(model, complete).as_numpy("OUTPUT0").tolist() == [3.0]


def test_a_name_given_twice_is_tritons_already_exists(server: ServerProcess) -> None:
    """L0_http's duplicate output names: a 400 with Triton's sentence (and so for inputs, over gRPC)."""
    row = [1.0] * 16
    body = {
        "inputs": [{"name": f"INPUT{i}", "datatype": "FP32", "shape": [1, 16], "data": row} for i in (0, 1)],
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}],
    }
    reply = http_request(server, "POST", "/v2/models/simple/infer", json.dumps(body).encode())
    assert reply.status == 400 and json.loads(reply.body)["error"].startswith(
        "output 'OUTPUT0' already exists in request: "
    ), reply.body
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16]).contents.fp32_contents.extend(row)
    assert _model_infer(server, request).details().startswith("input 'INPUT0' already exists in request: ")


def test_a_repository_index_asked_with_a_ready_that_is_not_a_boolean(server: ServerProcess) -> None:
    reply = http_request(server, "POST", "/v2/repository/index", b'{"ready": "yes"}')
    error = json.loads(reply.body)["error"]
    assert reply.status == 400 and error.startswith("Invalid value for 'ready': expected a boolean: "), error


def test_an_unknown_output_is_named_before_the_inputs_are_counted(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        with pytest.raises(InferenceServerException) as raised:
            client.infer("simple", [tensor], outputs=[grpcclient.InferRequestedOutput("q")])
    assert raised.value.message().startswith("unexpected inference output 'q' for model 'simple'")


# -- labels through ensembles ---------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("model", "labels"), [("classify_ensemble", LABELS), ("relabelled_ensemble", OWN_LABELS)])
def test_an_ensemble_classifies_with_its_steps_labels(
    server: ServerProcess, protocol: str, model: str, labels: list[str]
) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    with module.InferenceServerClient(url) as client:
        tensor = module.InferInput("pixels", [3, 16], "FP32")
        tensor.set_data_from_numpy(X)
        scores = client.infer(model, [tensor]).as_numpy("scores")
        outputs = [module.InferRequestedOutput("scores", class_count=2)]
        classes = client.infer(model, [tensor], outputs=outputs).as_numpy("scores")
    assert as_text(classes) == top_classes(scores, 2, labels)

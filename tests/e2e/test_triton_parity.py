"""What Triton's own client programs rely on, through tritonclient (HTTP and gRPC) against a real
`inferd serve`: the model-configuration API echoes every field of config.pbtxt, those inferd does
not act on included."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc

from inferd.testing.models import mlp_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import ServerProcess, run_server

pytestmark = pytest.mark.e2e

CLASSIFIER_CONFIG = """
max_batch_size: 8
input [{ name: "x", data_type: TYPE_FP32, format: FORMAT_NCHW, dims: [16] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [4], label_filename: "labels.txt" }]
instance_group [{ kind: KIND_CPU, count: 1, rate_limiter { priority: 2 } }]
optimization { input_pinned_memory { enable: true } }
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    mlp_model(repository / "classifier" / "1" / "model.onnx", seed=3)
    write_model_config(repository / "classifier", CLASSIFIER_CONFIG)
    (repository / "classifier" / "labels.txt").write_text("cat\ndog\nbird\nfish\n")
    with run_server(repository, tmp_path_factory.mktemp("logs") / "server.log") as process:
        yield process


def test_the_configuration_api_echoes_every_field(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        config = client.get_model_config("classifier")
    assert config["input"][0]["format"] == "FORMAT_NCHW"
    assert config["output"][0]["label_filename"] == "labels.txt"
    assert config["output"][0]["dims"] == [4] and config["input"][0]["dims"] == [16]
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    assert config["instance_group"][0]["rate_limiter"]["priority"] == 2
    assert config["instance_group"][0]["count"] == 1 and config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    # Triton's form: scalars at their defaults printed too, unset messages left out.
    assert config["input"][0]["is_shape_tensor"] is False and config["output"][0]["is_shape_tensor"] is False
    assert "sequence_batching" not in config and "ensemble_scheduling" not in config

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        message = client.get_model_config("classifier").config
    assert message.input[0].format == mc.ModelInput.FORMAT_NCHW
    assert message.output[0].label_filename == "labels.txt"
    assert message.optimization.input_pinned_memory.enable
    assert message.instance_group[0].rate_limiter.priority == 2

    # What inferd does not act on is still listed as ignored when the model loads.
    log = server.log()
    assert "config fields not supported and ignored" in log and "optimization" in log

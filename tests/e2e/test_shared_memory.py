"""Triton's system shared memory extension through tritonclient (HTTP and gRPC) and
`tritonclient.utils.shared_memory` against a real `inferd serve`: regions registered, listed and
unregistered; inputs read from and outputs written to them, offsets included; bounds, names and
keys checked; a region unregistered while a request runs is a 400 for that request only."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from inferd.testing.models import mlp_model, sleepy_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import ServerProcess, run_server

pytestmark = pytest.mark.e2e
X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)


@pytest.fixture(scope="module")
def hold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, hold: Path) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    mlp_model(repository / "mlp" / "1" / "model.onnx", seed=2)
    write_model_config(repository / "mlp", "max_batch_size: 8")
    sleepy_model(repository / "held", 0, 8, hold_file=hold)
    with run_server(repository, tmp_path_factory.mktemp("logs") / "server.log") as process:
        yield process


class Regions:
    """Regions this test made (POSIX shared memory), destroyed when it ends."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def make(self, byte_size: int) -> tuple[str, str, Any]:
        name = f"r{uuid.uuid4().hex[:8]}"
        key = f"/inferd_test_{name}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        return name, key, handle


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    for handle in made.handles:
        shm.destroy_shared_memory_region(handle)


def plain_output(server: ServerProcess) -> np.ndarray:
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("x", [2, 16], "FP32")
        tensor.set_data_from_numpy(X)
        answer = client.infer("mlp", [tensor]).as_numpy("y")
    assert answer is not None
    return answer


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_through_registered_regions(server: ServerProcess, regions: Regions, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    expected = plain_output(server)
    # One input region with the tensor 64 bytes in; the output in a region of its own, at an offset.
    in_name, in_key, in_handle = regions.make(64 + X.nbytes)
    shm.set_shared_memory_region(in_handle, [X], offset=64)
    out_name, out_key, out_handle = regions.make(32 + expected.nbytes)
    with module.InferenceServerClient(url) as client:
        client.register_system_shared_memory(in_name, in_key, 64 + X.nbytes)
        client.register_system_shared_memory(out_name, out_key, 32 + expected.nbytes)
        status = client.get_system_shared_memory_status()
        names = {entry["name"] for entry in status} if protocol == "http" else set(status.regions)
        assert {in_name, out_name} <= names
        tensor = module.InferInput("x", [2, 16], "FP32")
        tensor.set_shared_memory(in_name, X.nbytes, offset=64)
        output = module.InferRequestedOutput("y")
        output.set_shared_memory(out_name, expected.nbytes, offset=32)
        result = client.infer("mlp", [tensor], outputs=[output])
        placed = result.get_output("y")  # as Triton's: the output's name, datatype and shape, no data
        if protocol == "http":
            assert placed == {"name": "y", "datatype": "FP32", "shape": [2, 4]}
        else:
            assert list(placed.shape) == [2, 4] and result.get_response().raw_output_contents[0] == b""
        written = shm.get_contents_as_numpy(out_handle, np.float32, [2, 4], offset=32)
        np.testing.assert_allclose(written, expected, rtol=1e-6)
        client.unregister_system_shared_memory(in_name)
        client.unregister_system_shared_memory(out_name)
        status = client.get_system_shared_memory_status()
        names = {entry["name"] for entry in status} if protocol == "http" else set(status.regions)
        assert not {in_name, out_name} & names


def test_bad_regions_and_placements_are_the_clients_errors(server: ServerProcess, regions: Regions) -> None:
    name, key, handle = regions.make(X.nbytes)
    shm.set_shared_memory_region(handle, [X])
    with httpclient.InferenceServerClient(server.http_url) as client:
        with pytest.raises(InferenceServerException, match="Unable to open shared memory region: '/inferd_nothing'"):
            client.register_system_shared_memory("nothing", "/inferd_nothing", 16)
        with pytest.raises(InferenceServerException, match="is not a POSIX shared memory name"):
            client.register_system_shared_memory("escape", "/../etc/passwd", 16)
        # A NUL in the key was a 500 (os.open's ValueError); found by schemathesis (tests/e2e/test_openapi.py).
        with pytest.raises(InferenceServerException, match="is not a POSIX shared memory name"):
            client.register_system_shared_memory("nul", "/inferd\0x", 16)
        with pytest.raises(InferenceServerException, match="is past the end"):
            client.register_system_shared_memory(name, key, X.nbytes + 1)
        client.register_system_shared_memory(name, key, X.nbytes)
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory(name, key, X.nbytes)

        def infer(region: str, byte_size: int, offset: int = 0) -> Any:
            tensor = httpclient.InferInput("x", [2, 16], "FP32")
            tensor.set_shared_memory(region, byte_size, offset=offset)
            return client.infer("mlp", [tensor])

        # Triton's sentences first (its clients' tests compare them), then inferd's.
        with pytest.raises(
            InferenceServerException,
            match=f"^.*Invalid offset \\+ byte size for shared memory region: '{name}': .*past the end",
        ):
            infer(name, X.nbytes, offset=4)
        with pytest.raises(InferenceServerException, match=f"Invalid offset for shared memory region: '{name}'"):
            infer(name, 4, offset=X.nbytes)
        with pytest.raises(
            InferenceServerException, match=r"Unable to find shared memory region: 'unknown': .*is not registered"
        ):
            infer("unknown", X.nbytes)
        with pytest.raises(InferenceServerException, match=r"needs 128 bytes .* but 124 bytes were sent"):
            infer(name, X.nbytes - 4)  # too few bytes for a [2, 16] FP32 tensor
        assert infer(name, X.nbytes).as_numpy("y").shape == (2, 4)

        tensor = httpclient.InferInput("x", [2, 16], "FP32")
        tensor.set_data_from_numpy(X)
        output = httpclient.InferRequestedOutput("y")
        output.set_shared_memory(name, 8)  # the output needs 32 bytes
        with pytest.raises(InferenceServerException, match="needs 32 bytes"):
            client.infer("mlp", [tensor], outputs=[output])
        client.unregister_system_shared_memory()  # every region
        assert client.get_system_shared_memory_status() == []
        with pytest.raises(InferenceServerException, match="is not registered"):
            infer(name, X.nbytes)


def test_a_region_unregistered_while_a_request_runs(server: ServerProcess, regions: Regions, hold: Path) -> None:
    name, key, _ = regions.make(64)
    outcome: dict[str, Any] = {}
    hold.touch()  # the held model waits while this file exists
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.register_system_shared_memory(name, key, 64)

            def run() -> None:
                with grpcclient.InferenceServerClient(server.grpc_url) as own:
                    tensor = grpcclient.InferInput("x", [1, 4], "FP32")
                    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
                    output = grpcclient.InferRequestedOutput("y")
                    output.set_shared_memory(name, 16)
                    try:
                        own.infer("held", [tensor], outputs=[output], client_timeout=60)
                        outcome["result"] = "answered"
                    except InferenceServerException as exc:
                        outcome["result"] = exc

            worker = threading.Thread(target=run)
            worker.start()
            deadline = time.monotonic() + 30
            while not _in_flight(server):  # until the request is inside the model
                assert time.monotonic() < deadline and not outcome, outcome
                time.sleep(0.05)
            client.unregister_system_shared_memory(name)
    finally:
        hold.unlink()
    worker.join(timeout=60)
    error = outcome["result"]
    assert isinstance(error, InferenceServerException), error
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "was unregistered while the request ran" in str(error)
    # The server goes on serving everyone else.
    assert plain_output(server).shape == (2, 4)


def _in_flight(server: ServerProcess) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return any(
        line.startswith('inferd_requests_in_flight{model="held"') and not line.rstrip().endswith(" 0.0")
        for line in text.splitlines()
    )

"""Who may make the server run code or map memory, through tritonclient over HTTP and gRPC against
real `inferd serve` processes: model uploads and code-changing config overrides refused unless the
operator opts in (`--allow-model-upload`, with management tokens or on loopback only); every path a
config names confined to the model's folder; shared memory registered only by clients on this host
(or holding a management token), for objects of the server's own user and, when set, its prefix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from inferd.testing.models import mlp_model, python_model, write_config
from inferd.testing.server import ServerProcess, run_server
from inferd.tools.ports import free_ports
from tests.e2e.conftest import Clients, http_request

pytestmark = pytest.mark.e2e

TOKEN = "s3cret-management-token"


def evil_source(marker: Path) -> str:
    """A Python model whose import (top-level code) writes `marker`: proof that it ran."""
    return textwrap.dedent(
        f"""
        from pathlib import Path
        Path({str(marker)!r}).write_text("ran")

        import numpy as np

        class Model:
            inputs = [{{"name": "x", "datatype": "FP32", "shape": [-1]}}]
            outputs = [{{"name": "y", "datatype": "FP32", "shape": [-1]}}]

            def execute(self, inputs):
                return {{"y": inputs["x"]}}
        """
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    mlp_model(root / "mlp" / "1" / "model.onnx", seed=1)
    write_config(root / "mlp", "max_batch_size: 8")
    write_config(root / "remote", 'backend: "remote"\nparameters { key: "url" value { string_value: "127.0.0.1:9" } }')
    return root


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the repository holding a Python model file, and where markers go."""
    return tmp_path_factory.mktemp("outside")


@pytest.fixture(scope="module")
def default_server(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(root, log, "--model-control-mode", "explicit", "--load-model", "mlp") as server:
        yield server


def token_header() -> dict[str, str]:
    # A new dict each call: tritonclient's HTTP client adds its own headers to the one it is given.
    return {"authorization": f"Bearer {TOKEN}"}


def upload(
    client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient, name: str, marker: Path
) -> None:
    config = json.dumps({"backend": "python", "max_batch_size": 0})
    client.load_model(name, config=config, files={"file:1/model.py": evil_source(marker).encode()})


# -- 1. uploads and overrides ----------------------------------------------------------------------


def test_uploads_are_refused_by_default_and_the_code_never_runs(
    clients: Clients, default_server: ServerProcess, outside: Path
) -> None:
    for door, client in (
        ("http", clients.http(default_server.http_url)),
        ("grpc", clients.grpc(default_server.grpc_url)),
    ):
        marker = outside / f"uploaded-{door}"
        with pytest.raises(InferenceServerException) as raised:
            upload(client, f"evil_{door}", marker)
        status = raised.value.status()
        assert status in ("403", "StatusCode.PERMISSION_DENIED"), (door, status)
        assert "--allow-model-upload" in raised.value.message()
        assert not marker.exists(), f"{door}: the uploaded module's top-level code ran"
    assert not clients.http(default_server.http_url).is_model_ready("evil_http")


def test_a_config_override_cannot_import_a_file_of_the_host(
    clients: Clients, default_server: ServerProcess, outside: Path
) -> None:
    marker = outside / "override-ran"
    python_model(outside / "anywhere", evil_source(marker))
    target = str(outside / "anywhere" / "model.py")
    for client in (clients.http(default_server.http_url), clients.grpc(default_server.grpc_url)):
        # The backend changed: refused as an upload is (403), whatever the path.
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("mlp", config=json.dumps({"backend": "python", "default_model_filename": target}))
        assert raised.value.status() in ("403", "StatusCode.PERMISSION_DENIED")
        assert "--allow-model-upload" in raised.value.message()
        # The same backend, a path out of the version folder: confined whatever the opt-in (400).
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("mlp", config=json.dumps({"default_model_filename": "../../../outside.onnx"}))
        assert raised.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        assert "outside the model's folder" in raised.value.message()
    assert not marker.exists()
    # The model that served still serves.
    assert clients.http(default_server.http_url).is_model_ready("mlp")


def test_a_config_override_cannot_point_a_remote_model_elsewhere(
    clients: Clients, default_server: ServerProcess
) -> None:
    body = {"backend": "remote", "parameters": {"url": {"string_value": "203.0.113.9:8000"}}}
    for client in (clients.http(default_server.http_url), clients.grpc(default_server.grpc_url)):
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("remote", config=json.dumps(body))
        assert raised.value.status() in ("403", "StatusCode.PERMISSION_DENIED")
        assert "url" in raised.value.message()
        with pytest.raises(InferenceServerException) as raised:  # an ONNX model turned remote
            client.load_model("mlp", config=json.dumps(body))
        assert raised.value.status() in ("403", "StatusCode.PERMISSION_DENIED")


def test_the_startup_log_says_who_may_manage(default_server: ServerProcess) -> None:
    lines = [line for line in default_server.log().splitlines() if "management: repository load/unload" in line]
    assert len(lines) == 1, lines
    assert "model upload and code-changing config overrides: refused" in lines[0]
    assert "shared memory registration: clients on this host" in lines[0]


def test_repository_configs_are_confined_too(tmp_path: Path, outside: Path) -> None:
    """An operator's config (any mode) naming a file outside its folder fails that model's load; the
    file is never imported."""
    marker = outside / "repository-config-ran"
    python_model(outside / "elsewhere", evil_source(marker))
    root = tmp_path / "repository"
    (root / "absolute" / "1").mkdir(parents=True)
    (root / "absolute" / "1" / "README").write_text("the model file is named by the config")
    write_config(
        root / "absolute", f'backend: "python"\ndefault_model_filename: "{outside / "elsewhere" / "model.py"}"'
    )
    mlp_model(root / "mlp" / "1" / "model.onnx")
    with run_server(root, tmp_path / "server.log") as server:
        index = {e["name"]: e for e in json.loads(http_request(server, "POST", "/v2/repository/index").body)}
        assert (
            index["absolute"]["state"] == "UNAVAILABLE" and "outside the model's folder" in index["absolute"]["reason"]
        )
        assert http_request(server, "GET", "/v2/models/mlp/ready").status == 200
    assert not marker.exists()


def test_a_link_out_of_the_version_folder_is_not_imported(tmp_path: Path, outside: Path) -> None:
    marker = outside / "link-ran"
    python_model(outside / "linked_target", evil_source(marker))
    root = tmp_path / "repository"
    (root / "linked" / "1").mkdir(parents=True)
    write_config(root / "linked", 'backend: "python"\ndefault_model_filename: "model.py"')
    (root / "linked" / "1" / "model.py").symlink_to(outside / "linked_target" / "model.py")
    with run_server(root, tmp_path / "server.log") as server:
        index = {e["name"]: e for e in json.loads(http_request(server, "POST", "/v2/repository/index").body)}
        assert index["linked"]["state"] == "UNAVAILABLE" and "outside the model's folder" in index["linked"]["reason"]
    assert not marker.exists()


def test_uploads_with_the_opt_in_need_a_management_token(clients: Clients, root: Path, tmp_path: Path) -> None:
    marker = tmp_path / "with-token"
    flags = ("--model-control-mode", "explicit", "--allow-model-upload")
    with run_server(root, tmp_path / "server.log", *flags, env={"INFERD_MANAGEMENT_TOKENS": TOKEN}) as server:
        for door, client in (("http", clients.http(server.http_url)), ("grpc", clients.grpc(server.grpc_url))):
            with pytest.raises(InferenceServerException) as raised:
                upload(client, f"no_token_{door}", marker)
            assert raised.value.status() in ("401", "StatusCode.UNAUTHENTICATED")
            assert not marker.exists()
        http = clients.http(server.http_url)
        config = json.dumps({"backend": "python", "max_batch_size": 0})
        http.load_model(
            "sent", config=config, files={"file:1/model.py": evil_source(marker).encode()}, headers=token_header()
        )
        assert marker.exists()  # the opt-in and a token: the operator allowed it
        x = httpclient.InferInput("x", [3], "FP32")
        x.set_data_from_numpy(np.arange(3, dtype=np.float32))
        np.testing.assert_array_equal(http.infer("sent", [x], headers=token_header()).as_numpy("y"), [0, 1, 2])
        marker.unlink()
        grpc = clients.grpc(server.grpc_url)
        grpc.load_model(
            "sent_grpc", config=config, files={"file:1/model.py": evil_source(marker).encode()}, headers=token_header()
        )
        assert marker.exists()


def test_uploads_with_the_opt_in_on_loopback_need_no_token(clients: Clients, root: Path, tmp_path: Path) -> None:
    marker = tmp_path / "loopback"
    with run_server(
        root, tmp_path / "server.log", "--model-control-mode", "explicit", "--allow-model-upload"
    ) as server:
        upload(clients.grpc(server.grpc_url), "sent", marker)
        assert marker.exists()
        assert "model upload and code-changing config overrides: any client (no tokens)" in server.log()


def test_the_opt_in_without_tokens_off_loopback_does_not_start(root: Path, tmp_path: Path) -> None:
    ports = free_ports(3)
    command = [sys.executable, "-m", "inferd", "serve", "--model-repository", str(root), "--host", "0.0.0.0",
               "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
               "--model-control-mode", "explicit", "--allow-model-upload", "--log-format", "text"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERD_")}
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert finished.returncode == 2, finished.stdout + finished.stderr
    output = finished.stdout + finished.stderr
    assert "not starting" in output and "--management-tokens-file" in output and "0.0.0.0" in output


# -- 1b. shared memory ----------------------------------------------------------------------------


@pytest.fixture
def shm_objects() -> Iterator[list[str]]:
    """Names of /dev/shm objects a test made by hand, removed after it."""
    made: list[str] = []
    yield made
    for name in made:
        Path("/dev/shm", name).unlink(missing_ok=True)


def test_an_object_of_another_user_is_never_mapped(
    clients: Clients, default_server: ServerProcess, shm_objects: list[str]
) -> None:
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("making an object owned by another user needs root")  # CI and the dev machines run as root
    name = f"inferd_other_{uuid.uuid4().hex[:8]}"
    shm_objects.append(name)
    secret = Path("/dev/shm", name)
    secret.write_bytes(b"S" * 64)
    os.chmod(secret, 0o600)
    os.chown(secret, 65534, 65534)  # nobody
    for client in (clients.http(default_server.http_url), clients.grpc(default_server.grpc_url)):
        with pytest.raises(InferenceServerException) as raised:
            client.register_system_shared_memory("stolen", f"/{name}", 64)
        assert raised.value.status() in ("403", "StatusCode.PERMISSION_DENIED")
        assert "another user" in raised.value.message()
        assert not _listed(client)


def _listed(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient) -> bool:
    status = client.get_system_shared_memory_status()
    return bool(status if isinstance(status, list) else status.regions)


def test_a_link_in_dev_shm_is_not_followed(
    clients: Clients, default_server: ServerProcess, shm_objects: list[str], tmp_path: Path
) -> None:
    target = tmp_path / "host-file"
    target.write_bytes(b"H" * 64)
    name = f"inferd_link_{uuid.uuid4().hex[:8]}"
    shm_objects.append(name)
    Path("/dev/shm", name).symlink_to(target)
    client = clients.http(default_server.http_url)
    with pytest.raises(InferenceServerException) as raised:
        client.register_system_shared_memory("linked", f"/{name}", 64)
    assert raised.value.status() == "400"
    assert not _listed(client)


def test_the_prefix_limits_what_may_be_registered(clients: Clients, root: Path, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    allowed = shm.create_shared_memory_region(f"a{suffix}", f"/inferd_ok_{suffix}", 64)
    other = shm.create_shared_memory_region(f"o{suffix}", f"/elsewhere_{suffix}", 64)
    try:
        with run_server(root, tmp_path / "server.log", "--shared-memory-prefix", "/inferd_ok_") as server:
            for client in (clients.http(server.http_url), clients.grpc(server.grpc_url)):
                with pytest.raises(InferenceServerException) as raised:
                    client.register_system_shared_memory("other", f"/elsewhere_{suffix}", 64)
                assert raised.value.status() in ("403", "StatusCode.PERMISSION_DENIED")
                assert "--shared-memory-prefix" in raised.value.message()
                client.register_system_shared_memory("mine", f"/inferd_ok_{suffix}", 64)
                client.unregister_system_shared_memory("mine")
    finally:
        shm.destroy_shared_memory_region(allowed)
        shm.destroy_shared_memory_region(other)


def test_regions_are_capped_and_hold_no_descriptor_each(clients: Clients, root: Path, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    handle = shm.create_shared_memory_region(f"c{suffix}", f"/inferd_cap_{suffix}", 4096)
    try:
        with run_server(root, tmp_path / "server.log", "--max-shared-memory-regions", "200") as server:
            client = clients.http(server.http_url)
            fds_before = len(os.listdir(f"/proc/{server.process.pid}/fd"))
            for index in range(200):
                client.register_system_shared_memory(f"r{index}", f"/inferd_cap_{suffix}", 16, offset=index * 16)
            fds_after = len(os.listdir(f"/proc/{server.process.pid}/fd"))
            assert fds_after - fds_before <= 2, (fds_before, fds_after)  # one mapping for the one object
            with pytest.raises(InferenceServerException) as raised:
                client.register_system_shared_memory("one_more", f"/inferd_cap_{suffix}", 16)
            assert raised.value.status() == "400" and "--max-shared-memory-regions" in raised.value.message()
            client.unregister_system_shared_memory()
            assert len(os.listdir(f"/proc/{server.process.pid}/fd")) <= fds_before + 1
            client.register_system_shared_memory("again", f"/inferd_cap_{suffix}", 16)
    finally:
        shm.destroy_shared_memory_region(handle)

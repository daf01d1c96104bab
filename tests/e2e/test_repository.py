"""Model management through Triton's repository extension, with tritonclient over HTTP and gRPC,
against a real `inferd serve` in explicit and poll model control modes."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.testing.models import add_sub_model, mlp_model, reference_session, sleepy_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import Clients, http_request
from tests.e2e.test_batching import wait_until_in_flight

pytestmark = pytest.mark.e2e

MLP_CONFIG = "max_batch_size: 8\ndynamic_batching { }"


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Polls `condition` until it holds (bounded): for what the server does on its own clock."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def mlp_output(client: httpclient.InferenceServerClient, model: str = "mlp", version: str = "") -> np.ndarray:
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor = httpclient.InferInput("x", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], model_version=version).as_numpy("y")


def expected_mlp(seed: int) -> np.ndarray:
    """What mlp_model(seed=...) answers for mlp_output's input, computed by onnxruntime in-process."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "model.onnx"
        mlp_model(path, seed=seed)
        session = reference_session(path)
        return session.run(["y"], {"x": np.arange(16, dtype=np.float32).reshape(1, 16)})[0]


def slow_output(url: str, x: np.ndarray) -> np.ndarray:
    """One request to the `slow` model (y = x, after a sleep) on a client of its own, closed in the
    calling thread: tritonclient's cannot be collected from another thread."""
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    with httpclient.InferenceServerClient(url) as client:
        return client.infer("slow", [tensor]).as_numpy("y")


def index(client: httpclient.InferenceServerClient) -> dict[str, list[dict[str, Any]]]:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for entry in client.get_model_repository_index():
        by_name.setdefault(entry["name"], []).append(entry)
    return by_name


# -- explicit mode --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def explicit_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explicit")
    mlp_model(root / "mlp" / "1" / "model.onnx", seed=1)
    write_config(root / "mlp", MLP_CONFIG)
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    sleepy_model(root / "slow", 1000, 0)  # the test sees both requests in flight within 1 s
    return root


@pytest.fixture(scope="module")
def explicit_server(explicit_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "server.log"
    # Uploads allowed: the server listens on 127.0.0.1 only (tests/e2e/test_security.py: the default refuses them).
    flags = ("--model-control-mode", "explicit", "--load-model", "mlp", "--allow-model-upload")
    with run_server(explicit_root, log, *flags) as server:
        yield server


def test_explicit_mode_loads_only_what_it_is_told(clients: Clients, explicit_server: ServerProcess) -> None:
    client = clients.http(explicit_server.http_url)
    entries = index(client)
    [mlp] = entries["mlp"]
    assert {key: mlp[key] for key in ("name", "version", "state")} == {"name": "mlp", "version": "1", "state": "READY"}
    # The cold-start breakdown of its load, in milliseconds.
    assert set(mlp["load_ms"]) == {"fetch", "session", "warmup"} and mlp["load_ms"]["session"] > 0
    assert entries["add_sub"] == [{"name": "add_sub"}]  # in the repository, never loaded
    assert [e["name"] for e in client.get_model_repository_index()] == sorted(entries)
    ready = http_request(explicit_server, "POST", "/v2/repository/index", json.dumps({"ready": True}).encode())
    assert [e["name"] for e in json.loads(ready.body)] == ["mlp"]
    assert not client.is_model_ready("add_sub")


def test_load_and_unload_over_http(clients: Clients, explicit_server: ServerProcess) -> None:
    from tests.e2e.test_observability import sample, scrape

    client = clients.http(explicit_server.http_url)
    before = scrape(explicit_server)
    client.load_model("add_sub")
    assert client.is_model_ready("add_sub")
    a = np.ones((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
    client.unload_model("add_sub")
    assert not client.is_model_ready("add_sub")
    assert index(client)["add_sub"] == [{"name": "add_sub", "state": "UNAVAILABLE", "reason": "unloaded"}]
    after = scrape(explicit_server)

    def grew(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, missing=0.0, **labels)

    assert grew("inferd_model_loads_total", outcome="success") == 1
    assert grew("inferd_model_unloads_total") == 1
    assert grew("inferd_model_load_duration_seconds_count", phase="session") == 1
    with pytest.raises(InferenceServerException) as raised:
        client.infer("add_sub", inputs)
    assert raised.value.status() == "503" and "unloaded" in raised.value.message()


def test_load_and_unload_over_grpc(clients: Clients, explicit_server: ServerProcess) -> None:
    client = clients.grpc(explicit_server.grpc_url)
    client.load_model("add_sub")
    assert client.is_model_ready("add_sub")
    models = {m.name: m for m in client.get_model_repository_index().models}
    assert (models["add_sub"].version, models["add_sub"].state) == ("1", "READY")
    client.unload_model("add_sub", unload_dependents=True)
    assert not client.is_model_ready("add_sub")


def test_loading_what_cannot_load_is_a_4xx_with_the_reason(clients: Clients, explicit_server: ServerProcess) -> None:
    client = clients.http(explicit_server.http_url)
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("no_such_model")
    assert raised.value.status() == "404"
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("broken")
    assert raised.value.status() == "400" and "onnxruntime cannot load" in raised.value.message()
    assert index(client)["broken"][0]["state"] == "UNAVAILABLE"
    for hostile in ("..", "../etc", "%2e%2e"):
        reply = http_request(explicit_server, "POST", f"/v2/repository/models/{hostile}/load")
        assert reply.status in (400, 404), (hostile, reply.status)


def test_config_override_that_fails_leaves_the_old_version_serving(
    clients: Clients, explicit_server: ServerProcess
) -> None:
    client = clients.http(explicit_server.http_url)
    before = mlp_output(client)
    bad = json.dumps({"max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [17]}]})
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("mlp", config=bad)
    assert raised.value.status() == "400" and "17" in raised.value.message()
    np.testing.assert_array_equal(mlp_output(client), before)
    [entry] = index(client)["mlp"]
    assert entry["state"] == "READY" and "reloading failed" in entry["reason"]
    # A good override applies: the served config says so.
    client.load_model("mlp", config=json.dumps({"max_batch_size": 4}))
    assert client.get_model_config("mlp")["max_batch_size"] == 4
    np.testing.assert_array_equal(mlp_output(client), before)
    client.load_model("mlp")  # back to its config.pbtxt
    assert client.get_model_config("mlp")["max_batch_size"] == 8


def test_load_files_in_a_folder_named_with_digits_int_cannot_read_is_a_400(explicit_server: ServerProcess) -> None:
    # "¹".isdigit() is True but int("¹") raises: such a file path was a 500.
    body = json.dumps({"parameters": {"config": "{}", "file:\u00b9/model.onnx": "AAAA"}}).encode()
    reply = http_request(explicit_server, "POST", "/v2/repository/models/mlp/load", body)
    assert reply.status == 400 and json.loads(reply.body)["code"] == "LOAD_REQUEST_FAILED", reply.body
    assert http_request(explicit_server, "GET", "/v2/models/mlp/ready").status == 200


@pytest.mark.parametrize("override", ["t", "[1]", '{"max_batch_size": "many"}', '{"name": "other"}'])
def test_a_config_override_that_is_no_config_is_a_400(explicit_server: ServerProcess, override: str) -> None:
    # Found by schemathesis (tests/e2e/test_openapi.py): such an override was a 503 MODEL_CONFIG_INVALID.
    body = json.dumps({"parameters": {"config": override}}).encode()
    reply = http_request(explicit_server, "POST", "/v2/repository/models/mlp/load", body)
    assert reply.status == 400 and json.loads(reply.body)["code"] == "LOAD_REQUEST_FAILED", reply.body
    assert http_request(explicit_server, "GET", "/v2/models/mlp/ready").status == 200


def test_load_with_files_serves_a_model_sent_by_the_client(
    clients: Clients, explicit_server: ServerProcess, tmp_path: Path
) -> None:
    mlp_model(tmp_path / "model.onnx", seed=7)
    content = (tmp_path / "model.onnx").read_bytes()
    for client in (clients.http(explicit_server.http_url), clients.grpc(explicit_server.grpc_url)):
        client.load_model("sent", config=json.dumps({"max_batch_size": 8}), files={"file:1/model.onnx": content})
        assert client.is_model_ready("sent")
    http = clients.http(explicit_server.http_url)
    np.testing.assert_allclose(mlp_output(http, "sent"), expected_mlp(7), rtol=1e-6)
    with pytest.raises(InferenceServerException) as raised:
        http.load_model("escape", config="{}", files={"file:../outside.onnx": content})
    assert raised.value.status() == "400" and "leaves the model's folder" in raised.value.message()
    http.unload_model("sent")


def test_unload_lets_accepted_requests_finish(clients: Clients, explicit_server: ServerProcess) -> None:
    from concurrent.futures import ThreadPoolExecutor

    client = clients.http(explicit_server.http_url)
    client.load_model("slow")
    x = np.full((4, 4), 2.0, dtype=np.float32)

    def call() -> np.ndarray:
        return slow_output(explicit_server.http_url, x)

    with ThreadPoolExecutor(2) as pool:
        accepted = [pool.submit(call) for _ in range(2)]
        wait_until_in_flight(explicit_server, "slow", 2)
        client.unload_model("slow")  # the server answers both before the unload completes
        for future in accepted:  # (the clients may still be reading their answers: wait for them)
            np.testing.assert_array_equal(future.result(), x)
    with pytest.raises(InferenceServerException) as raised:
        call()
    assert raised.value.status() == "503" and "unloaded" in raised.value.message()


def test_control_is_refused_outside_explicit_mode(clients: Clients, server: ServerProcess) -> None:
    client = clients.http(server.http_url)
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("mlp")
    assert raised.value.status() == "400"
    assert "explicit model load / unload is not allowed" in raised.value.message()
    served = [(e["name"], e.get("version"), e.get("state")) for e in client.get_model_repository_index()]
    assert ("mlp", "3", "READY") in served and ("mlp", "1", None) not in served


# -- hot swap under load --------------------------------------------------------------------------


def test_hot_swap_under_load_fails_no_request(clients: Clients, tmp_path: Path) -> None:
    import threading

    root = tmp_path / "repository"
    mlp_model(root / "mlp" / "1" / "model.onnx", seed=1)
    write_config(root / "mlp", MLP_CONFIG)
    answers: dict[str, list[str]] = {"http": [], "grpc": []}
    stop = threading.Event()

    with run_server(root, tmp_path / "server.log", "--model-control-mode", "explicit", "--load-model", "*") as server:

        def http_loop() -> None:
            with httpclient.InferenceServerClient(server.http_url) as client:
                for _ in range(20_000):  # bounded; the swaps below take a few seconds
                    if stop.is_set():
                        return
                    try:
                        answers["http"].append(str(mlp_output(client).tolist()))
                    except InferenceServerException as exc:
                        answers["http"].append(f"failed: {exc}")

        def grpc_loop() -> None:
            x = np.arange(16, dtype=np.float32).reshape(1, 16)
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                for _ in range(20_000):
                    if stop.is_set():
                        return
                    tensor = grpcclient.InferInput("x", [1, 16], "FP32")
                    tensor.set_data_from_numpy(x)
                    try:
                        answers["grpc"].append(str(client.infer("mlp", [tensor]).as_numpy("y").tolist()))
                    except InferenceServerException as exc:
                        answers["grpc"].append(f"failed: {exc}")

        loops = [threading.Thread(target=http_loop), threading.Thread(target=grpc_loop)]
        for loop in loops:
            loop.start()
        try:
            control = clients.http(server.http_url)
            wait_for(lambda: len(answers["http"]) > 20 and len(answers["grpc"]) > 20)
            # A new version (the policy serves the latest), then a changed config, then a new file
            # under the same version: each loaded beside the one serving, then swapped in.
            mlp_model(root / "mlp" / "2" / "model.onnx", seed=2)
            control.load_model("mlp")
            counts = (len(answers["http"]), len(answers["grpc"]))
            wait_for(lambda: len(answers["http"]) > counts[0] + 20 and len(answers["grpc"]) > counts[1] + 20)
            write_config(root / "mlp", MLP_CONFIG + "\ninstance_group [ { count: 2 kind: KIND_CPU } ]")
            control.load_model("mlp")
            mlp_model(root / "mlp" / "2" / "model.onnx", seed=3)
            control.load_model("mlp")
            counts = (len(answers["http"]), len(answers["grpc"]))
            wait_for(lambda: len(answers["http"]) > counts[0] + 20 and len(answers["grpc"]) > counts[1] + 20)
        finally:
            stop.set()
            for loop in loops:
                loop.join(timeout=60)
    seen = {str(expected_mlp(seed).tolist()): seed for seed in (1, 2, 3)}
    for transport, results in answers.items():
        failures = [a for a in results if a.startswith("failed")]
        assert not failures, f"{transport}: {len(failures)} of {len(results)} failed, first: {failures[0]}"
        seeds = [seen.get(a) for a in results]
        assert None not in seeds, f"{transport}: an answer from no known model"
        # Every answer came from the version serving at the time: 1, then 2, then the replaced 2.
        assert seeds == sorted(seeds) and seeds[0] == 1 and seeds[-1] == 3, transport


# -- poll mode ------------------------------------------------------------------------------------


def test_poll_mode_follows_the_repository(clients: Clients, tmp_path: Path) -> None:
    root = tmp_path / "repository"
    mlp_model(root / "mlp" / "1" / "model.onnx", seed=1)
    write_config(root / "mlp", MLP_CONFIG)
    flags = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with run_server(root, tmp_path / "server.log", *flags) as server:
        client = clients.http(server.http_url)
        np.testing.assert_allclose(mlp_output(client), expected_mlp(1), rtol=1e-6)
        # An added model.
        mlp_model(root / "other" / "1" / "model.onnx", seed=5)
        wait_for(lambda: client.is_model_ready("other"))
        np.testing.assert_allclose(mlp_output(client, "other"), expected_mlp(5), rtol=1e-6)
        # A new version: served once ready, the old one retired by the version policy.
        mlp_model(root / "mlp" / "2" / "model.onnx", seed=2)
        wait_for(lambda: [e.get("version") for e in index(client)["mlp"]] == ["2"])
        np.testing.assert_allclose(mlp_output(client), expected_mlp(2), rtol=1e-6)
        # A broken new version: the one serving stays, and the index says why.
        (root / "mlp" / "3").mkdir()
        (root / "mlp" / "3" / "model.onnx").write_bytes(b"broken")
        wait_for(lambda: any(e.get("version") == "3" for e in index(client)["mlp"]))
        entries = {e["version"]: e for e in index(client)["mlp"]}
        assert entries["3"]["state"] == "UNAVAILABLE" and "onnxruntime cannot load" in entries["3"]["reason"]
        np.testing.assert_allclose(mlp_output(client), expected_mlp(2), rtol=1e-6)
        # A removed model.
        shutil.rmtree(root / "other")
        wait_for(lambda: "other" not in index(client))
        with pytest.raises(InferenceServerException) as raised:
            mlp_output(client, "other")
        assert raised.value.status() == "404"


def test_loads_unloads_and_inference_racing_leave_a_consistent_state(clients: Clients, tmp_path: Path) -> None:
    import threading

    root = tmp_path / "repository"
    for name in ("a", "b"):
        mlp_model(root / name / "1" / "model.onnx", seed=1)
        write_config(root / name, MLP_CONFIG)
    statuses: list[str] = []
    with run_server(root, tmp_path / "server.log", "--model-control-mode", "explicit") as server:

        def control(worker: int) -> None:
            with httpclient.InferenceServerClient(server.http_url) as client:
                for step in range(30):  # bounded
                    name = "ab"[(worker + step) % 2]
                    try:
                        if (worker + step) % 3:
                            client.load_model(name)
                        else:
                            client.unload_model(name)
                        statuses.append("200")
                    except InferenceServerException as exc:
                        statuses.append(str(exc.status()))

        def infer(worker: int) -> None:
            with httpclient.InferenceServerClient(server.http_url) as client:
                for step in range(150):
                    try:
                        mlp_output(client, "ab"[step % 2])
                        statuses.append("200")
                    except InferenceServerException as exc:
                        statuses.append(f"{exc.status()} {exc.message()}")

        threads = [threading.Thread(target=control, args=(i,)) for i in range(4)]
        threads += [threading.Thread(target=infer, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        # Every answer was a success or a clear "not loaded" (503 naming the state, or 404 before
        # the model's first load), never anything else; and the server ends in a state it can
        # report and act on.
        clear = ("503", "not ready"), ("404", "not loaded")
        odd = [s for s in statuses if s != "200" and not any(s.startswith(c) and m in s for c, m in clear)]
        assert not odd, odd[:5]
        client = clients.http(server.http_url)
        for name in ("a", "b"):
            state = index(client)[name][0].get("state")
            assert state in ("READY", "UNAVAILABLE"), state
            client.load_model(name)
            np.testing.assert_allclose(mlp_output(client, name), expected_mlp(1), rtol=1e-6)

"""Scale to zero on one server, with no memory budget: a model idle for its idle_unload_seconds is
unloaded (the index and the metrics say so), its next requests share one cold start, requests past
max_held are refused 503 with Retry-After, and a model still in use stays loaded. (Memory given
back: test_memory_return.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest

from inferd.testing.models import misbehaving_model, mlp_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import Clients, HttpReply, http_request
from tests.e2e.test_batching import wait_until_in_flight
from tests.e2e.test_observability import sample, scrape
from tests.e2e.test_repository import expected_mlp, mlp_output

pytestmark = pytest.mark.e2e

# Generous bounds for what the server does by itself (a sweep a quarter of the limit apart).
WAIT_S = 60.0


def idle(seconds: float) -> str:
    return f'parameters {{ key: "idle_unload_seconds" value {{ string_value: "{seconds}" }} }}'


@pytest.fixture(scope="module")
def holds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("holds")


@pytest.fixture(scope="module")
def scaling(tmp_path_factory: pytest.TempPathFactory, holds: Path) -> Iterator[ServerProcess]:
    """No budget flags, no server default: each model asks for its own idle time."""
    root = tmp_path_factory.mktemp("scale_to_zero")
    mlp_model(root / "tiny" / "1" / "model.onnx", seed=1)
    write_config(root / "tiny", idle(2))  # 100 concurrent requests arrive well within it: one load
    # Its load waits while the test's hold file exists: a cold start as long as the test needs.
    misbehaving_model(root / "starting", load_hold_file=holds / "load", max_held=10, idle_unload_seconds=1)
    # Its executions wait while the test's hold file exists: a request as long as the test needs.
    misbehaving_model(root / "busy", hold_file=holds / "busy", idle_unload_seconds=1)
    mlp_model(root / "kept" / "1" / "model.onnx", seed=2)  # no idle time: never unloaded
    with run_server(root, root / "server.log", "--log-format", "text") as server:
        yield server


def reason(server: ServerProcess, model: str) -> str:
    reply = http_request(server, "POST", "/v2/repository/index")
    entries = {entry["name"]: entry for entry in orjson.loads(reply.body)}
    return str(entries[model].get("reason", "")) if entries[model].get("state") != "READY" else "READY"


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.05)


def wait_scaled_to_zero(server: ServerProcess, model: str) -> None:
    wait_for(lambda: reason(server, model) == "scaled to zero", f"{model} scaled to zero")


def infer(server: ServerProcess, model: str, data: list[float], width: int) -> HttpReply:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, width], "data": data}]})
    return http_request(server, "POST", f"/v2/models/{model}/infer", body)


def output(reply: HttpReply) -> list[float]:
    assert reply.status == 200, reply.body
    return list(orjson.loads(reply.body)["outputs"][0]["data"])


def test_an_idle_model_is_scaled_to_zero_and_its_next_requests_share_one_cold_start(scaling: ServerProcess) -> None:
    wait_scaled_to_zero(scaling, "tiny")
    before = scrape(scaling)
    assert sample(before, "inferd_model_at_zero", model="tiny") == 1
    assert sample(before, "inferd_model_scaled_to_zero_total") >= 1
    assert reason(scaling, "kept") == "READY"  # no idle time: it stays

    x = [float(i) for i in range(16)]  # expected_mlp's input
    with ThreadPoolExecutor(100) as pool:
        replies = list(pool.map(lambda _: infer(scaling, "tiny", x, 16), range(100)))
    expected = expected_mlp(1)
    for reply in replies:
        assert output(reply) == pytest.approx(expected.reshape(-1).tolist(), rel=1e-5)
    after = scrape(scaling)
    loads = "inferd_model_loads_total"
    assert sample(after, loads, outcome="success") - sample(before, loads, outcome="success") == 1
    cold = "inferd_model_load_duration_seconds_count"
    assert (
        sample(after, cold, cause="cold_start", phase="session")
        - sample(before, cold, cause="cold_start", phase="session")
        == 1
    )
    assert sample(after, "inferd_model_at_zero", missing=0.0, model="tiny") == 0
    assert "model tiny: cold start in" in scaling.log()
    wait_scaled_to_zero(scaling, "tiny")  # and idle again, it goes back to zero


def test_requests_past_max_held_get_503_with_retry_after_while_the_model_starts(
    scaling: ServerProcess, holds: Path
) -> None:
    wait_scaled_to_zero(scaling, "starting")
    hold = holds / "load"
    hold.touch()
    try:
        with ThreadPoolExecutor(30) as pool:
            futures = [pool.submit(infer, scaling, "starting", [1, 2, 3, 4], 4) for _ in range(30)]
            # The load waits for the hold file: 10 requests wait for it, and every other is refused.
            wait_for(lambda: sum(f.done() for f in futures) >= 20, "20 requests refused")
            hold.unlink()
    finally:
        hold.unlink(missing_ok=True)
    replies = [f.result() for f in futures]
    refused = [r for r in replies if r.status != 200]
    assert len(refused) == 20, [r.body for r in refused]
    for reply in refused:
        assert reply.status == 503
        assert int(reply.headers["retry-after"]) >= 1
        assert b"is starting" in reply.body and b"max_held 10" in reply.body
    answered = [r for r in replies if r.status == 200]
    assert len(answered) == 10
    for reply in answered:
        assert output(reply) == [1, 2, 3, 4]


def test_a_model_busy_with_a_long_request_is_not_scaled_to_zero(scaling: ServerProcess, holds: Path) -> None:
    hold = holds / "busy"
    assert output(infer(scaling, "busy", [1, 2, 3, 4], 4)) == [1, 2, 3, 4]  # loaded (a cold start if at zero)
    hold.touch()
    replies: list[HttpReply] = []
    request = threading.Thread(target=lambda: replies.append(infer(scaling, "busy", [4, 3, 2, 1], 4)))
    try:
        request.start()
        wait_until_in_flight(scaling, "busy")
        before = sample(scrape(scaling), "inferd_model_scaled_to_zero_total")
        # Three idle limits, with the request still in: the model stays loaded.
        time.sleep(3)
        assert reason(scaling, "busy") == "READY"
    finally:
        hold.unlink(missing_ok=True)
        request.join(30)
    assert output(replies[0]) == [4, 3, 2, 1]
    wait_scaled_to_zero(scaling, "busy")  # once the request is done, its idle time counts
    assert sample(scrape(scaling), "inferd_model_scaled_to_zero_total") > before


def test_a_malformed_idle_time_fails_the_model_s_load_and_says_why(tmp_path: Path) -> None:
    mlp_model(tmp_path / "bad" / "1" / "model.onnx")
    write_config(tmp_path / "bad", 'parameters { key: "idle_unload_seconds" value { string_value: "soon" } }')
    mlp_model(tmp_path / "good" / "1" / "model.onnx")
    with run_server(tmp_path, tmp_path / "server.log") as server:
        text = reason(server, "bad")
        assert "idle_unload_seconds must be a number of seconds" in text and "'soon'" in text
        assert reason(server, "good") == "READY"


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Explicit mode with the server's default idle time; `pinned` says 0 (never)."""
    root = tmp_path_factory.mktemp("explicit")
    mlp_model(root / "pinned" / "1" / "model.onnx", seed=3)
    write_config(root / "pinned", idle(0))
    flags = ("--model-control-mode", "explicit", "--load-model", "pinned", "--idle-unload-seconds", "1",
             "--allow-model-upload")  # fmt: skip
    with run_server(root, root / "server.log", *flags) as server:
        yield server


def test_a_model_sent_with_its_load_comes_back_from_zero_with_its_files_and_config(
    clients: Clients, explicit: ServerProcess, tmp_path: Path
) -> None:
    """The server's --idle-unload-seconds applies to a model loaded over the API with files and a
    config override: at zero, its files are kept, and its cold start loads them with that config."""
    mlp_model(tmp_path / "model.onnx", seed=7)
    client = clients.http(explicit.http_url)
    config = orjson.dumps({"max_batch_size": 8}).decode()
    client.load_model("sent", config=config, files={"file:1/model.onnx": (tmp_path / "model.onnx").read_bytes()})
    nine = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 16], "data": [0.0] * 144}]})
    for _ in range(2):  # loaded, then a cold start (each request loads it again if it went to zero meanwhile)
        np.testing.assert_allclose(mlp_output(client, "sent"), expected_mlp(7), rtol=1e-6)
        refused = http_request(explicit, "POST", "/v2/models/sent/infer", nine)  # the override's max_batch_size
        assert refused.status == 400 and b"batch" in refused.body, refused.body
        wait_scaled_to_zero(explicit, "sent")
    assert reason(explicit, "pinned") == "READY"  # its idle_unload_seconds of 0 keeps it
    client.unload_model("sent")
    assert reason(explicit, "sent") == "unloaded"


def test_async_jobs_waiting_for_a_model_keep_it_loaded(tmp_path: Path) -> None:
    """One async job at a time: `held`'s job runs (held by its file) while `waiting`'s queues
    behind it. `waiting` has nothing in flight for many idle limits, but a job in the backlog: it
    stays loaded, answers the job, and then scales to zero."""
    from tests.e2e.test_async_inference import body, submit, wait

    hold = tmp_path / "hold"
    misbehaving_model(tmp_path / "repository" / "held", hold_file=hold)
    misbehaving_model(tmp_path / "repository" / "waiting", offset=1, idle_unload_seconds=1)
    arguments = ("--state-dir", str(tmp_path / "state"), "--async-concurrency", "1")
    with run_server(tmp_path / "repository", tmp_path / "server.log", *arguments) as server:
        hold.touch()  # once loaded (its warm-up would wait too)
        try:
            running = submit(server, "held", body([1.0] * 4))
            queued = submit(server, "waiting", body([2.0] * 4))
            wait_for(lambda: 'inferd_async_backlog{model="waiting"} 1.0' in scrape(server), "waiting's job counted")
            # Loaded now (a cold start if it was already at zero), with its job still queued.
            assert output(infer(server, "waiting", [0, 0, 0, 0], 4)) == [1, 1, 1, 1]
            before = sample(scrape(server), "inferd_model_scaled_to_zero_total")
            time.sleep(3)  # three of its idle limits, its job still queued
            assert reason(server, "waiting") == "READY"
            assert sample(scrape(server), "inferd_model_scaled_to_zero_total") == before
        finally:
            hold.unlink(missing_ok=True)
        assert wait(server, running["inference_id"])["state"] == "succeeded"
        assert wait(server, queued["inference_id"])["state"] == "succeeded"
        wait_scaled_to_zero(server, "waiting")


def test_a_starting_server_is_not_ready_until_its_models_serve(tmp_path: Path) -> None:
    """What a pod's readiness probe reads (`inferd deploy k8s --scale-to-zero`): live at once,
    ready only once its models serve, so Knative routes nothing to it before."""
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from inferd.tools.ports import free_ports

    hold = tmp_path / "load"
    hold.touch()
    misbehaving_model(tmp_path / "repository" / "slow", load_hold_file=hold)
    http, grpc, metrics = free_ports(3)
    command = [sys.executable, "-m", "inferd", "serve", "--model-repository", str(tmp_path / "repository"),
               "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc),
               "--metrics-port", str(metrics)]  # fmt: skip

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0  # not listening yet

    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: status("/v2/health/live") == 200, "live")
        for _ in range(5):  # its model's load is held: never ready meanwhile
            assert status("/v2/health/ready") == 503
            time.sleep(0.1)
        hold.unlink()
        wait_for(lambda: status("/v2/health/ready") == 200, "ready once its model serves")
        assert status("/v2/models/slow/ready") == 200
    finally:
        hold.unlink(missing_ok=True)
        server.terminate()
        server.wait(30)


def weights_mapped(server: ServerProcess, weights: Path) -> bool:
    """Whether the server's process maps `weights` (a session made from the cached model does)."""
    with open(f"/proc/{server.process.pid}/maps", encoding="utf-8") as maps:
        return any(line.rstrip().endswith(str(weights)) for line in maps)


def test_a_cold_start_loads_the_optimized_model_the_first_load_cached(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    mlp_model(root / "large" / "1" / "model.onnx", (16, 512, 512, 4), seed=3)  # 1.1 MB: worth an entry
    write_config(root / "large", idle(1))
    cache = tmp_path / "cache"
    x = [float(i) for i in range(16)]
    args = ("--onnx-cache-dir", str(cache), "--log-format", "text")
    with run_server(root, tmp_path / "server.log", *args) as server:
        (entry,) = (p for p in cache.iterdir() if p.is_dir() and p.name != "digests")
        weights = entry / "weights.bin"
        assert weights.stat().st_size > 1 << 20
        assert "model large: optimized model cached in" in server.log()
        assert not weights_mapped(server, weights)  # the first session read the model's own file
        expected = output(infer(server, "large", x, 16))
        wait_scaled_to_zero(server, "large")
        assert output(infer(server, "large", x, 16)) == expected
        assert weights_mapped(server, weights)
    with run_server(root, tmp_path / "again.log", *args) as server:  # a restart reads it too
        assert weights_mapped(server, weights)
        assert output(infer(server, "large", x, 16)) == expected
    assert [p for p in cache.iterdir() if p.is_dir() and p.name != "digests"] == [entry]

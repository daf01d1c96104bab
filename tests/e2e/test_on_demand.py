"""Many models under a budget (the multi-model pattern): loaded on their first request, one load
for concurrent first requests, the least recently used idle model evicted, pinned ones kept, and a
model that cannot fit refused at once."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.runtimes.onnx import estimate_memory_bytes
from inferd.runtimes.python import estimate_memory_bytes as python_memory_bytes
from inferd.testing.models import mlp_model, sleepy_model
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import Clients
from tests.e2e.test_batching import wait_until_in_flight
from tests.e2e.test_observability import sample, scrape
from tests.e2e.test_repository import expected_mlp, index, mlp_output, slow_output

pytestmark = pytest.mark.e2e

MODELS = [f"m{i}" for i in range(6)]


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("many")
    for seed, name in enumerate(MODELS):
        mlp_model(root / name / "1" / "model.onnx", seed=seed)
    flags = ("--max-loaded-models", "3", "--load-model", "m0")
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log", *flags) as server:
        yield server


def loaded(client: httpclient.InferenceServerClient) -> set[str]:
    return {name for name, entries in index(client).items() if entries[0].get("state") == "READY"}


def test_a_model_loads_on_its_first_request(clients: Clients, many: ServerProcess) -> None:
    client = clients.http(many.http_url)
    assert loaded(client) == {"m0"}  # the rest wait for their first request
    before = scrape(many)
    np.testing.assert_allclose(mlp_output(client, "m1"), expected_mlp(1), rtol=1e-6)
    after = scrape(many)
    assert "m1" in loaded(client)
    miss = "inferd_model_on_demand_requests_total"
    assert sample(after, miss, result="miss") - sample(before, miss, missing=0.0, result="miss") == 1
    assert sample(after, "inferd_model_memory_bytes", model="m1") > 0


def test_concurrent_first_requests_share_one_load(many: ServerProcess) -> None:
    before = scrape(many)

    def call(_: int) -> np.ndarray:
        # Each thread closes its own client: tritonclient's cannot be collected from another thread.
        with httpclient.InferenceServerClient(many.http_url) as client:
            return mlp_output(client, "m2")

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(16)))
    for result in results:
        np.testing.assert_allclose(result, expected_mlp(2), rtol=1e-6)
    after = scrape(many)
    loads = "inferd_model_loads_total"
    assert sample(after, loads, outcome="success") - sample(before, loads, outcome="success") == 1


def test_least_recently_used_is_evicted_and_pinned_is_kept(clients: Clients, many: ServerProcess) -> None:
    client = clients.http(many.http_url)
    for name in ("m1", "m2"):
        mlp_output(client, name)
    assert loaded(client) == {"m0", "m1", "m2"}  # the maximum of 3
    mlp_output(client, "m1")  # m2 is now the least recently used
    np.testing.assert_allclose(mlp_output(client, "m3"), expected_mlp(3), rtol=1e-6)
    assert loaded(client) == {"m0", "m1", "m3"}
    assert index(client)["m2"][0]["reason"] == "evicted to make room"
    for name in ("m4", "m5", "m2"):  # m0, pinned by --load-model, stays through every eviction
        mlp_output(client, name)
        assert "m0" in loaded(client) and len(loaded(client)) == 3
    assert sample(scrape(many), "inferd_model_evictions_total") >= 4


def test_what_cannot_fit_is_refused_and_busy_models_are_not_evicted(clients: Clients, tmp_path: Path) -> None:
    root = tmp_path / "repository"
    mlp_model(root / "small" / "1" / "model.onnx", seed=1)
    mlp_model(root / "large" / "1" / "model.onnx", sizes=(16, 16384, 4), seed=2)
    sleepy_model(root / "slow", 1500, 0)  # busy for 1.5 s on any machine
    slow_bytes = python_memory_bytes((root / "slow" / "1" / "model.py").stat().st_size)
    large_bytes = estimate_memory_bytes((root / "large" / "1" / "model.onnx").stat().st_size)
    budget = max(slow_bytes, estimate_memory_bytes((root / "small" / "1" / "model.onnx").stat().st_size)) + 1024
    assert large_bytes > budget
    with run_server(root, tmp_path / "server.log", "--model-memory-budget", str(budget)) as server:
        client = clients.http(server.http_url)
        with pytest.raises(InferenceServerException) as raised:
            mlp_output(client, "large")
        assert raised.value.status() == "507"
        assert "model memory budget" in raised.value.message() and "MiB" in raised.value.message()
        # A model serving a request is never evicted: the next model is refused until it is idle.
        x = np.zeros((4, 4), dtype=np.float32)

        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(slow_output, server.http_url, x)
            wait_until_in_flight(server, "slow")
            with pytest.raises(InferenceServerException) as raised:
                mlp_output(client, "small")
            assert raised.value.status() == "507" and "serving requests now" in raised.value.message()
            np.testing.assert_array_equal(busy.result(timeout=60), x)
        np.testing.assert_allclose(mlp_output(client, "small"), expected_mlp(1), rtol=1e-6)
        assert loaded(client) == {"small"}


def test_other_doors_load_on_demand_too(clients: Clients, many: ServerProcess) -> None:
    """Doors that read a body by the model's signature (TF Serving, TorchServe) load the model first."""
    import orjson

    from tests.e2e.conftest import http_request

    client = clients.http(many.http_url)
    rows = np.ones((1, 16), dtype=np.float32).tolist()
    for door, model in (("/v1/models/{}:predict", "m4"), ("/predictions/{}", "m5")):
        assert model not in loaded(client)
        body = orjson.dumps({"instances": rows} if door.startswith("/v1") else rows)
        reply = http_request(many, "POST", door.format(model), body, {"Content-Type": "application/json"})
        assert reply.status == 200, reply.body
        assert model in loaded(client)

"""`inferd fleet` through its CLI: a plan of 3 bins holding 30 models (each on two bins) runs as local
inferd processes behind a real nginx; tritonclient reaches every model through nginx, and keeps
getting answers while a bin restarts; `down` stops exactly what `up` started."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.testing.models import mlp_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import free_port
from inferd.tools import profiles

pytestmark = pytest.mark.e2e
MODELS = [f"model-{i:02d}" for i in range(30)]


def inferd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferd", *args], capture_output=True, text=True, timeout=300)


def ask(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    x = httpclient.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.full((1, 16), 0.5, dtype=np.float32))
    answer = client.infer(model, [x]).as_numpy("y")
    assert answer is not None
    return answer


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, dict[str, object]]]:
    folder = tmp_path_factory.mktemp("fleet")
    repository = folder / "models"
    for seed, name in enumerate(MODELS):
        mlp_model(repository / name / "1" / "model.onnx", seed=seed)
        write_model_config(repository / name, "max_batch_size: 8")
    # 320 MB a model: 20 replicas fill an m6i.large, so 30 models twice over make 3 bins.
    best = profiles.Operating(500.0, 2.0, 5.0, 4, cpu_cores=0.5)
    model = profiles.ModelProfile(320.0, 0.5, best, best)
    profile = profiles.Profile(profiles.Machine("cpu A", 2, 24.0), dict.fromkeys(MODELS, model), server_memory_mb=250)
    profiles.write(profile, folder / "profile.json")
    planned = inferd("plan", str(folder / "profile.json"), "-o", str(folder / "plan"), "--zipf-total", "30",
                     "--replicas", "2", "--instance-types", "m6i.large", "--time-limit", "10")  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    plan = json.loads((folder / "plan" / "plan.json").read_text())
    assert len(plan["instances"]) == 3
    # An endpoint over two models the plan put on the same bins: those bins serve it.
    by_bins: dict[tuple[str, ...], list[str]] = {}
    for name, planned in sorted(plan["models"].items()):
        by_bins.setdefault(tuple(sorted(planned["instances"])), []).append(name)
    blue, green = next(models for models in by_bins.values() if len(models) >= 2)[:2]
    (folder / "endpoints.yaml").write_text(
        f"endpoints:\n  shop:\n    variants:\n      - {{name: blue, model: {blue}, weight: 100}}\n"
        f"      - {{name: green, model: {green}, weight: 0}}\n"
    )
    state, port = folder / "state", free_port()
    result = inferd("fleet", "up", str(folder / "plan" / "plan.json"), "--model-repository", str(repository),
                    "--port", str(port), "--state", str(state),
                    "--endpoints", str(folder / "endpoints.yaml"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    try:
        yield state, port, plan
    finally:
        inferd("fleet", "down", "--state", str(state))


@pytest.mark.timeout(300)
def test_every_model_answers_through_nginx(fleet: tuple[Path, int, dict[str, object]]) -> None:
    state, port, _ = fleet
    status = inferd("fleet", "status", "--state", str(state))
    assert status.returncode == 0 and status.stdout.count("ready") == 3, status.stdout + status.stderr
    with httpclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        assert client.is_server_ready()
        for model in MODELS:
            assert client.is_model_ready(model), model
            assert ask(client, model).shape == (1, 4)
        with pytest.raises(InferenceServerException, match="Request for unknown model: not-planned"):
            ask(client, "not-planned")


@pytest.mark.timeout(300)
def test_models_keep_answering_while_a_bin_restarts(fleet: tuple[Path, int, dict[str, object]]) -> None:
    state, port, _ = fleet
    outcomes: Counter[str] = Counter()
    stop = threading.Event()

    def load() -> None:  # bounded: at most 20,000 requests and 120 s
        deadline = time.monotonic() + 120
        with httpclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            for i in range(20_000):
                if stop.is_set() or time.monotonic() > deadline:
                    break
                try:
                    ask(client, MODELS[i % len(MODELS)])
                    outcomes["ok"] += 1
                except InferenceServerException as exc:
                    outcomes[f"error: {exc}"[:200]] += 1

    before = json.loads((state / "fleet.json").read_text())["bins"][0]["process"]["pid"]
    worker = threading.Thread(target=load)
    worker.start()
    try:
        time.sleep(0.5)
        restarted = inferd("fleet", "restart", "bin-00", "--state", str(state))
        time.sleep(0.5)
    finally:
        stop.set()
        worker.join(timeout=150)
    assert restarted.returncode == 0, restarted.stderr
    assert outcomes["ok"] > 0 and set(outcomes) == {"ok"}, outcomes
    assert json.loads((state / "fleet.json").read_text())["bins"][0]["process"]["pid"] != before  # a new process


@pytest.mark.timeout(300)
def test_an_endpoint_is_served_through_nginx_and_rolled_out_across_its_bins(
    fleet: tuple[Path, int, dict[str, object]],
) -> None:
    """The bins holding both variants' models serve the endpoint behind nginx; `inferd fleet
    rollout` judges on all their traffic, writes the file they follow, and `fleet status` shows
    its decision."""
    state, port, _ = fleet
    endpoints = Path(json.loads((state / "fleet.json").read_text())["endpoints"])
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]})
    answers: Counter[tuple[int, str]] = Counter()
    stop = threading.Event()

    def traffic() -> None:  # bounded: at most 20,000 requests and 120 s
        deadline = time.monotonic() + 120
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for _ in range(20_000):
                if stop.is_set() or time.monotonic() > deadline:
                    break
                connection.request("POST", "/v2/models/shop/infer", body)
                response = connection.getresponse()
                response.read()
                answers[(response.status, response.getheader("inferd-variant") or "")] += 1
                time.sleep(0.004)
        finally:
            connection.close()

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        rolled = inferd("fleet", "rollout", "shop", "--to", "green", "--strategy", "linear:2", "--bake", "2s",
                        "--min-requests", "20", "--state", str(state))  # fmt: skip
    finally:
        stop.set()
        worker.join(timeout=150)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "promoted: 'green' takes all the traffic" in rolled.stdout, rolled.stdout
    assert set(answers) <= {(200, "blue"), (200, "green")} and answers[(200, "green")] > 0, answers
    assert "weight: 100" in endpoints.read_text()
    status = inferd("fleet", "status", "--state", str(state))
    assert "shop: promoted" in status.stdout and "promoted: 'green' takes all the traffic" in status.stdout, (
        status.stdout
    )


def test_down_stops_exactly_what_up_started(tmp_path: Path) -> None:
    result = inferd("fleet", "down", "--state", str(tmp_path / "none"))
    assert result.returncode == 0 and "nothing running" in result.stdout
    result = inferd("fleet", "status", "--state", str(tmp_path / "none"))
    assert result.returncode == 1 and "no fleet in" in result.stderr


@pytest.mark.timeout(300)
def test_fleet_down_leaves_no_process(fleet: tuple[Path, int, dict[str, object]]) -> None:
    state, _, _ = fleet
    record = json.loads((state / "fleet.json").read_text())
    pids = [b["process"]["pid"] for b in record["bins"]] + [record["nginx"]["pid"]]
    result = inferd("fleet", "down", "--state", str(state))
    assert result.returncode == 0 and "nginx" in result.stdout and "bin-02" in result.stdout
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)

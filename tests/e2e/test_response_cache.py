"""The response cache through a real server (`--cache-config`, `response_cache { enable: true }`):
1,000 identical concurrent requests run the model once; a hot swap never lets an answer of the old
version through; the byte budget and TTL hold; the client's bypass; what a client and Prometheus
see (Inferd-Cache, the inferd-cache trailer, Triton's statistics, /metrics)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferd.testing.models import misbehaving_model, python_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

CACHE = "response_cache { enable: true }\n"
WIDE = 256  # floats a row of `wide`'s answer: 1 KiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("cache")
    misbehaving_model(root / "cached", offset=1, sleep_ms=300)  # slow by construction: identical requests overlap
    with open(root / "cached" / "config.pbtxt", "a") as config:
        config.write(CACHE)
    misbehaving_model(root / "uncached", offset=1)
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log", "--cache-config", "local,size=16MiB") as s:
        yield s


def infer_json(server: ServerProcess, model: str, x: list[float], headers: dict[str, str] | None = None) -> tuple:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, len(x)], "data": x}]}).encode()
    reply = http_request(server, "POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"}
                         | (headers or {}))  # fmt: skip
    assert reply.status == 200, reply.body
    return json.loads(reply.body)["outputs"][0]["data"], reply.headers.get("inferd-cache")


def statistics(server: ServerProcess, model: str) -> dict:
    reply = http_request(server, "GET", f"/v2/models/{model}/stats")
    return json.loads(reply.body)["model_stats"][0]


def metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as response:
        return response.read().decode()


def sample(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert found, f"{name}{labels} not in /metrics"
    return float(found.group(1))


@pytest.mark.timeout(300)
def test_a_thousand_identical_concurrent_requests_run_the_model_once(server: ServerProcess) -> None:
    x = np.array([[0.5, 1.5, -2.0, 8.0]], np.float32)

    async def send_all() -> list[np.ndarray]:
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:

            async def one() -> np.ndarray:
                tensor = grpcaio.InferInput("x", [1, 4], "FP32")
                tensor.set_data_from_numpy(x)
                return (await client.infer("cached", [tensor], client_timeout=120)).as_numpy("y")

            return await asyncio.gather(*(one() for _ in range(1000)))

    answers = asyncio.run(send_all())
    assert all(np.array_equal(answer, x + 1) for answer in answers)
    stats = statistics(server, "cached")
    assert stats["execution_count"] == 1  # the model ran once: the cache gave every other answer
    assert stats["inference_stats"]["cache_miss"]["count"] == 1
    assert stats["inference_stats"]["cache_hit"]["count"] == 999
    assert stats["inference_stats"]["success"]["count"] == 1000
    assert sample(metrics(server), "inferd_cache_hits_total", '{model="cached"}') >= 999


def test_answers_say_hit_or_miss_and_a_client_may_ask_for_a_fresh_one(server: ServerProcess) -> None:
    before = statistics(server, "cached")["execution_count"]
    x = [3.0, 1.0, 4.0, 1.0]
    assert infer_json(server, "cached", x) == ([4.0, 2.0, 5.0, 2.0], "miss")
    assert infer_json(server, "cached", x) == ([4.0, 2.0, 5.0, 2.0], "hit")
    assert infer_json(server, "cached", x, {"Cache-Control": "no-cache"}) == ([4.0, 2.0, 5.0, 2.0], "miss")
    assert statistics(server, "cached")["execution_count"] == before + 2
    # A model whose config does not enable the cache never uses it, and its answers say nothing.
    assert infer_json(server, "uncached", x) == ([4.0, 2.0, 5.0, 2.0], None)
    assert infer_json(server, "uncached", x)[1] is None
    assert statistics(server, "uncached")["execution_count"] == 2
    # gRPC: the inferd-cache trailer; `cache-control: no-cache` metadata, or the request parameter.
    request = service_pb2.ModelInferRequest(model_name="cached")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend(x)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response, call = stub.ModelInfer.with_call(request, timeout=30)
        assert dict(call.trailing_metadata())["inferd-cache"] == "hit"
        assert list(response.outputs[0].shape) == [1, 4]
        _, call = stub.ModelInfer.with_call(request, timeout=30, metadata=(("cache-control", "no-cache"),))
        assert dict(call.trailing_metadata())["inferd-cache"] == "miss"
        request.parameters["cache_control"].string_param = "no-cache"
        _, call = stub.ModelInfer.with_call(request, timeout=30)
        assert dict(call.trailing_metadata())["inferd-cache"] == "miss"
    assert statistics(server, "cached")["execution_count"] == before + 4


@pytest.mark.timeout(300)
def test_no_answer_of_the_old_version_after_a_hot_swap(tmp_path: Path) -> None:
    """A tight loop of one request around a swap of the model's config (offset 1 → 100) and back:
    every answer is one version's, and none sent after a swap returned is the old one's."""
    misbehaving_model(tmp_path / "repository" / "swap", offset=1)
    config = tmp_path / "repository" / "swap" / "config.pbtxt"
    config.write_text(config.read_text() + CACHE)
    x = [1.0, 2.0, 3.0, 4.0]
    with run_server(tmp_path / "repository", tmp_path / "server.log", "--model-control-mode", "explicit",
                    "--load-model", "swap", "--cache-config", "local,size=1MiB") as server:  # fmt: skip
        answers: list[tuple[float, float]] = []  # (when the request was sent, its answer's first value)
        stop = threading.Event()

        def loop() -> None:
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline and len(answers) < 20_000:
                sent = time.monotonic()
                answers.append((sent, infer_json(server, "swap", x)[0][0]))

        def wait_for(count: int) -> None:
            deadline = time.monotonic() + 60
            while len(answers) < count and time.monotonic() < deadline:
                time.sleep(0.01)

        looping = threading.Thread(target=loop)
        looping.start()
        try:
            swaps = []  # (when the swap began, when its load returned, the new version's answer)
            for offset in (100, 1, 100):
                wait_for(len(answers) + 20)
                began = time.monotonic()
                config.write_text(config.read_text().replace(f'"{101 - offset}"', f'"{offset}"'))
                reply = http_request(server, "POST", "/v2/repository/models/swap/load")
                assert reply.status == 200, reply.body
                swaps.append((began, time.monotonic(), x[0] + offset))
            wait_for(len(answers) + 20)
        finally:
            stop.set()
            looping.join()
        stats = statistics(server, "swap")["inference_stats"]
    assert {value for _, value in answers} <= {2.0, 101.0}
    for index, (_, loaded, value) in enumerate(swaps):
        until = swaps[index + 1][0] if index + 1 < len(swaps) else float("inf")  # the next swap's start
        after = [answer for sent, answer in answers if loaded < sent < until]
        assert after and set(after) == {value}, (index, set(after))
    # The loop's requests were answered by the cache (each version's first one ran the model; the
    # second 100 found its own entry of the first, the right answer for those files).
    assert stats["cache_hit"]["count"] >= len(answers) - 10


def test_the_byte_budget_holds_entries_expire_and_evictions_are_counted(tmp_path: Path) -> None:
    python_model(tmp_path / "repository" / "wide" / "1", WIDE_MODEL)
    write_config(
        tmp_path / "repository" / "wide",
        f"""
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {WIDE} ] }} ]
        {CACHE}
        """,
    )
    budget = 8 * 1024
    with run_server(tmp_path / "repository", tmp_path / "server.log",
                    "--cache-config", f"local,size={budget},ttl_s=2") as server:  # fmt: skip
        sent_at = {}
        for value in range(12):  # 12 answers of 1 KiB and more in 8 KiB: the oldest leave
            sent_at[value] = time.monotonic()
            assert infer_json(server, "wide", [float(value)])[1] == "miss"
            assert sample(metrics(server), "inferd_cache_bytes") <= budget
        exposition = metrics(server)
        assert sample(exposition, "inferd_cache_evictions_total", '{model="wide"}') >= 4
        assert sample(exposition, "inferd_cache_bytes") > budget / 2
        assert infer_json(server, "wide", [0.0])[1] == "miss"  # evicted long ago
        _, said = infer_json(server, "wide", [11.0])
        if time.monotonic() - sent_at[11] < 2:  # within its TTL (this machine answered in time)
            assert said == "hit"
        time.sleep(2.2)  # past every entry's TTL, on any machine
        assert infer_json(server, "wide", [11.0])[1] == "miss"
        assert statistics(server, "wide")["execution_count"] >= 14


WIDE_MODEL = f"""
import numpy as np


class Model:
    def execute(self, inputs):
        return {{"y": np.repeat(inputs["x"], {WIDE}, axis=1)}}
"""


@pytest.mark.timeout(300)
def test_two_servers_sharing_redis_answer_each_other_s_misses_and_lose_only_hits_when_it_goes(tmp_path: Path) -> None:
    import contextlib

    import redis

    from inferd.testing.redis_server import run_redis

    misbehaving_model(tmp_path / "repository" / "cached", offset=1)
    with open(tmp_path / "repository" / "cached" / "config.pbtxt", "a") as config:
        config.write(CACHE)
    stack = contextlib.ExitStack()
    url = stack.enter_context(run_redis(tmp_path / "redis"))
    try:
        shared = ("--cache-config", f"redis,url={url}")
        with (
            run_server(tmp_path / "repository", tmp_path / "a.log", *shared) as a,
            run_server(tmp_path / "repository", tmp_path / "b.log", *shared, "--cache-config", "local,size=1MiB") as b,
        ):
            x = [1.0, 2.0, 3.0, 4.0]
            assert infer_json(a, "cached", x) == ([2.0, 3.0, 4.0, 5.0], "miss")
            client = redis.Redis.from_url(url)
            deadline = time.monotonic() + 30  # A writes its answer after giving it
            while not client.keys("inferd:cache:*") and time.monotonic() < deadline:
                time.sleep(0.01)
            client.close()
            # B never ran the model: A's answer, from Redis (the same files make the same key there).
            assert infer_json(b, "cached", x) == ([2.0, 3.0, 4.0, 5.0], "hit")
            assert statistics(b, "cached")["execution_count"] == 0
            assert infer_json(b, "cached", x)[1] == "hit"  # now from B's own local tier

            stack.close()  # Redis goes away: misses, never errors
            assert infer_json(a, "cached", [9.0, 9.0, 9.0, 9.0]) == ([10.0] * 4, "miss")
            assert infer_json(a, "cached", x) == ([2.0, 3.0, 4.0, 5.0], "miss")  # A has no local tier
            assert infer_json(b, "cached", x) == ([2.0, 3.0, 4.0, 5.0], "hit")  # B's local tier still answers
            assert sample(metrics(a), "inferd_cache_redis_errors_total") >= 1
    finally:
        stack.close()


CHAIN = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "first" input_map { key: "x" value: "x" } output_map { key: "y" value: "middle" } },
    { model_name: "second" input_map { key: "x" value: "middle" } output_map { key: "y" value: "y" } }
  ]
}
response_cache { enable: true }
"""


def test_an_ensemble_caches_as_a_whole_and_a_step_s_hot_swap_makes_its_answers_new(tmp_path: Path) -> None:
    """x → first (+1) → second (+10) → y: its steps do not cache, the ensemble does; a swap of its
    second step (+10 → +20) is a new key for the ensemble, so its next answer is the new one."""
    misbehaving_model(tmp_path / "repository" / "first", offset=1)
    misbehaving_model(tmp_path / "repository" / "second", offset=10)
    (tmp_path / "repository" / "chain" / "1").mkdir(parents=True)
    write_config(tmp_path / "repository" / "chain", CHAIN)
    x = [1.0, 2.0, 3.0, 4.0]
    with run_server(tmp_path / "repository", tmp_path / "server.log", "--model-control-mode", "explicit",
                    "--load-model", "chain", "--cache-config", "local,size=1MiB") as server:  # fmt: skip
        assert infer_json(server, "chain", x) == ([12.0, 13.0, 14.0, 15.0], "miss")
        assert infer_json(server, "chain", x) == ([12.0, 13.0, 14.0, 15.0], "hit")
        assert statistics(server, "second")["execution_count"] == 1  # the hit ran no step
        assert infer_json(server, "second", x)[1] is None  # a step that does not cache answers as ever
        config = tmp_path / "repository" / "second" / "config.pbtxt"
        config.write_text(config.read_text().replace('"10"', '"20"'))
        reply = http_request(server, "POST", "/v2/repository/models/second/load")
        assert reply.status == 200, reply.body
        assert infer_json(server, "chain", x) == ([22.0, 23.0, 24.0, 25.0], "miss")
        assert infer_json(server, "chain", x) == ([22.0, 23.0, 24.0, 25.0], "hit")
        assert infer_json(server, "chain", x, {"Cache-Control": "no-cache"}) == ([22.0, 23.0, 24.0, 25.0], "miss")

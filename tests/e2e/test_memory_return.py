"""Memory goes back to the system: unloading MiniLM, or swapping its version for another, leaves the
server as large as it was. glibc keeps the pages of freed allocations unless trimmed: without that,
an unload left 60-90 MiB of MiniLM's ~140 resident."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import psutil
import pytest

from inferd.testing.models import add_sub_model
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

MIB = 2**20
# What a load/unload cycle may leave behind: far below the 60-90 MiB an untrimmed unload kept.
LEFT_BEHIND_MIB = 25
# What a loaded MiniLM holds at least: about 110 MiB made from its own file, about 55 from the
# optimized-model cache (its weights mapped from the cached file; runtimes.onnx_cache).
LOADED_MIB = 40


@pytest.fixture(scope="module")
def minilm_server(pipeline_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """MiniLM not loaded; add_sub loaded and served once, so that ONNX Runtime's one-time memory
    (its library, environment and thread pool) is in every measure's baseline."""
    root = tmp_path_factory.mktemp("memory")
    shutil.copytree(pipeline_repository / "minilm", root / "minilm")
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    arguments = ("--model-control-mode", "explicit", "--load-model", "add_sub")
    with run_server(root, root.parent / "server.log", *arguments) as server:
        body = orjson.dumps({"inputs": [{"name": f"INPUT{i}", "datatype": "FP32", "shape": [1, 16], "data": [1] * 16}
                                        for i in (0, 1)]})  # fmt: skip
        assert http_request(server, "POST", "/v2/models/add_sub/infer", body).status == 200
        yield server


def rss_mib(server: ServerProcess) -> float:
    return float(psutil.Process(server.process.pid).memory_info().rss / MIB)


def settles_below(server: ServerProcess, limit_mib: float) -> bool:
    """Whether the server's RSS falls below `limit_mib` within 15 s: an unloaded or replaced
    version is closed after the API call answers, once its last request is done."""
    deadline = time.monotonic() + 15
    while rss_mib(server) >= limit_mib:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def infer(server: ServerProcess, rows: int) -> None:
    tokens = np.zeros((rows, 128), dtype=np.int64)
    tokens[:, :2] = [101, 102]
    arrays = {"input_ids": tokens, "attention_mask": np.ones_like(tokens), "token_type_ids": np.zeros_like(tokens)}
    inputs = [
        {"name": name, "datatype": "INT64", "shape": [rows, 128], "data": array.reshape(-1).tolist()}
        for name, array in arrays.items()
    ]
    reply = http_request(server, "POST", "/v2/models/minilm/infer", orjson.dumps({"inputs": inputs}))
    assert reply.status == 200, reply.body


def manage(server: ServerProcess, action: str, config: str | None = None) -> None:
    body = orjson.dumps({"parameters": {"config": config}}) if config is not None else b""
    reply = http_request(server, "POST", f"/v2/repository/models/minilm/{action}", body)
    assert reply.status == 200, reply.body


def test_unloading_gives_the_model_s_memory_back(minilm_server: ServerProcess) -> None:
    empty = rss_mib(minilm_server)
    for _ in range(2):
        manage(minilm_server, "load")
        infer(minilm_server, 1)
        loaded = rss_mib(minilm_server)
        assert loaded > empty + LOADED_MIB, "MiniLM's session should hold its weights"
        manage(minilm_server, "unload")
        assert settles_below(minilm_server, empty + LEFT_BEHIND_MIB), (
            f"empty {empty:.0f} MiB, loaded {loaded:.0f}, unloaded {rss_mib(minilm_server):.0f}"
        )


def test_a_hot_swap_leaves_the_server_as_large_as_before(minilm_server: ServerProcess) -> None:
    """Each load with another config replaces the serving session with a new one."""
    manage(minilm_server, "load", '{"max_batch_size": 8}')
    infer(minilm_server, 1)
    before = rss_mib(minilm_server)
    for size in (4, 8, 4):
        manage(minilm_server, "load", f'{{"max_batch_size": {size}}}')
        infer(minilm_server, 1)
        assert settles_below(minilm_server, before + LEFT_BEHIND_MIB), (
            f"{before:.0f} MiB before, {rss_mib(minilm_server):.0f} after"
        )
    manage(minilm_server, "unload")


def test_a_model_scaled_to_zero_gives_its_memory_back_and_comes_back_on_its_next_request(
    minilm_server: ServerProcess,
) -> None:
    """Loaded with an idle time of 2 s (no budget): after it, the server is within 10% of its size
    before the load; its next request loads it again (a cold start), and idle, it goes back."""
    empty = rss_mib(minilm_server)
    manage(minilm_server, "load", '{"max_batch_size": 8, "parameters": {"idle_unload_seconds": {"string_value": "2"}}}')
    for _ in range(2):  # the load above, then a cold start
        infer(minilm_server, 1)
        loaded = rss_mib(minilm_server)
        assert loaded > empty + LOADED_MIB, "MiniLM's session should hold its weights"
        deadline = time.monotonic() + 60
        while b"scaled to zero" not in http_request(minilm_server, "POST", "/v2/repository/index").body:
            assert time.monotonic() < deadline, "MiniLM was never scaled to zero"
            time.sleep(0.1)
        assert settles_below(minilm_server, empty * 1.10), (
            f"empty {empty:.0f} MiB, loaded {loaded:.0f}, scaled to zero {rss_mib(minilm_server):.0f}"
        )

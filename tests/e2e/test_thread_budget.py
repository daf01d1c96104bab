"""Threads are a server-wide budget: loading more models does not add threads (one set of worker
threads and one intra-op pool for every model), unless `--intra-op-pools per-instance` asks for a
pool per session."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from inferd.runtimes.base import cores_available
from inferd.testing.models import slow_model
from inferd.testing.server import ServerProcess, run_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)"),
]

MANY = 40
SIZE = 128


def repository(root: Path, count: int) -> Path:
    # Matrix products of 128 x 128: long enough to run on worker threads, not only on the loop.
    for index in range(count):
        slow_model(root / f"m{index}" / "1" / "model.onnx", size=SIZE, repeats=4)
    return root


def threads_after_serving_each(server: ServerProcess, count: int) -> int:
    """The server's threads once every model answered a request (threads start when needed)."""
    x = np.eye(SIZE, dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_url) as client:
        for index in range(count):
            tensor = httpclient.InferInput("x", [SIZE, SIZE], "FP32")
            tensor.set_data_from_numpy(x)
            np.testing.assert_allclose(client.infer(f"m{index}", [tensor]).as_numpy("y"), x)
    return len(os.listdir(f"/proc/{server.process.pid}/task"))


# Worker threads start as executions need them, up to this many, whichever models they run.
EXECUTION_THREADS = 2
# Blocking housekeeping (reading configs, listing, loading) runs on asyncio's default executor,
# which also starts threads as needed, up to this many.
HOUSEKEEPING_THREADS = min(32, cores_available() + 4)


def serve_and_count(tmp_path: Path, count: int, *flags: str) -> int:
    root = repository(tmp_path / f"repo-{count}-{len(flags)}", count)
    flags = ("--execution-threads", str(EXECUTION_THREADS), *flags)
    with run_server(root, tmp_path / f"server-{count}-{len(flags)}.log", *flags) as server:
        return threads_after_serving_each(server, count)


def test_threads_do_not_grow_with_the_number_of_models(tmp_path: Path) -> None:
    few = serve_and_count(tmp_path, 2)
    many = serve_and_count(tmp_path, MANY)
    assert many - few <= EXECUTION_THREADS + HOUSEKEEPING_THREADS, f"{MANY} models: {many} threads; 2: {few}"


@pytest.mark.skipif(cores_available() < 2, reason="with one core a session's own pool has no threads")
def test_a_pool_per_instance_adds_threads_with_every_model(tmp_path: Path) -> None:
    # The contrast that shows what the shared pool saves (and that the count above can fail).
    shared = serve_and_count(tmp_path, MANY)
    per_instance = serve_and_count(tmp_path, MANY, "--intra-op-pools", "per-instance")
    assert per_instance - shared >= MANY * (cores_available() - 1) - 2

"""inferd.client (`Client`, `AsyncClient`) against a real `inferd serve`: every call of the KServe
v2 API over HTTP (binary and JSON tensors) and gRPC, the server's errors as typed exceptions,
retries of 503s after the server's Retry-After, deadlines, and an HTTP-only client without grpc."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from inferd.client import NO_RETRIES, AsyncClient, Client, RetryPolicy
from inferd.errors import (
    ErrorCode,
    ModelNotFoundError,
    OverloadedError,
    ShapeMismatchError,
    UnavailableError,
    UnknownTensorError,
)
from inferd.testing.models import add_sub_model, identity_model, mlp_model, sleepy_model, write_config
from inferd.testing.server import ServerProcess, free_port, run_server
from inferd.types import DataType, InferResponse
from tests.e2e.test_observability import sample, scrape

pytestmark = pytest.mark.e2e

FAST_RETRIES = RetryPolicy(max_retries=200, backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture(scope="module")
def hold_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def client_server(tmp_path_factory: pytest.TempPathFactory, hold_file: Path) -> Iterator[ServerProcess]:
    """Explicit model control: add_sub, identity_bytes and `held` loaded at start, `spare` not."""
    root = tmp_path_factory.mktemp("repository")
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    write_config(root / "add_sub", "max_batch_size: 8")
    identity_model(root / "identity_bytes" / "1" / "model.onnx", DataType.BYTES, ["batch", -1])
    mlp_model(root / "spare" / "1" / "model.onnx")
    # One request at a time, executing or queued (the queue bound counts both): a second is refused
    # with a 503 while held.
    sleepy_model(
        root / "held",
        sleep_ms=1,
        max_batch_size=1,
        hold_file=hold_file,
        config="dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    )
    log = tmp_path_factory.mktemp("logs") / "server.log"
    models = ("add_sub", "identity_bytes", "held")
    args = ["--model-control-mode", "explicit", *(a for m in models for a in ("--load-model", m))]
    with run_server(root, log, *args) as server:
        yield server


def urls(server: ServerProcess) -> dict[str, tuple[str, bool]]:
    return {
        "http-binary": (f"http://{server.http_url}", True),
        "http-json": (f"http://{server.http_url}", False),
        "grpc": (f"grpc://{server.grpc_url}", True),
    }


@pytest.mark.parametrize("kind", ["http-binary", "http-json", "grpc"])
def test_every_call_of_the_api(client_server: ServerProcess, kind: str) -> None:
    url, binary = urls(client_server)[kind]
    with Client(url, binary=binary, timeout_s=30) as client:
        assert client.server_live() and client.server_ready()
        metadata = client.server_metadata()
        assert metadata.name == "inferd" and "statistics" in metadata.extensions
        assert client.model_ready("add_sub") and not client.model_ready("spare")
        described = client.model_metadata("add_sub")
        assert [t.name for t in described.inputs] == ["INPUT0", "INPUT1"] and described.versions == ("1",)
        assert client.model_config("add_sub")["max_batch_size"] == 8

        before = {s.name: s.inference_count for s in client.statistics()}
        a = np.arange(32, dtype=np.float32).reshape(2, 16)
        response = client.infer("add_sub", {"INPUT0": a, "INPUT1": np.ones_like(a)}, request_id=f"id-{kind}")
        assert response.request_id == f"id-{kind}" and response.model_name == "add_sub"
        np.testing.assert_array_equal(response.as_numpy("OUTPUT0"), a + 1)
        np.testing.assert_array_equal(response.as_numpy("OUTPUT1"), a - 1)
        only = client.infer("add_sub", {"INPUT0": a, "INPUT1": a}, outputs=["OUTPUT1"])
        assert [t.name for t in only.outputs] == ["OUTPUT1"]
        # BYTES: str and bytes in, bytes out, non-UTF-8 bytes too (sent binary even in JSON mode).
        texts = np.array([["héllo", "b"], ["c", "d"]])
        assert client.infer("identity_bytes", {"INPUT0": texts}).as_numpy("OUTPUT0").tolist() == [
            [b"h\xc3\xa9llo", b"b"],
            [b"c", b"d"],
        ]
        raw = np.array([[b"\xff\xfe", b""]], dtype=object)
        assert client.infer("identity_bytes", {"INPUT0": raw}).as_numpy("OUTPUT0").tolist() == [[b"\xff\xfe", b""]]
        after = client.statistics("add_sub")
        assert after[0].inference_count - before["add_sub"] == 4  # rows: 2 + 2

        states = {e.name: e.state for e in client.repository_index()}
        assert states["add_sub"] == "READY" and states["spare"] != "READY"
        assert "spare" not in {e.name for e in client.repository_index(ready=True)}
        client.load_model("spare", config={"max_batch_size": 4})
        assert client.model_ready("spare") and client.model_config("spare")["max_batch_size"] == 4
        client.unload_model("spare")
        assert not client.model_ready("spare")


@pytest.mark.parametrize("kind", ["http-binary", "grpc"])
def test_server_errors_are_typed_exceptions(client_server: ServerProcess, kind: str) -> None:
    url, _ = urls(client_server)[kind]
    ones = np.ones((1, 16), np.float32)
    with Client(url, retry=NO_RETRIES) as client:
        with pytest.raises(UnknownTensorError) as unknown:
            client.infer("add_sub", {"INPUT0": ones, "nope": ones}, request_id="bad-1")
        assert unknown.value.code is ErrorCode.UNKNOWN_TENSOR and unknown.value.tensor == "nope"
        assert unknown.value.request_id == "bad-1" and "has no input 'nope'" in unknown.value.message
        with pytest.raises(ShapeMismatchError) as shape:
            client.infer("add_sub", {"INPUT0": np.ones((1, 15), np.float32), "INPUT1": ones})
        assert shape.value.tensor == "INPUT0"
        with pytest.raises(ModelNotFoundError, match="unknown_model"):
            client.infer("unknown_model", {"INPUT0": ones})
        with pytest.raises(ModelNotFoundError):
            client.model_metadata("unknown_model")


def test_a_server_that_is_not_there(client_server: ServerProcess) -> None:
    port = free_port()
    started = time.monotonic()
    unavailable = rf"server 127\.0\.0\.1:{port} is unavailable"
    retries = RetryPolicy(max_retries=2, backoff_s=0.01)
    nobody = f"127.0.0.1:{port}"
    with Client(f"http://{nobody}", retry=retries) as client, pytest.raises(UnavailableError, match=unavailable):
        client.server_live()
    with Client(f"grpc://{nobody}", timeout_s=5) as client, pytest.raises(UnavailableError, match=unavailable):
        client.server_ready()
    assert time.monotonic() - started < 30
    with pytest.raises(ValueError, match="must name a host and a port"):
        Client("http://localhost")
    with pytest.raises(ValueError, match="scheme must be http://, https://, grpc:// or grpcs://"):
        Client("ftp://localhost:21")


def in_flight(server: ServerProcess, model: str) -> float:
    return sample(scrape(server), "inferd_requests_in_flight", missing=0.0, model=model)


async def fill(server: ServerProcess, client: AsyncClient) -> tuple[list[asyncio.Task[InferResponse]], OverloadedError]:
    """Send requests to `held` one at a time, each once the one before is in the server (a
    condition, bounded, not a duration), until one is refused: the requests it holds, and the refusal."""
    accepted: list[asyncio.Task[InferResponse]] = []
    for _ in range(5):
        task = asyncio.create_task(client.infer("held", {"x": np.ones((1, 2), np.float32)}, timeout_s=60))
        for _ in range(1000):
            if task.done() or in_flight(server, "held") > len(accepted):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        if task.done() and isinstance(task.exception(), OverloadedError):
            return accepted, cast(OverloadedError, task.exception())
        accepted.append(task)
    raise AssertionError("the held model never refused a request")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_503s_are_retried_after_the_servers_retry_after(
    client_server: ServerProcess, hold_file: Path, protocol: str
) -> None:
    url = f"http://{client_server.http_url}" if protocol == "http" else f"grpc://{client_server.grpc_url}"
    x = np.ones((1, 2), np.float32)
    hold_file.touch()
    async with AsyncClient(url, retry=NO_RETRIES) as plain, AsyncClient(url, retry=FAST_RETRIES) as retrying:
        try:
            accepted, refused = await fill(client_server, plain)
            assert refused.retry_after_s is not None and refused.retry_after_s > 0
            before = scrape(client_server)
            retried = asyncio.create_task(retrying.infer("held", {"x": x}, timeout_s=60))
            for _ in range(500):  # let the retrying client be refused at least once more
                refusals = sample(scrape(client_server), "inferd_requests_total", model="held", outcome="OVERLOADED")
                if refusals > sample(before, "inferd_requests_total", model="held", outcome="OVERLOADED"):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the retrying client was never refused")
        finally:
            hold_file.unlink()
        np.testing.assert_array_equal((await retried).as_numpy("y"), x)
        outcomes = await asyncio.gather(*accepted, return_exceptions=True)
        assert all(isinstance(o, InferResponse | OverloadedError) for o in outcomes), outcomes


async def test_a_call_keeps_its_deadline(client_server: ServerProcess, hold_file: Path) -> None:
    hold_file.touch()
    try:
        async with AsyncClient(f"http://{client_server.http_url}", retry=FAST_RETRIES) as client:
            started = time.monotonic()
            with pytest.raises(UnavailableError):
                await client.infer("held", {"x": np.ones((1, 2), np.float32)}, timeout_s=0.5)
            assert time.monotonic() - started < 10
    finally:
        hold_file.unlink()


async def test_many_calls_share_the_async_clients_connections(client_server: ServerProcess) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    for url in (f"http://{client_server.http_url}", f"grpc://{client_server.grpc_url}"):
        async with AsyncClient(url, max_in_flight=8) as client:
            responses = await asyncio.gather(
                *(client.infer("add_sub", {"INPUT0": a + i, "INPUT1": a}) for i in range(40))
            )
        for i, response in enumerate(responses):
            np.testing.assert_array_equal(response.as_numpy("OUTPUT0"), a + i + a)


def test_an_http_only_client_imports_no_grpc(client_server: ServerProcess) -> None:
    program = f"""
import sys
import numpy as np
from inferd.client import Client
with Client("http://{client_server.http_url}") as client:
    a = np.ones((1, 16), np.float32)
    assert client.infer("add_sub", {{"INPUT0": a, "INPUT1": a}}).as_numpy("OUTPUT0").sum() == 32
assert not [m for m in sys.modules if m == "grpc" or m.startswith("grpc.")], "grpc was imported"
"""
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)

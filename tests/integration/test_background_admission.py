"""The background admission class on a real (Python, sleepy by construction) model, through the
registry's dispatcher: background work never makes a real-time request wait beyond the batch it joins
(at most the execution already running when it came), and it completes once the model is idle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from inferd.core.handle import Handle, ModelHandle
from inferd.core.registry import ModelRegistry
from inferd.core.repository import LocalRepository
from inferd.core.scheduler import Admission
from inferd.core.service import InferenceService
from inferd.core.statistics import ServingStatistics
from inferd.testing.models import sleepy_model
from inferd.types import DataType, InferRequest, InferResponse, RequestContext, Tensor

MODELS = {
    # a dynamic batcher (batches of up to 4 rows)
    "batched": (4, "dynamic_batching { }"),
    # the direct scheduler (each request alone)
    "unbatched": (0, ""),
}


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[ModelRegistry]:
    hold = tmp_path / "hold"
    for name, (rows, config) in MODELS.items():
        sleepy_model(tmp_path / "models" / name, sleep_ms=20, max_batch_size=rows, config=config, hold_file=hold)
    registry = ModelRegistry(LocalRepository(tmp_path / "models"), ServingStatistics())
    await registry.load_all()
    yield registry
    hold.unlink(missing_ok=True)
    await registry.close()


@pytest.fixture
def service(registry: ModelRegistry) -> InferenceService:
    return InferenceService(registry)


def request(model: str, value: float) -> InferRequest:
    x = np.full((1, 2), value, dtype=np.float32)
    return InferRequest(model, "", (Tensor("x", DataType.FP32, x.shape, x),), context=RequestContext(f"r{value}"))


def handle_of(registry: ModelRegistry, model: str) -> ModelHandle:
    handle: Handle = registry.dispatcher.ready_handle(model, "")
    assert isinstance(handle, ModelHandle)
    return handle


def background_infer(registry: ModelRegistry, request: InferRequest) -> Awaitable[InferResponse]:
    return registry.dispatcher.infer(request, admission=Admission.BACKGROUND)


async def until(predicate: Callable[[], bool]) -> None:
    for _ in range(5000):
        if predicate():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("condition never held")


def value(response: InferResponse) -> float:
    return float(response.outputs[0].data.flat[0])


@pytest.mark.parametrize("model", list(MODELS))
async def test_real_time_requests_wait_for_no_queued_background_work(
    registry: ModelRegistry, service: InferenceService, model: str, tmp_path: Path
) -> None:
    handle = handle_of(registry, model)
    (tmp_path / "hold").touch()  # executions wait while it exists
    background = [asyncio.ensure_future(background_infer(registry, request(model, 100.0)))]
    await until(lambda: handle.pool.busy)  # the first background request executes (held)
    background += [asyncio.ensure_future(background_infer(registry, request(model, 101.0 + i))) for i in range(8)]
    await until(lambda: handle.queued == 8)
    real_time = [asyncio.ensure_future(service.infer(request(model, float(i)))) for i in range(3)]
    # queued in the batcher, or (the direct scheduler) waiting for the instance
    await until(lambda: handle.queued + handle.pool.waiting == 11)
    (tmp_path / "hold").unlink()
    answers = await asyncio.wait_for(asyncio.gather(*real_time), timeout=60)
    # Only the background execution that was running when they came finished before them.
    assert sum(future.done() for future in background) == 1
    assert [value(a) for a in answers] == [0.0, 1.0, 2.0]
    finished = await asyncio.wait_for(asyncio.gather(*background), timeout=60)
    assert [value(a) for a in finished] == [100.0 + i for i in range(9)]  # all done once the model was idle


@pytest.mark.parametrize("model", list(MODELS))
async def test_background_work_on_an_idle_model_runs_at_once(registry: ModelRegistry, model: str) -> None:
    handle = handle_of(registry, model)
    answer = await asyncio.wait_for(background_infer(registry, request(model, 7.0)), timeout=60)
    assert value(answer) == 7.0
    assert handle.queued == 0

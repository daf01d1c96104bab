"""InferenceService on a real (tiny) ONNX model: concurrent requests are batched, each answered
with its own rows; without a batcher, a model that runs inline answers without yielding to the loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from inferd.core.registry import ModelRegistry
from inferd.core.repository import LocalRepository
from inferd.core.service import InferenceService
from inferd.core.statistics import ServingStatistics
from inferd.testing.models import mlp_model, write_config
from inferd.types import DataType, InferRequest, RequestContext, Tensor


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[InferenceService]:
    mlp_model(tmp_path / "mlp" / "1" / "model.onnx")
    write_config(tmp_path / "mlp", "max_batch_size: 32\ndynamic_batching { max_queue_delay_microseconds: 100000 }")
    mlp_model(tmp_path / "unbatched" / "1" / "model.onnx")
    write_config(tmp_path / "unbatched", "max_batch_size: 32")
    statistics = ServingStatistics()
    registry = ModelRegistry(LocalRepository(tmp_path), statistics)
    await registry.load_all()
    yield InferenceService(registry, statistics=statistics)
    await registry.close()


def request(value: float, model: str = "mlp") -> InferRequest:
    data = np.full((1, 16), value, dtype=np.float32)
    return InferRequest(
        model_name=model,
        model_version="",
        inputs=(Tensor("x", DataType.FP32, (1, 16), data),),
        context=RequestContext(f"r{value}"),
    )


async def test_an_unbatched_model_that_runs_inline_answers_without_yielding(service: InferenceService) -> None:
    reference = (await service.infer(request(1.0, "unbatched"))).outputs[0].data
    call = service.infer(request(1.0, "unbatched"))
    # The tiny model runs inline and an instance is free: the answer comes in a single step.
    with pytest.raises(StopIteration) as finished:
        call.send(None)
    response = finished.value.value
    assert np.array_equal(response.outputs[0].data, reference)
    assert response.request_id == "r1.0"


async def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(service: InferenceService) -> None:
    alone = {v: (await service.infer(request(v))).outputs[0].data for v in (1.0, 2.0, 3.0)}
    responses = await asyncio.gather(*(service.infer(request(v)) for v in (1.0, 2.0, 3.0)))
    for value, response in zip((1.0, 2.0, 3.0), responses, strict=True):
        assert np.allclose(response.outputs[0].data, alone[value], atol=1e-6)
    [statistics] = service.model_statistics("mlp")
    # Three lone executions, then one batch of three.
    assert {b.batch_size: b.compute_infer.count for b in statistics.batches} == {1: 3, 3: 1}

"""InferenceService on a real (tiny) ONNX model with dynamic batching: a request alone in the
server is answered without waiting a loop turn for company; concurrent ones are batched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from inferd.core.registry import ModelRegistry
from inferd.core.repository import LocalRepository
from inferd.core.service import InferenceService
from inferd.core.statistics import ServingStatistics
from inferd.testing.models import mlp_model, write_config
from inferd.types import DataType, InferRequest, Tensor


@pytest.fixture
async def service(tmp_path: Path) -> InferenceService:
    mlp_model(tmp_path / "mlp" / "1" / "model.onnx")
    write_config(tmp_path / "mlp", "max_batch_size: 32\ndynamic_batching { max_queue_delay_microseconds: 100000 }")
    statistics = ServingStatistics()
    registry = ModelRegistry(LocalRepository(tmp_path), statistics)
    await registry.load_all(["mlp"])
    return InferenceService(registry, statistics=statistics)


def request(value: float) -> InferRequest:
    data = np.full((1, 16), value, dtype=np.float32)
    return InferRequest(
        model_name="mlp",
        model_version="",
        request_id=f"r{value}",
        inputs=(Tensor("x", DataType.FP32, (1, 16), data),),
    )


async def test_a_request_alone_in_the_server_never_yields_to_the_loop(service: InferenceService) -> None:
    reference = (await service.infer(request(1.0))).outputs[0].data
    call = service.infer(request(1.0), alone=True)
    # The tiny model runs inline and nothing is queued: the answer comes in a single step.
    with pytest.raises(StopIteration) as finished:
        call.send(None)
    response = finished.value.value
    assert np.array_equal(response.outputs[0].data, reference)
    assert response.request_id == "r1.0"


async def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(service: InferenceService) -> None:
    alone = {v: (await service.infer(request(v), alone=True)).outputs[0].data for v in (1.0, 2.0, 3.0)}
    responses = await asyncio.gather(*(service.infer(request(v)) for v in (1.0, 2.0, 3.0)))
    for value, response in zip((1.0, 2.0, 3.0), responses, strict=True):
        assert np.allclose(response.outputs[0].data, alone[value], atol=1e-6)
    [statistics] = service.model_statistics("mlp")
    # Three lone executions, then one batch of three.
    assert {b.batch_size: b.compute_infer.count for b in statistics.batches} == {1: 3, 3: 1}

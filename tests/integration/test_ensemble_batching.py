"""Requests that reach an ensemble in the same loop turn run through its steps as one batch: each
gets its own rows, a request that breaks a step fails alone, and every error names its own request.
Steps of one request that call the same model and are ready together go to it as one request."""

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
from inferd.errors import InferdError, ModelOutputError, ModelRaisedError
from inferd.testing.models import python_model, write_config
from inferd.types import DataType, InferRequest, RequestContext, Tensor

# y = 2x over [batch, n]; a negative x is refused (the request's fault), 999 breaks the declared dtype.
DOUBLE = """
import numpy as np


class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, -1]}]

    def execute(self, inputs):
        x = inputs["x"]
        if (x < 0).any():
            raise ValueError("negative input")
        if (x == 999).any():
            return {"y": x.astype(np.float64)}
        return {"y": 2 * x}
"""
PIPE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ {
  model_name: "double" input_map { key: "x" value: "X" } output_map { key: "y" value: "Y" } } ] }
"""

# Two branches through the same model: X and Z are doubled side by side.
TWIN = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "X2" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "Z2" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "double" input_map { key: "x" value: "X" } output_map { key: "y" value: "X2" } },
  { model_name: "double" input_map { key: "x" value: "Z" } output_map { key: "y" value: "Z2" } } ] }
"""


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[InferenceService]:
    python_model(tmp_path / "double" / "1", DOUBLE)
    write_config(tmp_path / "double", 'backend: "python"\nmax_batch_size: 12')  # no batcher: one execution per request
    write_config(tmp_path / "pipe", PIPE)
    write_config(tmp_path / "twin", TWIN)
    statistics = ServingStatistics()
    registry = ModelRegistry(LocalRepository(tmp_path), statistics)
    await registry.load_all()
    yield InferenceService(registry, statistics=statistics)
    await registry.close()


def request(*rows: list[float], index: int = 0) -> InferRequest:
    data = np.array(rows, dtype=np.float32)
    return InferRequest(
        "pipe", "", (Tensor("X", DataType.FP32, data.shape, data),), context=RequestContext(f"r{index}")
    )


def step_counts(service: InferenceService) -> tuple[int, int]:
    """(requests, executions) the step model has seen."""
    [stats] = service.model_statistics("double")
    return stats.success.count, stats.execution_count


async def test_requests_arriving_together_run_as_one_batch_each_answered_with_its_own_rows(
    service: InferenceService,
) -> None:
    requests = [request([i, i + 0.5], index=i) for i in range(5)] + [request([7, 8], [9, 10], index=5)]
    responses = await asyncio.gather(*(service.infer(r) for r in requests))
    for sent, response in zip(requests, responses, strict=True):
        assert response.request_id == sent.context.request_id
        [y] = response.outputs
        assert y.shape == sent.inputs[0].shape
        assert np.array_equal(y.data, 2 * sent.inputs[0].data)
    assert step_counts(service) == (1, 1)  # 6 ensemble requests, 7 rows: one step request
    [ensemble] = service.model_statistics("pipe")
    assert ensemble.success.count == 6  # each still counts as the client sent it


async def test_batches_hold_at_most_max_batch_size_rows_and_only_matching_shapes(service: InferenceService) -> None:
    await asyncio.gather(*(service.infer(request([i, i], index=i)) for i in range(11)))
    assert step_counts(service) == (2, 2)  # 8 rows, then 3
    await asyncio.gather(service.infer(request([1, 2])), service.infer(request([1, 2, 3])))
    assert step_counts(service) == (4, 4)  # 2 and 3 values per row: they cannot share a tensor


async def test_a_request_that_breaks_a_step_fails_alone(service: InferenceService) -> None:
    requests = [request([1, 2], index=0), request([-1, 2], index=1), request([3, 4], index=2)]
    outcomes = await asyncio.gather(*(service.infer(r) for r in requests), return_exceptions=True)
    assert np.array_equal(outcomes[0].outputs[0].data, [[2, 4]])  # type: ignore[union-attr]
    assert np.array_equal(outcomes[2].outputs[0].data, [[6, 8]])  # type: ignore[union-attr]
    error = outcomes[1]
    assert isinstance(error, ModelRaisedError)
    assert "ensemble 'pipe' step 0 (model 'double')" in error.message and "negative input" in error.message
    assert error.request_id == "r1"


async def test_a_failure_of_the_whole_batch_reaches_each_request_under_its_own_id(service: InferenceService) -> None:
    requests = [request([999, 1], index=i) for i in range(3)]
    outcomes = await asyncio.gather(*(service.infer(r) for r in requests), return_exceptions=True)
    assert all(isinstance(o, ModelOutputError) for o in outcomes)
    assert [o.request_id for o in outcomes if isinstance(o, InferdError)] == ["r0", "r1", "r2"]
    [step] = service.model_statistics("double")
    assert step.fail.count == 1  # not a request's fault: not run again one by one


def twin_request(x: list[list[float]], z: list[list[float]]) -> InferRequest:
    xs, zs = np.array(x, dtype=np.float32), np.array(z, dtype=np.float32)
    return InferRequest(
        "twin", "", (Tensor("X", DataType.FP32, xs.shape, xs), Tensor("Z", DataType.FP32, zs.shape, zs))
    )


async def test_steps_of_one_model_ready_together_go_as_one_request(service: InferenceService) -> None:
    response = await service.infer(twin_request([[1, 2], [3, 4]], [[5, 6], [7, 8]]))
    got = {t.name: t.data.tolist() for t in response.outputs}
    assert got == {"X2": [[2, 4], [6, 8]], "Z2": [[10, 12], [14, 16]]}
    assert step_counts(service) == (1, 1)
    # Together they would pass the model's max_batch_size (12): two requests.
    await service.infer(twin_request([[1, 1]] * 8, [[2, 2]] * 8))
    assert step_counts(service) == (3, 3)


async def test_a_branch_that_breaks_the_shared_request_is_named_alone(service: InferenceService) -> None:
    with pytest.raises(ModelRaisedError) as raised:
        await service.infer(twin_request([[1, 2]], [[-3, 4]]))
    assert "ensemble 'twin' step 1 (model 'double')" in raised.value.message

"""The dispatcher below the service: a client's request is counted once under its model, an
ensemble's request once under the ensemble and each of its steps once under the step's model (by
the door "ensemble"), without passing through the service again; requests that find no model
share one bounded series whatever names they make up; the tracer hears of each request; a unary
call to a decoupled model is refused and counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from inferd.core.registry import ModelRegistry
from inferd.core.repository import LocalRepository
from inferd.core.service import InferenceService
from inferd.core.statistics import ServingStatistics
from inferd.core.tracing import ExecutionTracer
from inferd.errors import ModelNotFoundError, UnsupportedError
from inferd.testing.models import python_model, write_config
from inferd.types import DataType, InferRequest, RequestContext, Tensor

DOUBLE = """
class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1]}]

    def execute(self, inputs):
        return {"y": inputs["x"] * 2}
"""
# Doubles twice: two steps through the same model, one after the other.
QUADRUPLE = """
platform: "ensemble"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "double" input_map { key: "x" value: "X" } output_map { key: "y" value: "X2" } },
  { model_name: "double" input_map { key: "x" value: "X2" } output_map { key: "y" value: "Y" } } ] }
"""


class RecordingTracer:
    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    def request_started(self, request: InferRequest) -> None:
        self.started.append((request.model_name, request.context.door))

    def executions(self, model: str, version: int) -> ExecutionTracer:
        return Executions()


class Executions:
    def executed(
        self, contexts: object, rows: int, dispatched_ago_s: float, finished_ago_s: float, failed: bool
    ) -> None:
        return None


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[tuple[InferenceService, ServingStatistics, RecordingTracer]]:
    python_model(tmp_path / "double" / "1", DOUBLE)
    write_config(tmp_path / "double", 'backend: "python"')
    write_config(tmp_path / "quadruple", QUADRUPLE)
    python_model(tmp_path / "stream" / "1", DOUBLE)
    write_config(tmp_path / "stream", 'backend: "python"\nmodel_transaction_policy { decoupled: true }')
    statistics, tracer = ServingStatistics(), RecordingTracer()
    registry = ModelRegistry(LocalRepository(tmp_path), statistics, tracer=tracer)
    await registry.load_all()
    yield InferenceService(registry, statistics=statistics, tracer=tracer), statistics, tracer
    await registry.close()


def request(model: str, protocol: str = "kserve_http") -> InferRequest:
    x = np.array([1.0, 2.0], dtype=np.float32)
    name = "X" if model == "quadruple" else "x"
    tensor = Tensor(name, DataType.FP32, x.shape, x)
    return InferRequest(model, "", (tensor,), context=RequestContext("r", door=protocol))


def outcomes(statistics: ServingStatistics, model: str) -> dict[tuple[str, str], int]:
    found = statistics.snapshot().get((model, "1"))
    return found.outcomes if found is not None else {}


async def test_an_ensemble_request_counts_once_and_each_step_once_under_its_model(
    parts: tuple[InferenceService, ServingStatistics, RecordingTracer],
) -> None:
    service, statistics, tracer = parts
    response = await service.infer(request("quadruple"))
    assert response.outputs[0].data.tolist() == [4.0, 8.0]
    assert outcomes(statistics, "quadruple") == {("kserve_http", "success"): 1}
    assert outcomes(statistics, "double") == {("ensemble", "success"): 2}
    assert statistics.model_statistics("double", "1").inference_count == 4  # two rows, two steps
    assert tracer.started == [("quadruple", "kserve_http"), ("double", "ensemble"), ("double", "ensemble")]
    await service.infer(request("double"))
    assert outcomes(statistics, "double") == {("ensemble", "success"): 2, ("kserve_http", "success"): 1}


async def test_made_up_names_share_one_bounded_series(
    parts: tuple[InferenceService, ServingStatistics, RecordingTracer],
) -> None:
    service, statistics, _ = parts
    for index in range(50):
        with pytest.raises(ModelNotFoundError) as raised:
            await service.infer(request(f"no-such-model-{index}", protocol="kserve_grpc"))
        assert raised.value.request_id == "r"
    assert statistics.unresolved == {("kserve_grpc", ModelNotFoundError.code.value): 50}
    assert set(statistics.snapshot()) == set()  # no version was made up


async def test_a_unary_call_to_a_decoupled_model_is_refused_and_counted(
    parts: tuple[InferenceService, ServingStatistics, RecordingTracer],
) -> None:
    service, statistics, _ = parts
    with pytest.raises(UnsupportedError, match="decoupled"):
        await service.infer(request("stream"))
    assert outcomes(statistics, "stream") == {("kserve_http", UnsupportedError.code.value): 1}
    responses = [r async for r in service.infer_stream(request("stream", protocol="kserve_grpc"))]
    assert [r.outputs[0].data.tolist() for r in responses] == [[2.0, 4.0]]
    assert outcomes(statistics, "stream")[("kserve_grpc", "success")] == 1


async def test_a_request_is_counted_from_the_start_of_its_decoding(
    parts: tuple[InferenceService, ServingStatistics, RecordingTracer],
) -> None:
    service, statistics, _ = parts
    decoded = request("double")
    decoded.context.timing.decode_s = 2.0  # the door took two seconds to decode it
    await service.infer(decoded)
    assert statistics.model_statistics("double", "1").success.ns >= 2_000_000_000


async def test_an_ensemble_runs_with_no_service_above_the_dispatcher(tmp_path: Path) -> None:
    python_model(tmp_path / "double" / "1", DOUBLE)
    write_config(tmp_path / "double", 'backend: "python"')
    write_config(tmp_path / "quadruple", QUADRUPLE)
    registry = ModelRegistry(LocalRepository(tmp_path))
    try:
        await registry.load_all()
        response = await registry.dispatcher.infer(request("quadruple"))
        assert response.outputs[0].data.tolist() == [4.0, 8.0]
        assert isinstance(registry.metrics, ServingStatistics)
        assert outcomes(registry.metrics, "double") == {("ensemble", "success"): 2}
    finally:
        await registry.close()


def test_the_service_reads_the_statistics_the_dispatcher_writes(tmp_path: Path) -> None:
    registry = ModelRegistry(LocalRepository(tmp_path))
    InferenceService(registry)  # the registry's own statistics
    with pytest.raises(ValueError, match="must be the registry's"):
        InferenceService(registry, statistics=ServingStatistics())


async def test_a_client_may_ask_its_request_be_background_work(
    parts: tuple[InferenceService, ServingStatistics, RecordingTracer],
) -> None:
    import math

    from inferd.errors import InvalidRequestError

    service, _, _ = parts
    dispatcher = service.dispatcher
    background = request("double")
    background = InferRequest(
        "double", "", background.inputs, parameters={"inferd_admission": "background"}, context=background.context
    )
    answer = await service.infer(background)
    np.testing.assert_array_equal(answer.outputs[0].data, [2.0, 4.0])
    # Served, and not as real-time work: async jobs would not hold back for it.
    assert dispatcher.realtime_started_s == -math.inf
    await service.infer(request("double"))
    assert dispatcher.realtime_started_s > -math.inf
    wrong = InferRequest("double", "", background.inputs, parameters={"inferd_admission": "urgent"})
    with pytest.raises(InvalidRequestError, match="inferd_admission"):
        await service.infer(wrong)

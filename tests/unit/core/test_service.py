"""What the service alone owns around the dispatcher: the client's request held to the server's
limits, the classification it asks for (unary and streamed alike), the answer's limit, and a unary
call to a decoupled model refused in no transport's words; each counted once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from inferd.core.registry import ModelRegistry
from inferd.core.repository import LocalRepository
from inferd.core.service import InferenceService
from inferd.core.statistics import ServingStatistics
from inferd.errors import RequestTooLargeError, StreamOnlyModelError
from inferd.limits import RequestLimits
from inferd.testing.models import python_model, write_config
from inferd.types import DataType, InferRequest, RequestedOutput, Tensor

DOUBLE = """
class Model:
    def execute(self, inputs):
        return {"y": inputs["x"] * 2}
"""
CONFIG = """
backend: "python"
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt" } ]
"""


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[tuple[InferenceService, ServingStatistics]]:
    for name, extra in (("double", ""), ("stream", "model_transaction_policy { decoupled: true }")):
        python_model(tmp_path / name / "1", DOUBLE)
        write_config(tmp_path / name, CONFIG + extra)
        (tmp_path / name / "labels.txt").write_text("zero\none\ntwo\n")
    statistics = ServingStatistics()
    registry = ModelRegistry(LocalRepository(tmp_path), statistics)
    await registry.load_all()
    limits = RequestLimits(max_elements=32, max_text_bytes=1024, max_response_bytes=64)
    yield InferenceService(registry, limits=limits), statistics
    await registry.close()


def request(model: str, values: list[float], classes: int = 0) -> InferRequest:
    x = np.array(values, dtype=np.float32)
    outputs = (RequestedOutput("y", {"classification": classes}),) if classes else ()
    return InferRequest(model, "", (Tensor("x", DataType.FP32, x.shape, x),), outputs=outputs)


def outcomes(statistics: ServingStatistics, model: str) -> dict[tuple[str, str], int]:
    return statistics.snapshot()[(model, "1")].outcomes


async def test_classification_is_applied_to_the_output_asked_for(
    parts: tuple[InferenceService, ServingStatistics],
) -> None:
    service, _ = parts
    response = await service.infer(request("double", [0.5, 0.25, 1.0], classes=2))
    assert response.outputs[0].data.tolist() == [b"2.000000:2:two", b"1.000000:0:zero"]


async def test_the_stream_honours_the_classification_a_unary_call_does(
    parts: tuple[InferenceService, ServingStatistics],
) -> None:
    service, statistics = parts
    streamed = [r async for r in service.infer_stream(request("stream", [0.5, 0.25, 1.0], classes=1))]
    assert [r.outputs[0].data.tolist() for r in streamed] == [[b"2.000000:2:two"]]
    assert outcomes(statistics, "stream") == {("kserve_http", "success"): 1}  # counted once


async def test_requests_and_answers_past_the_limits_are_refused_and_counted_under_the_model(
    parts: tuple[InferenceService, ServingStatistics],
) -> None:
    service, statistics = parts
    with pytest.raises(RequestTooLargeError, match="max-request-elements"):
        await service.infer(request("double", [1.0] * 33))
    # 16 float32 outputs are the 64 bytes an answer may carry; 17 are more.
    assert len((await service.infer(request("double", [1.0] * 16))).outputs[0].data) == 16
    with pytest.raises(RequestTooLargeError, match="max-response-bytes"):
        await service.infer(request("double", [1.0] * 17))
    # A request is held to its limits before its model is looked up: counted in the bounded series of
    # requests that reached no version; an answer too large, under the version that made it.
    assert statistics.unresolved == {("kserve_http", "REQUEST_TOO_LARGE"): 1}
    counted = outcomes(statistics, "double")
    assert counted == {("kserve_http", "REQUEST_TOO_LARGE"): 1, ("kserve_http", "success"): 1}


async def test_a_unary_call_to_a_decoupled_model_is_refused_in_no_transports_words(
    parts: tuple[InferenceService, ServingStatistics],
) -> None:
    service, statistics = parts
    with pytest.raises(StreamOnlyModelError) as refused:
        await service.infer(request("stream", [1.0]))
    assert "HTTP" not in refused.value.message and "ModelStreamInfer" in refused.value.message
    assert refused.value.unary_call("HTTP end point").message.startswith("HTTP end point doesn't support")
    assert outcomes(statistics, "stream") == {("kserve_http", "UNSUPPORTED"): 1}

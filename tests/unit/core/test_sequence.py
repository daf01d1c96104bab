"""SequenceBatcher through its public interface, on a fake runtime."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from inferd.config.model import ModelConfig, SequenceBatchingConfig, TensorConfig
from inferd.core.executor import InstancePool
from inferd.core.scheduler import Work
from inferd.core.sequence import SequenceBatcher
from inferd.errors import ModelOutputError
from inferd.testing.fakes import FakeRuntime
from inferd.types import DataType, InferRequest, Tensor


def config(max_batch_size: int) -> ModelConfig:
    return ModelConfig(
        name="stateful",
        max_batch_size=max_batch_size,
        inputs=(TensorConfig("x", DataType.FP32, (2,)),),
        outputs=(TensorConfig("y", DataType.FP32, (2,)),),
        sequence_batching=SequenceBatchingConfig(strategy="direct"),
    )


async def step(batcher: SequenceBatcher, sequence: int, value: float) -> dict[str, np.ndarray[Any, Any]]:
    """A whole sequence of one request (START and END)."""
    x = np.full((1, 2), value, dtype=np.float32)
    request = InferRequest(
        model_name="stateful",
        model_version="",
        request_id=str(sequence),
        inputs=(Tensor("x", DataType.FP32, x.shape, x),),
        parameters={"sequence_id": sequence, "sequence_start": True, "sequence_end": True},
    )
    return await batcher.submit(Work(request, {"x": x}, 1, ["y"]))


async def test_each_request_gets_its_own_row() -> None:
    batcher = SequenceBatcher(config(4), InstancePool([FakeRuntime()], name="stateful"))
    answers = await asyncio.wait_for(asyncio.gather(*(step(batcher, s, float(s)) for s in range(1, 9))), 10)
    assert [a["y"].tolist() for a in answers] == [[[2.0 * s] * 2] for s in range(1, 9)]
    await batcher.close()


async def test_a_model_that_answers_a_row_too_few_fails_every_request() -> None:
    batcher = SequenceBatcher(config(4), InstancePool([FakeRuntime(extra_rows=-1)], name="stateful"))
    for sequence in range(1, 51):
        with pytest.raises(ModelOutputError, match="model 'stateful' output 'y' has shape"):
            await asyncio.wait_for(step(batcher, sequence, 1.0), timeout=10)
    together = [step(batcher, sequence, 1.0) for sequence in range(100, 150)]
    outcomes = await asyncio.wait_for(asyncio.gather(*together, return_exceptions=True), timeout=10)
    assert all(isinstance(outcome, ModelOutputError) for outcome in outcomes)
    assert len({id(outcome) for outcome in outcomes}) == 50  # each its own copy, for its own request id
    await batcher.close()

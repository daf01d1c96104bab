"""Shadow copies: sampling, the bound on what waits, comparison, and turning off, with a fake infer."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from inferd.core.metrics import NoMetrics
from inferd.core.shadow import MAX_RUNNING, MAX_WAITING, OFF_AFTER_FAILURES, ShadowState, ShadowTraffic, compare
from inferd.errors import ModelRaisedError
from inferd.types import SHADOW_COPY, DataType, InferRequest, InferResponse, Tensor

pytestmark = pytest.mark.timeout(30)


def tensor(name: str, values: list[float]) -> Tensor:
    data = np.array([values], dtype=np.float32)
    return Tensor(name, DataType.FP32, data.shape, data)


REQUEST = InferRequest("endpoint", "", (tensor("x", [1, 2]),))
PRIMARY = InferResponse("m", "1", "id", (tensor("y", [1, 2]),))


def state(sample: float = 1.0) -> ShadowState:
    return ShadowState("e", "s", "candidate", "", sample)


def test_a_sample_copies_exactly_its_share_spread_evenly() -> None:
    shadow = state(0.25)
    picks = [shadow.sampled() for _ in range(400)]
    assert sum(picks) == 100
    assert all(sum(picks[i : i + 4]) == 1 for i in range(0, 400, 4))


def test_answers_agree_within_validates_tolerances_and_report_their_largest_diff() -> None:
    assert compare(PRIMARY, InferResponse("c", "1", "id", (tensor("y", [1, 2.0005]),))) == (
        True,
        {"y": pytest.approx(5e-4, abs=1e-6)},
    )
    agreed, diffs = compare(PRIMARY, InferResponse("c", "1", "id", (tensor("y", [1, 2.5]),)))
    assert (agreed, diffs) == (False, {"y": 0.5})
    assert compare(PRIMARY, InferResponse("c", "1", "id", (tensor("z", [1, 2]),)))[0] is False


def test_copies_beyond_the_bound_are_dropped_and_the_rest_run_in_the_background() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        seen: list[InferRequest] = []

        async def infer(request: InferRequest) -> InferResponse:
            seen.append(request)
            await release.wait()
            return PRIMARY

        traffic = ShadowTraffic(infer, NoMetrics())
        shadow = state()
        for _ in range(100):
            traffic.offer([shadow], REQUEST, PRIMARY)
        assert shadow.dropped == 100 - MAX_RUNNING - MAX_WAITING
        await asyncio.sleep(0)
        assert len(seen) == MAX_RUNNING  # the rest wait their turn
        assert {(r.model_name, r.context.door) for r in seen} == {("candidate", SHADOW_COPY)}
        release.set()
        while shadow.waiting_or_running:
            await asyncio.sleep(0.001)
        assert (shadow.compared, shadow.agreed) == (MAX_RUNNING + MAX_WAITING,) * 2

    asyncio.run(scenario())


def test_a_shadow_failing_again_and_again_turns_off() -> None:
    async def scenario() -> None:
        async def infer(request: InferRequest) -> InferResponse:
            raise ModelRaisedError("no")

        traffic = ShadowTraffic(infer, NoMetrics())
        shadow = state()
        for _ in range(OFF_AFTER_FAILURES + 10):
            traffic.offer([shadow], REQUEST, PRIMARY)
            await asyncio.sleep(0.001)
        while shadow.waiting_or_running:
            await asyncio.sleep(0.001)
        assert shadow.off_reason.startswith(f"turned off after {OFF_AFTER_FAILURES} failures in a row")
        assert shadow.window.requests_total == OFF_AFTER_FAILURES

    asyncio.run(scenario())


def test_comparisons_are_counted_by_the_variant_that_answered() -> None:
    """A rollout's drift guard reads the baseline's: a third variant's answers are not its."""
    from dataclasses import dataclass, replace

    from inferd.types import RequestContext

    @dataclass
    class Answered:
        variant: str
        endpoint: str = "e"
        variant_header: bytes = b""
        shadowed: bool = True

        def observe(self, latency_s: float, outcome: str) -> None:
            pass

        def succeeded(self, entry: list[float]) -> None:
            pass

        def clock(self) -> float:
            return 0.0

    async def scenario() -> None:
        async def infer(request: InferRequest) -> InferResponse:
            return PRIMARY

        traffic = ShadowTraffic(infer, NoMetrics())
        shadow = state()
        for variant in ("blue", "blue", "red"):
            traffic.offer([shadow], replace(REQUEST, context=RequestContext(route=Answered(variant))), PRIMARY)
        traffic.offer([shadow], REQUEST, PRIMARY)  # no route: asked by the model's own name
        while shadow.waiting_or_running:
            await asyncio.sleep(0.001)
        assert shadow.by_variant == {"blue": (2, 2), "red": (1, 1), "": (1, 1)}
        assert (shadow.compared, shadow.agreed) == (4, 4)

    asyncio.run(scenario())

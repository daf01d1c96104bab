"""Guarded rollouts: the judge's verdicts, and the controller's steps, rollbacks, pauses and restarts
on an injected clock against a fake endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from inferd.core.request_window import WindowSummary
from inferd.core.rollout import (
    FIGURES_OUTAGE_S,
    MIN_DRIFT_PAIRS,
    Drift,
    FiguresUnavailable,
    Guards,
    RolloutController,
    judge,
    parse_duration,
    parse_strategy,
)
from inferd.errors import InvalidRequestError
from inferd.testing.fakes import FakeClock

pytestmark = pytest.mark.timeout(30)

GUARDS = Guards(min_requests=100)
HEALTHY = WindowSummary(200, 0, 5.0, 10.0)


def test_strategies_and_durations() -> None:
    assert parse_strategy("all-at-once") == (100.0,)
    assert parse_strategy("canary:10") == (10.0, 100.0)
    assert parse_strategy("linear:4") == (25.0, 50.0, 75.0, 100.0)
    for wrong in ("canary:0", "canary:100", "linear:0", "linear:2.5", "blue-green"):
        with pytest.raises(InvalidRequestError, match="is not all-at-once"):
            parse_strategy(wrong)
    assert [parse_duration(t) for t in ("90", "90s", "5m", "1h", "20ms", 7)] == [90, 90, 300, 3600, 0.02, 7]
    with pytest.raises(InvalidRequestError):
        parse_duration("soon")


def test_no_judgment_before_enough_requests_and_a_pause_when_the_bake_ends_without_them() -> None:
    failing = WindowSummary(50, 50, 5.0, 10.0)
    assert judge(failing, HEALTHY, 50, baked=False, guards=GUARDS).action == "wait"
    paused = judge(failing, HEALTHY, 50, baked=True, guards=GUARDS)
    assert paused.action == "pause" and "has 50 of the 100 requests" in paused.reason


def test_an_error_rate_above_the_baselines_fails_with_its_numbers() -> None:
    verdict = judge(WindowSummary(412, 82, 5.0, 10.0), WindowSummary(1000, 1, 5.0, 10.0), 412, False, GUARDS)
    assert verdict.action == "fail"
    assert verdict.reason.startswith("candidate error rate 19.9% vs baseline 0.1% over 412 requests")


def test_latency_fails_only_when_both_the_ratio_and_the_delta_are_over() -> None:
    slow = judge(WindowSummary(200, 0, 110.0, 120.0), HEALTHY, 200, False, GUARDS)
    assert slow.action == "fail" and "p99 120.0 ms vs baseline 10.0 ms" in slow.reason
    # Twice as slow but 10 ms: an A/A rollout's noise on a fast model is not a failure.
    assert judge(WindowSummary(200, 0, 5.0, 20.0), HEALTHY, 200, True, GUARDS).action == "pass"


class FakeEndpoint:
    def __init__(self) -> None:
        self.weights: dict[str, float] = {"blue": 100.0, "green": 0.0}
        self.figures: dict[str, WindowSummary] = {"blue": HEALTHY, "green": WindowSummary(0, 0, None, None)}
        self.requests: dict[str, int] = {"blue": 0, "green": 0}
        self.shadow: tuple[int, int] | None = None  # (compared, agreed) of a shadow running green
        self.twins = False  # whether green and blue run the same model and version

    async def set_weights(self, endpoint: str, weights: dict[str, float]) -> None:
        self.weights = dict(weights)
        if self.shadow is not None:
            self.shadow = (0, 0)  # as the server does: the endpoint set again, its shadows anew

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary:
        return self.figures[variant]

    async def unpinned_requests(self, endpoint: str, variant: str) -> int:
        return self.requests[variant]

    def compared_answers(self, endpoint: str, candidate: str, baseline: str) -> tuple[int, int] | None:
        return self.shadow

    def same_servable(self, endpoint: str, candidate: str, baseline: str) -> bool:
        return self.twins

    def serve(self, candidate: WindowSummary) -> None:
        """The candidate answered these requests since the last look."""
        self.figures["green"] = candidate
        self.requests["green"] += candidate.requests


def never() -> Callable[[float], Awaitable[None]]:
    """A sleep that never ends: the tests tick the controller themselves."""

    async def sleep(seconds: float) -> None:
        await asyncio.Event().wait()

    return sleep


def controller(endpoint: FakeEndpoint, clock: FakeClock, kept: list[list[dict[str, Any]]]) -> RolloutController:
    return RolloutController(endpoint, kept.append, clock=clock, sleep=never())


def test_a_healthy_canary_is_baked_step_by_step_and_promoted() -> None:
    async def scenario() -> None:
        clock, endpoint, kept = FakeClock(), FakeEndpoint(), []
        rollouts = controller(endpoint, clock, kept)
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "canary:10", 60, GUARDS)
        assert endpoint.weights == {"blue": 90.0, "green": 10.0}
        endpoint.serve(WindowSummary(150, 0, 5.0, 10.0))
        clock.advance(30)
        await rollouts.tick("e")  # judged healthy, but not baked yet
        assert endpoint.weights == {"blue": 90.0, "green": 10.0}
        clock.advance(31)
        await rollouts.tick("e")
        assert endpoint.weights == {"blue": 0.0, "green": 100.0}  # step 2: all of it
        endpoint.serve(WindowSummary(300, 0, 5.0, 11.0))
        clock.advance(61)
        await rollouts.tick("e")
        rollout = rollouts.current("e")
        assert rollout is not None and rollout.state == "promoted"
        assert [d.action for d in rollout.decisions] == ["started", "step", "passed", "step", "passed", "promoted"]
        assert endpoint.weights == {"blue": 0.0, "green": 100.0}
        assert not rollouts.is_running("e") and kept[-1][0]["state"] == "promoted"

    asyncio.run(scenario())


def test_a_failing_candidate_rolls_back_at_once_with_the_numbers_behind_it() -> None:
    async def scenario() -> None:
        clock, endpoint, kept = FakeClock(), FakeEndpoint(), []
        endpoint.weights = {"blue": 90.0, "green": 10.0}
        rollouts = controller(endpoint, clock, kept)
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "linear:4", 300, GUARDS)
        assert endpoint.weights == {"blue": 75.0, "green": 25.0}
        endpoint.serve(WindowSummary(120, 24, 5.0, 10.0))
        clock.advance(5)  # long before the bake ends
        await rollouts.tick("e")
        rollout = rollouts.current("e")
        assert rollout is not None and rollout.state == "rolled-back"
        assert endpoint.weights == {"blue": 90.0, "green": 10.0}  # as before the rollout
        assert rollout.decisions[-1].message.startswith(
            "rolled back at step 1: candidate error rate 20.0% vs baseline 0.0% over 120 requests"
        )

    asyncio.run(scenario())


def test_too_little_traffic_pauses_and_never_promotes_then_goes_on() -> None:
    async def scenario() -> None:
        clock, endpoint, kept = FakeClock(), FakeEndpoint(), []
        rollouts = controller(endpoint, clock, kept)
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "all-at-once", 10, GUARDS)
        endpoint.serve(WindowSummary(3, 0, 5.0, 10.0))
        clock.advance(3600)
        await rollouts.tick("e")
        await rollouts.tick("e")
        rollout = rollouts.current("e")
        assert rollout is not None and rollout.state == "paused"
        assert [d.action for d in rollout.decisions].count("paused") == 1
        endpoint.serve(WindowSummary(200, 0, 5.0, 10.0))
        await rollouts.tick("e")
        assert rollout.state == "promoted"

    asyncio.run(scenario())


def test_a_restarted_controller_resumes_the_bake_where_it_was() -> None:
    async def scenario() -> None:
        clock, endpoint, kept = FakeClock(), FakeEndpoint(), []
        first = controller(endpoint, clock, kept)
        await first.start("e", "green", "blue", dict(endpoint.weights), "canary:10", 60, GUARDS)
        clock.advance(40)
        # The process dies; a new one reads what was kept and the traffic split it left.
        again, restarted = FakeEndpoint(), []
        again.weights = dict(endpoint.weights)
        second = controller(again, clock, restarted)
        await second.restore(kept[-1])
        assert second.is_running("e") and again.weights == {"blue": 90.0, "green": 10.0}
        again.serve(WindowSummary(150, 0, 5.0, 10.0))
        clock.advance(21)  # 61 s into the step, counting the time before the restart
        await second.tick("e")
        rollout = second.current("e")
        assert rollout is not None and rollout.step == 1
        assert [d.action for d in rollout.decisions][-3:] == ["resumed", "passed", "step"]

    asyncio.run(scenario())


def test_promote_and_abort_by_hand_and_one_rollout_at_a_time() -> None:
    async def scenario() -> None:
        clock, endpoint, kept = FakeClock(), FakeEndpoint(), []
        rollouts = controller(endpoint, clock, kept)
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "linear:2", 60, GUARDS)
        with pytest.raises(InvalidRequestError, match="has a rollout running"):
            await rollouts.start("e", "green", "blue", dict(endpoint.weights), "linear:2", 60, GUARDS)
        await rollouts.abort("e")
        assert endpoint.weights == {"blue": 100.0, "green": 0.0}
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "linear:2", 60, GUARDS)
        await rollouts.promote("e")
        assert endpoint.weights == {"blue": 0.0, "green": 100.0}
        assert [r.state for r in rollouts.history("e")] == ["aborted", "promoted"]
        with pytest.raises(InvalidRequestError, match="has no rollout running"):
            await rollouts.abort("e")

    asyncio.run(scenario())


DRIFT = Guards(min_requests=100, max_drift=0.05)


def test_drift_fails_early_only_when_surely_over_and_at_the_bakes_end_over_its_share() -> None:
    few = Drift(MIN_DRIFT_PAIRS - 1, MIN_DRIFT_PAIRS - 1)
    assert judge(HEALTHY, HEALTHY, 150, False, DRIFT, few).action == "wait"  # too few to judge a share
    assert judge(HEALTHY, HEALTHY, 150, True, DRIFT, few).action == "pause"
    assert "compared 29 of the 30" in judge(HEALTHY, HEALTHY, 150, True, DRIFT, few).reason
    early = judge(HEALTHY, HEALTHY, 10, False, DRIFT, Drift(40, 10))  # before min_requests, surely over
    assert early.action == "fail"
    assert early.reason == (
        "candidate's answers disagreed with the baseline's on 10 of 40 shadowed requests (25.0%, more than 5.0%)"
    )
    # 4 of 40 is over 5%, but not surely (its 95% lower bound is 4%): judged when the bake ends.
    assert judge(HEALTHY, HEALTHY, 150, False, DRIFT, Drift(40, 4)).action == "wait"
    assert judge(HEALTHY, HEALTHY, 150, True, DRIFT, Drift(40, 4)).action == "fail"
    # One disagreement in the first 30 does not fail a 1% guard early (a 0.1% candidate would be
    # rolled back one time in ten if it did).
    assert judge(HEALTHY, HEALTHY, 150, False, Guards(max_drift=0.01), Drift(30, 1)).action == "wait"
    passed = judge(HEALTHY, HEALTHY, 150, True, DRIFT, Drift(40, 2))
    assert passed.action == "pass" and passed.reason.endswith("disagreed on 2 of 40 shadowed")
    assert judge(HEALTHY, HEALTHY, 150, True, GUARDS, None).action == "pass"  # not asked: not judged
    with pytest.raises(InvalidRequestError, match="max_drift"):
        Guards(max_drift=1.5)


def test_a_drifting_candidate_rolls_back_counting_only_its_steps_answers() -> None:
    async def scenario() -> None:
        clock, endpoint, kept = FakeClock(), FakeEndpoint(), []
        rollouts = controller(endpoint, clock, kept)
        with pytest.raises(InvalidRequestError, match="give endpoint 'e' a shadow"):
            await rollouts.start("e", "green", "blue", dict(endpoint.weights), "canary:10", 60, DRIFT)
        endpoint.shadow, endpoint.twins = (500, 400), True
        with pytest.raises(InvalidRequestError, match="run the same model and version"):
            await rollouts.start("e", "green", "blue", dict(endpoint.weights), "canary:10", 60, DRIFT)
        endpoint.twins = False
        with pytest.raises(InvalidRequestError, match="all-at-once"):
            await rollouts.start("e", "green", "blue", dict(endpoint.weights), "all-at-once", 60, DRIFT)
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "canary:10", 60, DRIFT)
        assert endpoint.shadow == (0, 0)  # what it compared before the rollout is not the step's
        endpoint.serve(WindowSummary(150, 0, 5.0, 10.0))
        endpoint.shadow = (40, 39)
        clock.advance(61)
        await rollouts.tick("e")
        assert endpoint.weights == {"blue": 0.0, "green": 100.0}  # step 2
        endpoint.serve(WindowSummary(300, 0, 5.0, 10.0))
        clock.advance(61)
        await rollouts.tick("e")  # at 100% nothing is compared: the step before judged the drift
        rollout = rollouts.current("e")
        assert rollout is not None and rollout.state == "promoted"
        assert "disagreed on 1 of 40 shadowed" in rollout.decisions[2].message
        assert kept[-1][0]["guards"]["max_drift"] == 0.05

        endpoint.weights = {"blue": 100.0, "green": 0.0}
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "linear:4", 60, DRIFT)
        endpoint.serve(WindowSummary(150, 0, 5.0, 10.0))
        endpoint.shadow = (50, 40)
        clock.advance(5)
        await rollouts.tick("e")
        rollout = rollouts.current("e")
        assert rollout is not None and rollout.state == "rolled-back"
        assert "disagreed with the baseline's on 10 of 50 shadowed requests" in rollout.decisions[-1].message

    asyncio.run(scenario())


class Blind(FakeEndpoint):
    """An endpoint whose figures cannot be read while `blind` (a fleet's metrics source down)."""

    def __init__(self) -> None:
        super().__init__()
        self.blind = False

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary:
        if self.blind:
            raise FiguresUnavailable("Prometheus at http://127.0.0.1:9 did not answer")
        return await super().summary(endpoint, variant, window_s)


async def watched(rollouts: RolloutController, clock: FakeClock, seconds: float) -> None:
    """Let the controller's own task tick for `seconds` of the fake clock (its sleep moves it)."""
    until = clock() + seconds
    for _ in range(100_000):
        if clock() >= until or not rollouts.is_running("e"):
            return
        await asyncio.sleep(0)
    raise AssertionError("the controller's task did not tick")


def ticking(clock: FakeClock) -> Callable[[float], Awaitable[None]]:
    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)

    return sleep


def test_a_rollout_without_figures_says_so_once_and_rolls_back_when_the_outage_lasts() -> None:
    async def scenario() -> None:
        clock, endpoint = FakeClock(), Blind()
        rollouts = RolloutController(endpoint, lambda documents: None, clock=clock, sleep=ticking(clock))
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "canary:10", 3600, GUARDS)
        endpoint.blind = True
        await watched(rollouts, clock, FIGURES_OUTAGE_S / 2)
        endpoint.blind = False  # back before the limit: the rollout goes on, said once
        await watched(rollouts, clock, 5)
        rollout = rollouts.current("e")
        assert rollout is not None and rollout.state == "running"
        assert [d.action for d in rollout.decisions] == ["started", "step", "cannot-judge"]
        assert "did not answer" in rollout.decisions[-1].message
        endpoint.blind = True
        await watched(rollouts, clock, FIGURES_OUTAGE_S + 5)
        assert rollout.state == "rolled-back" and endpoint.weights == {"blue": 100.0, "green": 0.0}
        assert rollout.decisions[-1].message.startswith("rolled back at step 1: not judged for 40 s")
        await rollouts.close()

    asyncio.run(scenario())


class Slow(FakeEndpoint):
    """An endpoint whose figures take until the test says (a fleet's Prometheus, far away)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()
        self.answer.set()
        self.asked = asyncio.Event()

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary:
        self.asked.set()
        await self.answer.wait()
        return await super().summary(endpoint, variant, window_s)


def test_an_abort_while_a_tick_waits_for_figures_waits_for_it_and_nothing_ends_twice() -> None:
    async def scenario() -> None:
        clock, endpoint = FakeClock(), Slow()
        rollouts = controller(endpoint, clock, [])
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "all-at-once", 60, GUARDS)
        endpoint.serve(WindowSummary(150, 0, 5.0, 10.0))
        clock.advance(61)  # the tick judges the step baked and healthy
        endpoint.answer.clear()
        endpoint.asked.clear()
        judging = asyncio.create_task(rollouts.tick("e"))
        await endpoint.asked.wait()  # the tick waits for its figures
        aborting = asyncio.create_task(rollouts.abort("e"))
        await asyncio.sleep(0)
        assert not aborting.done()  # it waits for the tick, which acts on what it read alone
        endpoint.answer.set()
        await judging
        with pytest.raises(InvalidRequestError, match="has no rollout running"):
            await aborting
        rollout = rollouts.current("e")
        assert rollout is not None and rollout.state == "promoted"
        assert endpoint.weights == {"blue": 0.0, "green": 100.0} and len(rollouts.history("e")) == 1

    asyncio.run(scenario())


class Flaky(FakeEndpoint):
    """An endpoint whose weights cannot be written while `write_fails` counts down, and whose
    request count cannot be read at the reading `count_fails_at` counts down to."""

    def __init__(self) -> None:
        super().__init__()
        self.write_fails = 0
        self.count_fails_at = 0

    async def unpinned_requests(self, endpoint: str, variant: str) -> int:
        if self.count_fails_at:
            self.count_fails_at -= 1
            if not self.count_fails_at:
                raise FiguresUnavailable("no answer")
        return await super().unpinned_requests(endpoint, variant)

    async def set_weights(self, endpoint: str, weights: dict[str, float]) -> None:
        if self.write_fails:
            self.write_fails -= 1
            raise OSError("the shared volume is read-only")
        await super().set_weights(endpoint, weights)


def test_a_step_is_entered_only_with_its_figures_and_its_weights_are_written_again_until_they_are() -> None:
    async def scenario() -> None:
        clock, endpoint, kept = FakeClock(), Flaky(), []
        rollouts = controller(endpoint, clock, kept)
        await rollouts.start("e", "green", "blue", dict(endpoint.weights), "canary:10", 60, GUARDS)
        endpoint.serve(WindowSummary(150, 0, 5.0, 10.0))
        clock.advance(61)
        # The tick reads the count once to judge; step 2's start count (its second reading) fails:
        # the step is not entered, or it would count step 1's requests as its own.
        endpoint.count_fails_at = 2
        with pytest.raises(FiguresUnavailable):
            await rollouts.tick("e")
        rollout = rollouts.current("e")
        assert rollout is not None and rollout.step == 0 and endpoint.weights == {"blue": 90.0, "green": 10.0}
        # Step 2 is kept before its weights are written; a failed write is written again next tick.
        endpoint.write_fails = 1
        with pytest.raises(OSError):
            await rollouts.tick("e")
        assert rollout.step == 1 and kept[-1][0]["step"] == 1 and endpoint.weights == {"blue": 90.0, "green": 10.0}
        await rollouts.tick("e")
        assert endpoint.weights == {"blue": 0.0, "green": 100.0} and rollout.state == "running"

    asyncio.run(scenario())

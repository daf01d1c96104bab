"""Guarded rollouts: an endpoint's traffic moves from its baseline variant to a candidate in steps,
each step baked and judged against the baseline over the same window, and rolls back by itself
when a guard fails (SageMaker's deployment guardrails; Argo Rollouts' analysis).

A strategy is a list of the candidate's shares: `all-at-once` [100], `canary:10` [10, 100],
`linear:4` [25, 50, 75, 100]. Each step sets the weights, then is judged every `TICK_S`:

- no judgment before the candidate has `min_requests` requests in the step (pinned requests do
  not count: they are not routed by weight); a step whose bake time is over without them is
  *paused* and says so, and waits for traffic: a rollout never promotes on no data;
- the error guard: the candidate's error rate over the window minus the baseline's over the same
  window above `max_error_rate_delta` rolls back;
- the latency guard: the candidate's p99 above `max_p99_ratio` times the baseline's *and* more than
  `min_p99_delta_ms` above it rolls back (both: an A/A rollout cannot flap on noise, and a fast
  model is not failed for a few milliseconds);
- the drift guard (`max_drift`, when asked): of the requests the baseline answered in the step, a
  shadow running the candidate's model compares the two answers; a disagreeing share surely over
  `max_drift` (its 95% lower bound) rolls back at once, and one over it at the end of the bake
  does; a step at 100% has no baseline answers and is not judged on drift;
- a step passes once its bake time is over with enough requests and no guard failed; the last
  step passing promotes the candidate (it keeps all the traffic).

The window is the last minute of the step (the step's whole time when shorter). At 100% the
baseline has no traffic of its own: the candidate is judged against the baseline's figures from
the step before (or from the minute before the rollout, for all-at-once).

A rollback restores the weights the endpoint had before the rollout at once: no new request
reaches the candidate, and those it holds finish. Every decision is recorded with the numbers
behind it. The rollout is kept in the state directory after each decision: a restarted server
resumes the bake of the step it was in (the time already baked counts; the requests are counted
again) or finishes a rollback, so traffic is never left split with nobody judging.

`judge` is pure (figures in, verdict out) and the controller runs on an injected clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from inferd.core.request_window import WindowSummary
from inferd.errors import InvalidRequestError
from inferd.types import WINDOW_S

logger = logging.getLogger(__name__)

TICK_S = 0.5
# How long a rollout goes on without being judged (its figures cannot be read, its weights cannot be
# written) before it rolls back: a judge that cannot see must not leave traffic split (Argo
# Rollouts: 4 errors in a row, 10 s apart, fail the analysis).
FIGURES_OUTAGE_S = 40.0
HISTORY = 50  # ended rollouts kept per endpoint
ACTIVE = ("running", "paused")  # the states of a rollout that has not ended
# Compared answers a step needs before max_drift judges it (fewer say too little about a share).
MIN_DRIFT_PAIRS = 30


def parse_strategy(text: str) -> tuple[float, ...]:
    """`all-at-once`, `canary:P` (P% then all) or `linear:K` (K equal steps) → the candidate's shares."""
    if text == "all-at-once":
        return (100.0,)
    kind, _, number = text.partition(":")
    try:
        value = float(number)
    except ValueError:
        value = -1
    if kind == "canary" and 0 < value < 100:
        return (value, 100.0)
    if kind == "linear" and value == int(value) and 1 <= value <= 20:
        steps = int(value)
        return tuple(round(100 * (i + 1) / steps, 6) for i in range(steps))
    raise InvalidRequestError(
        f"strategy {text!r} is not all-at-once, canary:P (0 < P < 100) or linear:K (K steps, 1 to 20)"
    )


def parse_duration(text: str | float) -> float:
    """Seconds of "90", "90s", "5m", "1h" (or a number)."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
        if match is None:
            raise InvalidRequestError(f"duration {text!r} is not a number of seconds, or N followed by ms, s, m or h")
        seconds = float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    if not 0 <= seconds <= 7 * 24 * 3600:
        raise InvalidRequestError(f"duration {text!r} must be between 0 and 7 days")
    return seconds


class FiguresUnavailable(RuntimeError):
    """A rollout's figures cannot be read now (a fleet's metrics source does not answer)."""


@dataclass(frozen=True, slots=True)
class Guards:
    min_requests: int = 100
    max_error_rate_delta: float = 0.05
    max_p99_ratio: float = 1.5
    min_p99_delta_ms: float = 20.0
    # The share of shadowed requests on which the candidate's answer may disagree with the
    # baseline's (inferd validate's judgment); None: answers are not judged. Needs a shadow of the
    # candidate on the endpoint, which copies the baseline's requests to it.
    max_drift: float | None = None

    def __post_init__(self) -> None:
        if self.max_drift is not None and not 0 <= self.max_drift <= 1:
            raise InvalidRequestError("max_drift must be a share, 0 to 1")
        if self.min_requests < 1:
            raise InvalidRequestError("min_requests must be at least 1: a rollout never promotes on no data")
        if not 0 <= self.max_error_rate_delta <= 1:
            raise InvalidRequestError("max_error_rate_delta must be a share, 0 to 1")
        if self.max_p99_ratio < 1 or self.min_p99_delta_ms < 0:
            raise InvalidRequestError("max_p99_ratio must be at least 1 and min_p99_delta_ms at least 0")


@dataclass(frozen=True, slots=True)
class Verdict:
    """`action`: "wait" (too early), "pause" (the bake is over without enough requests), "pass"
    (the step holds) or "fail" (a guard failed); `reason` says it with the numbers."""

    action: str
    reason: str


@dataclass(frozen=True, slots=True)
class Drift:
    """A step's shadowed requests: how many answers of the candidate were compared with the
    baseline's, and on how many they disagreed."""

    compared: int = 0
    disagreed: int = 0


def judge(
    candidate: WindowSummary,
    baseline: WindowSummary,
    step_requests: int,
    baked: bool,
    guards: Guards,
    drift: Drift | None = None,
) -> Verdict:
    """The step's verdict from the candidate's and the baseline's figures over the same window,
    the candidate's requests in the step so far, whether the bake time is over, and (with
    `max_drift`) the step's compared answers (None: not judged in this step)."""
    limit = guards.max_drift
    judged = drift if limit is not None and drift is not None and drift.compared >= MIN_DRIFT_PAIRS else None
    # Before the bake ends a share fails only when it is surely over (its 95% lower bound): a
    # small one judged every tick would otherwise fail on the first disagreement or two.
    if judged is not None and limit is not None and _lower_bound(judged.disagreed, judged.compared) > limit:
        return _drifted(judged, limit)
    if step_requests < guards.min_requests:
        if baked:
            return Verdict(
                "pause",
                f"too little traffic: the candidate has {step_requests} of the {guards.min_requests} requests "
                "this step needs before it is judged",
            )
        return Verdict("wait", "")
    delta = candidate.error_rate - baseline.error_rate
    if delta > guards.max_error_rate_delta:
        return Verdict(
            "fail",
            f"candidate error rate {candidate.error_rate:.1%} vs baseline {baseline.error_rate:.1%} over "
            f"{candidate.requests} requests (more than {guards.max_error_rate_delta:.1%} above)",
        )
    if candidate.p99_ms is not None and baseline.p99_ms is not None:
        slower = candidate.p99_ms - baseline.p99_ms
        if candidate.p99_ms > guards.max_p99_ratio * baseline.p99_ms and slower > guards.min_p99_delta_ms:
            return Verdict(
                "fail",
                f"candidate p99 {candidate.p99_ms:.1f} ms vs baseline {baseline.p99_ms:.1f} ms over "
                f"{candidate.requests} requests (more than {guards.max_p99_ratio:g}x and "
                f"{guards.min_p99_delta_ms:g} ms above)",
            )
    if limit is not None and drift is not None and judged is None:  # too few compared yet
        if baked:
            return Verdict(
                "pause",
                f"too few answers compared: the candidate's shadow compared {drift.compared} of the "
                f"{MIN_DRIFT_PAIRS} this step needs before its drift is judged",
            )
        return Verdict("wait", "")
    if baked:
        drifted = ""
        if judged is not None and limit is not None:
            if judged.disagreed > limit * judged.compared:  # the step's whole share, at its end
                return _drifted(judged, limit)
            drifted = f", disagreed on {judged.disagreed} of {judged.compared} shadowed"
        return Verdict(
            "pass",
            f"candidate error rate {candidate.error_rate:.1%} vs baseline {baseline.error_rate:.1%}, p99 "
            f"{_ms(candidate.p99_ms)} vs {_ms(baseline.p99_ms)}, over {step_requests} requests{drifted}",
        )
    return Verdict("wait", "")


def _drifted(drift: Drift, max_drift: float) -> Verdict:
    return Verdict(
        "fail",
        f"candidate's answers disagreed with the baseline's on {drift.disagreed} of {drift.compared} shadowed "
        f"requests ({drift.disagreed / drift.compared:.1%}, more than {max_drift:.1%})",
    )


def _lower_bound(hits: int, count: int, z: float = 1.96) -> float:
    """The Wilson score interval's lower end for a share of `hits` in `count` (95% with z 1.96)."""
    share = hits / count
    middle = share + z * z / (2 * count)
    spread = z * math.sqrt(share * (1 - share) / count + z * z / (4 * count * count))
    return (middle - spread) / (1 + z * z / count)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


@dataclass
class Decision:
    at: float  # wall clock, seconds since the epoch
    step: int  # 1-based; 0 before the first
    action: str  # started, step, paused, passed, promoted, rolled-back, aborted, resumed, cannot-judge
    message: str


@dataclass
class Rollout:
    """One rollout as the state directory keeps it."""

    endpoint: str
    candidate: str
    baseline: str
    strategy: str
    steps: tuple[float, ...]
    bake_s: float
    guards: Guards
    original_weights: dict[str, float]
    state: str = "running"  # running, paused, promoted, rolled-back, aborted
    step: int = 0  # index into steps
    step_started: float = 0.0  # wall clock
    baseline_reference: dict[str, Any] | None = None  # the baseline's figures, for a step it has none
    decisions: list[Decision] = field(default_factory=list)
    webhook: str = ""  # an outside alarm (the operator's --rollout-webhook of this name) asked at each step

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @staticmethod
    def is_active(document: dict[str, Any]) -> bool:
        """Whether a kept rollout's document is of one still running (or paused)."""
        return document.get("state") in ACTIVE

    def document(self) -> dict[str, Any]:
        document = asdict(self)
        document["steps"] = list(self.steps)
        document["share"] = self.steps[self.step] if self.active else None
        return document

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> Rollout:
        fields = {k: v for k, v in document.items() if k in cls.__dataclass_fields__}
        fields["steps"] = tuple(fields["steps"])
        fields["guards"] = Guards(**fields["guards"])
        fields["decisions"] = [Decision(**d) for d in fields.get("decisions", [])]
        return cls(**fields)


class RolloutTarget(Protocol):
    """What a rollout acts on: the endpoint's weights, and its variants' figures (`EndpointControl`)."""

    async def set_weights(self, endpoint: str, weights: dict[str, float]) -> None: ...

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary:
        """The variant's requests by weight over the last `window_s` seconds (awaited: a fleet's
        figures come from Prometheus or the replicas' /metrics)."""
        ...

    async def unpinned_requests(self, endpoint: str, variant: str) -> int:
        """The variant's requests by weight so far (a counter: a step counts its own from it)."""
        ...

    def compared_answers(self, endpoint: str, candidate: str, baseline: str) -> tuple[int, int] | None:
        """(compared, agreed) of the endpoint's shadow that runs `candidate`'s model and version, on
        the requests `baseline` answered; None when it has none."""
        ...

    def same_servable(self, endpoint: str, candidate: str, baseline: str) -> bool:
        """Whether the two variants name the same model and version."""
        ...


class FleetFigures(Protocol):
    """A fleet's figures for a rollout's judge: every replica's requests by weight, summed
    (`server.fleet_metrics`: Prometheus, or the replicas' /metrics)."""

    def describe(self) -> str: ...

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary: ...

    async def requests(self, endpoint: str, variant: str) -> int: ...


@dataclass
class _Running:
    rollout: Rollout
    # The candidate's unpinned requests when the step (or this process's view of it) began; None
    # when they could not be read then (a rollout taken up while its figures were out): counted
    # from the first tick that reads them.
    step_requests_at: int | None
    # Its shadow's (compared, agreed) then.
    compared_at: tuple[int, int] = (0, 0)
    # Whether the step's weights were written (a tick writes them again until they are).
    weights_written: bool = False


class RolloutController:
    """Runs the rollouts: one task each, a tick every `TICK_S`; keeps them through `keep`."""

    def __init__(
        self,
        target: RolloutTarget,
        keep: Callable[[list[dict[str, Any]]], None],
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._target = target
        self._keep = keep
        self._clock = clock
        self._sleep = sleep
        self._running: dict[str, _Running] = {}
        self.webhook: Webhook | None = None  # set by whoever knows the operator's webhooks
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._history: dict[str, list[Rollout]] = {}
        # One a rollout: a tick, a promote or an abort acts alone (each waits on figures and
        # weights: none may act on what another has just changed).
        self._locks: dict[str, asyncio.Lock] = {}

    # -- what users ask --------------------------------------------------------------------------

    async def start(
        self, endpoint: str, candidate: str, baseline: str, weights: dict[str, float], strategy: str, bake_s: float,
        guards: Guards, webhook: str = "",
    ) -> Rollout:  # fmt: skip
        async with self._lock(endpoint):
            return await self._start(endpoint, candidate, baseline, weights, strategy, bake_s, guards, webhook)

    async def _start(
        self, endpoint: str, candidate: str, baseline: str, weights: dict[str, float], strategy: str, bake_s: float,
        guards: Guards, webhook: str,
    ) -> Rollout:  # fmt: skip
        if endpoint in self._running:
            raise InvalidRequestError(f"endpoint '{endpoint}' has a rollout running: promote or abort it first")
        if webhook and (self.webhook is None or webhook not in self.webhook.names):
            known = ", ".join(self.webhook.names) if self.webhook is not None and self.webhook.names else "none"
            raise InvalidRequestError(
                f"webhook '{webhook}' is not one the server was started with "
                f"(--rollout-webhook NAME=URL; known: {known})"
            )
        if guards.max_drift is not None:
            self._check_drift_can_be_judged(endpoint, candidate, baseline)
        steps = parse_strategy(strategy)
        if guards.max_drift is not None and steps[0] >= 100:
            raise InvalidRequestError(
                "max_drift compares the candidate with the baseline while both serve: all-at-once leaves no such step"
            )
        now = self._clock()
        rollout = Rollout(
            endpoint, candidate, baseline, strategy, steps, bake_s, guards, dict(weights), webhook=webhook
        )
        rollout.baseline_reference = _summary_document(await self._target.summary(endpoint, baseline, WINDOW_S))
        self._decide(rollout, 0, "started", f"from '{baseline}' to '{candidate}' by {strategy}, {bake_s:g} s a step")
        try:
            await self._enter_step(rollout, 0, now)
        except BaseException:  # not started: no record of it stays, and the weights it may have written go back
            if self._running.pop(endpoint, None) is not None:
                with contextlib.suppress(Exception):
                    await self._target.set_weights(endpoint, rollout.original_weights)
            self._save()
            raise
        self._watch_in_background(endpoint)
        return rollout

    async def promote(self, endpoint: str) -> Rollout:
        async with self._lock(endpoint):
            running = self._active(endpoint)
            await self._finish(running.rollout, "promoted", "promoted by hand: the candidate takes all the traffic")
        return running.rollout

    async def abort(self, endpoint: str) -> Rollout:
        async with self._lock(endpoint):
            running = self._active(endpoint)
            await self._finish(running.rollout, "aborted", "aborted by hand: the traffic is back on the baseline")
        return running.rollout

    def current(self, endpoint: str) -> Rollout | None:
        """The running rollout, else the last that ended."""
        if endpoint in self._running:
            return self._running[endpoint].rollout
        ended = self._history.get(endpoint)
        return ended[-1] if ended else None

    def history(self, endpoint: str) -> list[Rollout]:
        return list(self._history.get(endpoint, []))

    def is_running(self, endpoint: str) -> bool:
        return endpoint in self._running

    # -- restart ---------------------------------------------------------------------------------

    async def restore(self, documents: list[dict[str, Any]]) -> None:
        """Take up the rollouts a state directory kept: running ones resume their step's bake,
        others go to the history."""
        for document in documents:
            rollout = Rollout.from_document(document)
            if rollout.active:
                message = "taken up again after a restart: the step's bake goes on"
                self._decide(rollout, rollout.step + 1, "resumed", message)
                try:
                    await self._enter_step(rollout, rollout.step, rollout.step_started, resumed=True)
                except Exception as exc:  # kept as running: its ticks write the weights again, or roll back
                    logger.warning("endpoint '%s': the rollout taken up cannot write its weights yet: %s",
                                   rollout.endpoint, exc)  # fmt: skip
                self._watch_in_background(rollout.endpoint)
            else:
                ended = self._history.setdefault(rollout.endpoint, [])
                ended.append(rollout)
                # Others' taken up may be older than this server's own: in the order they started.
                ended.sort(key=lambda r: r.decisions[0].at if r.decisions else 0.0)
                del ended[:-HISTORY]
        self._save()

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # -- the steps -------------------------------------------------------------------------------

    async def _enter_step(self, rollout: Rollout, step: int, started: float, *, resumed: bool = False) -> None:
        """The rollout at `step`: its figures read first (when they cannot be, nothing changed: the
        step is not entered), then the step kept, then its weights written (a crash between leaves a
        rollout to take up, never a split nobody judges; a write that fails is tried again by the
        ticks)."""
        endpoint = rollout.endpoint
        if step > 0 and not resumed:  # the baseline's figures while it still had traffic
            reference = await self._target.summary(endpoint, rollout.baseline, self._window(rollout))
            if reference.requests:
                rollout.baseline_reference = _summary_document(reference)
        requests_now: int | None
        try:
            requests_now = await self._target.unpinned_requests(endpoint, rollout.candidate)
            compared_now = self._target.compared_answers(endpoint, rollout.candidate, rollout.baseline) or (0, 0)
        except Exception:
            if not resumed:
                raise
            # A rollout taken up is kept whatever: counted from the first tick that reads them.
            requests_now, compared_now = None, (0, 0)
        rollout.step, rollout.step_started, rollout.state = step, started, "running"
        share = rollout.steps[step]
        if not resumed:
            self._decide(rollout, step + 1, "step", f"'{rollout.candidate}' at {share:g}% for {rollout.bake_s:g} s")
        running = self._running[endpoint] = _Running(rollout, requests_now, compared_now)
        self._save()
        await self._write_weights(running)

    async def _write_weights(self, running: _Running) -> None:
        rollout = running.rollout
        await self._target.set_weights(rollout.endpoint, _weights(rollout, rollout.steps[rollout.step]))
        running.weights_written = True

    def _watch_in_background(self, endpoint: str) -> None:
        task = self._tasks.get(endpoint)
        if task is None or task.done():
            self._tasks[endpoint] = asyncio.get_running_loop().create_task(self._watch(endpoint))

    async def _watch(self, endpoint: str) -> None:
        failing_since: float | None = None
        try:
            while endpoint in self._running:
                await self._sleep(TICK_S)
                try:
                    await self.tick(endpoint)
                    failing_since = None
                except Exception as exc:  # whatever stops the judging: the rollout must not hang
                    try:
                        failing_since = await self._cannot_judge(endpoint, failing_since, exc)
                    except Exception:  # the rollback's own write failed: tried again next tick
                        logger.exception("endpoint '%s': the rollback could not be written", endpoint)
        finally:
            if self._tasks.get(endpoint) is asyncio.current_task():
                del self._tasks[endpoint]

    async def tick(self, endpoint: str) -> None:
        """Judge the endpoint's rollout now (the controller's task calls it every TICK_S)."""
        async with self._lock(endpoint):
            await self._judge(endpoint)

    async def _judge(self, endpoint: str) -> None:
        running = self._running.get(endpoint)
        if running is None:
            return
        rollout = running.rollout
        if not running.weights_written:
            await self._write_weights(running)
        now = self._clock()
        window = self._window(rollout)
        candidate = await self._target.summary(endpoint, rollout.candidate, window)
        baseline = await self._target.summary(endpoint, rollout.baseline, window)
        if baseline.requests == 0 and rollout.baseline_reference is not None:
            baseline = WindowSummary(**rollout.baseline_reference)
        requests_now = await self._target.unpinned_requests(endpoint, rollout.candidate)
        if running.step_requests_at is None:
            running.step_requests_at = requests_now
        step_requests = requests_now - running.step_requests_at
        baked = now - rollout.step_started >= rollout.bake_s
        verdict = judge(candidate, baseline, step_requests, baked, rollout.guards, self._drift(running))
        if verdict.action == "fail":
            await self._finish(rollout, "rolled-back", f"rolled back at step {rollout.step + 1}: {verdict.reason}")
        elif verdict.action == "pause" and rollout.state != "paused":
            rollout.state = "paused"
            self._decide(rollout, rollout.step + 1, "paused", verdict.reason)
            self._save()
        elif verdict.action == "pass":
            if rollout.webhook and self.webhook is not None:
                step = _step_document(rollout, candidate, baseline, self._drift(running))
                passed, why = await self.webhook.ask(rollout.webhook, step)
                if not passed:
                    message = f"rolled back at step {rollout.step + 1}: the webhook '{rollout.webhook}' said no: {why}"
                    await self._finish(rollout, "rolled-back", message)
                    return
            self._decide(rollout, rollout.step + 1, "passed", f"step {rollout.step + 1} holds: {verdict.reason}")
            if rollout.step + 1 == len(rollout.steps):
                await self._finish(rollout, "promoted", f"promoted: '{rollout.candidate}' takes all the traffic")
            else:
                await self._enter_step(rollout, rollout.step + 1, now)

    async def _cannot_judge(self, endpoint: str, since: float | None, error: Exception) -> float | None:
        """A tick could not judge (its figures cannot be read, its weights cannot be written): said
        once an outage, and rolled back once it has lasted FIGURES_OUTAGE_S. When the outage began
        (None once rolled back)."""
        why = str(error) if isinstance(error, FiguresUnavailable) else f"{type(error).__name__}: {error}"
        async with self._lock(endpoint):
            running = self._running.get(endpoint)
            if running is None:
                return None
            rollout, now = running.rollout, self._clock()
            if since is None:
                message = f"cannot judge ({why}): rolls back if this lasts {FIGURES_OUTAGE_S:g} s"
                self._decide(rollout, rollout.step + 1, "cannot-judge", message)
                self._save()
                logger.warning("endpoint '%s': %s", endpoint, message)
                return now
            if now - since >= FIGURES_OUTAGE_S:
                message = f"rolled back at step {rollout.step + 1}: not judged for {now - since:.0f} s ({why})"
                await self._finish(rollout, "rolled-back", message)
                return None
            return since

    async def _finish(self, rollout: Rollout, state: str, message: str) -> None:
        weights = _weights(rollout, 100.0) if state == "promoted" else rollout.original_weights
        await self._target.set_weights(rollout.endpoint, weights)
        rollout.state = state
        self._decide(rollout, rollout.step + 1, state, message)
        self._running.pop(rollout.endpoint, None)  # its task sees it gone and ends
        ended = self._history.setdefault(rollout.endpoint, [])
        ended.append(rollout)
        del ended[:-HISTORY]
        self._save()
        log = logger.warning if state == "rolled-back" else logger.info
        log("endpoint '%s': %s", rollout.endpoint, message)

    # -- helpers ---------------------------------------------------------------------------------

    def _drift(self, running: _Running) -> Drift | None:
        """The step's compared answers (a shadow set anew counts from zero again); None when not
        judged: not asked, or a step where the candidate takes all the traffic and the baseline
        answers nothing to compare with (the steps before judged it)."""
        rollout = running.rollout
        if rollout.guards.max_drift is None or rollout.steps[rollout.step] >= 100:
            return None
        now = self._target.compared_answers(rollout.endpoint, rollout.candidate, rollout.baseline)
        if now is None:
            return Drift()
        compared, agreed = now
        base_compared, base_agreed = running.compared_at
        if compared < base_compared:  # the endpoint was set again: its shadow began anew
            base_compared, base_agreed = 0, 0
        return Drift(compared - base_compared, (compared - agreed) - (base_compared - base_agreed))

    def _check_drift_can_be_judged(self, endpoint: str, candidate: str, baseline: str) -> None:
        if self._target.compared_answers(endpoint, candidate, baseline) is None:
            raise InvalidRequestError(
                f"max_drift judges '{candidate}''s answers against the baseline's on shadowed requests: give "
                f"endpoint '{endpoint}' a shadow that runs '{candidate}''s model and version (as the variant "
                "names them) first"
            )
        if self._target.same_servable(endpoint, candidate, baseline):
            raise InvalidRequestError(
                f"'{candidate}' and the baseline '{baseline}' run the same model and version: their answers "
                "cannot drift apart, and max_drift would wait for a difference that cannot come"
            )

    def _window(self, rollout: Rollout) -> float:
        return max(1.0, min(WINDOW_S, self._clock() - rollout.step_started))

    def _lock(self, endpoint: str) -> asyncio.Lock:
        return self._locks.setdefault(endpoint, asyncio.Lock())

    def _active(self, endpoint: str) -> _Running:
        running = self._running.get(endpoint)
        if running is None:
            raise InvalidRequestError(f"endpoint '{endpoint}' has no rollout running")
        return running

    def _decide(self, rollout: Rollout, step: int, action: str, message: str) -> None:
        rollout.decisions.append(Decision(self._clock(), step, action, message))

    def _save(self) -> None:
        documents = [r.rollout.document() for r in self._running.values()]
        documents += [rollout.document() for ended in self._history.values() for rollout in ended]
        self._keep(documents)


def _weights(rollout: Rollout, share: float) -> dict[str, float]:
    """The endpoint's weights with the candidate at `share`% of what baseline and candidate had."""
    weights = dict(rollout.original_weights)
    pool = weights[rollout.baseline] + weights[rollout.candidate] or 100.0
    weights[rollout.candidate] = pool * share / 100
    weights[rollout.baseline] = pool - weights[rollout.candidate]
    return weights


class Webhook(Protocol):
    """Outside alarms: the operator's webhooks by name (server.rollout_webhooks)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    async def ask(self, name: str, step: dict[str, Any]) -> tuple[bool, str]:
        """Whether the step may pass, and why not (a webhook that does not answer says no)."""
        ...


def _step_document(
    rollout: Rollout, candidate: WindowSummary, baseline: WindowSummary, drift: Drift | None = None
) -> dict[str, Any]:
    """What a webhook is asked about: the rollout, its step, both variants' figures, and (when
    judged) the step's compared answers."""
    drifted = {"drift": {"compared": drift.compared, "disagreed": drift.disagreed}} if drift is not None else {}
    return {
        **drifted,
        "endpoint": rollout.endpoint,
        "candidate": rollout.candidate,
        "baseline": rollout.baseline,
        "step": rollout.step + 1,
        "steps": len(rollout.steps),
        "share": rollout.steps[rollout.step],
        "figures": {
            rollout.candidate: {**_summary_document(candidate), "error_rate": candidate.error_rate},
            rollout.baseline: {**_summary_document(baseline), "error_rate": baseline.error_rate},
        },
    }


def _summary_document(summary: WindowSummary) -> dict[str, Any]:
    return {"requests": summary.requests, "errors": summary.errors, "p50_ms": summary.p50_ms, "p99_ms": summary.p99_ms}

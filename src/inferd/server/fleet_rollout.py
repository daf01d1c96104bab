"""A rollout across a fleet: one controller (`inferd rollout start --controller`) judges an
endpoint's rollout on every replica's traffic together and writes the weights every replica
follows, with the same steps, guards, minimum sample and recorded decisions as one server's
rollout (`core.rollout.RolloutController`, on a `FleetTarget` instead of one server's windows).

- The weights are where the replicas read theirs: the endpoints file they serve (`--endpoints`, a
  local path or an fsspec URL such as s3://), which each reads every `--repository-poll-secs`; or
  the state directory they share (`--state-dir` on shared storage), whose endpoints document each
  follows as often. The controller rewrites it at each step.
- The figures come from `server.fleet_metrics` (Prometheus, or the replicas' own /metrics).
- The rollout is kept in the controller's `--state-dir` (`fleet-rollouts.json`, apart from a
  server's own rollouts) after each decision: a controller killed mid-bake and started again with
  the same command resumes the step (the time already baked counts), so traffic is never left
  split with nobody judging. A controller asked to stop (Ctrl-C, SIGTERM) rolls back first, for
  the same reason. Servers sharing that directory refuse to change the endpoint meanwhile.

One controller per endpoint: nothing elects one, so run one (the docs say where).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from inferd.core.endpoint_control import COMMAND_CONTROLLER, FLEET_ROLLOUTS_NAME, STATE_NAME
from inferd.core.endpoints import EndpointSpec, specs_of, with_spec
from inferd.core.request_window import WindowSummary
from inferd.core.rollout import Decision, FleetFigures, Guards, Rollout, RolloutController
from inferd.core.state_dir import StateDir
from inferd.errors import InvalidRequestError
from inferd.server.endpoint_file import read_endpoint_file, write_endpoint_weights


class WeightStore(Protocol):
    """Where a fleet's replicas read their endpoints' weights."""

    def describe(self) -> str: ...

    def spec(self, endpoint: str) -> EndpointSpec: ...

    def write(self, endpoint: str, weights: dict[str, float]) -> None: ...


class FileWeights:
    """The endpoints file the replicas serve (`inferd serve --endpoints FILE`)."""

    def __init__(self, location: str) -> None:
        self.location = location

    def describe(self) -> str:
        return self.location

    def spec(self, endpoint: str) -> EndpointSpec:
        return _named(read_endpoint_file(self.location), endpoint, f"--endpoints {self.location} declares")

    def write(self, endpoint: str, weights: dict[str, float]) -> None:
        write_endpoint_weights(self.location, endpoint, weights)


class StateDirWeights:
    """The state directory the replicas share (`inferd serve --state-dir DIR`): its endpoints
    document, which every replica follows."""

    def __init__(self, state: StateDir) -> None:
        self.state = state

    def describe(self) -> str:
        return f"{self.state.path / STATE_NAME}.json"

    def spec(self, endpoint: str) -> EndpointSpec:
        return _named(specs_of(self.state.read(STATE_NAME)), endpoint, f"the state directory {self.state.path} keeps")

    def write(self, endpoint: str, weights: dict[str, float]) -> None:
        def change(kept: Any) -> dict[str, Any]:  # under the directory's lock: replicas write it too
            spec = _named(specs_of(kept), endpoint, f"the state directory {self.state.path} keeps")
            return with_spec(kept, endpoint, spec.with_weights(weights))

        self.state.update(STATE_NAME, change)


def _named(specs: list[EndpointSpec], endpoint: str, where: str) -> EndpointSpec:
    """The spec of `endpoint` among `specs`, or the error that says `where` has none."""
    for spec in specs:
        if spec.name == endpoint:
            return spec
    raise InvalidRequestError(f"{where} no endpoint '{endpoint}'")


class FleetTarget:
    """What a fleet's rollout acts on (`core.rollout.RolloutTarget`): the replicas' weights, and
    the figures of a metrics source."""

    def __init__(self, weights: WeightStore, metrics: FleetFigures) -> None:
        self.weights = weights
        self.metrics = metrics

    def spec(self, endpoint: str) -> EndpointSpec:
        return self.weights.spec(endpoint)

    async def set_weights(self, endpoint: str, weights: dict[str, float]) -> None:
        await asyncio.to_thread(self.weights.write, endpoint, weights)

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary:
        return await self.metrics.summary(endpoint, variant, window_s)

    async def unpinned_requests(self, endpoint: str, variant: str) -> int:
        return await self.metrics.requests(endpoint, variant)

    def compared_answers(self, endpoint: str, candidate: str, baseline: str) -> tuple[int, int] | None:
        return None  # shadows compare answers on one server; a fleet's are not summed

    def same_servable(self, endpoint: str, candidate: str, baseline: str) -> bool:
        return self.spec(endpoint).same_servable(candidate, baseline)


class FleetRollout:
    """One endpoint's rollout, run by this process until it ends."""

    def __init__(self, target: FleetTarget, state: StateDir, endpoint: str) -> None:
        self.target = target
        self.endpoint = endpoint
        self._state = state
        kept = (state.read(FLEET_ROLLOUTS_NAME) or {}).get("rollouts", [])
        self._mine = [document for document in kept if document.get("endpoint") == endpoint]
        self.controller = RolloutController(target, self._keep)

    def running_document(self) -> dict[str, Any] | None:
        """The endpoint's rollout the state directory keeps as running (its controller stopped
        without ending it), if any. One a server runs (--rollout-controller) is that server's."""
        running = next((d for d in self._mine if Rollout.is_active(d)), None)
        if running is not None and running.get("server") and running.get("controller") != COMMAND_CONTROLLER:
            raise InvalidRequestError(
                f"endpoint '{self.endpoint}' is being rolled out by the server {running.get('server', '')} "
                "(--rollout-controller): follow it, promote or abort it through that server's API"
            )
        return running

    async def begin(self, candidate: str, strategy: str, bake_s: float, guards: Guards) -> tuple[Rollout, bool]:
        """Resume the endpoint's running rollout if one is kept (it must be to `candidate`), else
        start one. The rollout, and whether it resumed."""
        running = self.running_document()
        if running is not None:
            if running["candidate"] != candidate:
                raise InvalidRequestError(
                    f"endpoint '{self.endpoint}' has a rollout to '{running['candidate']}' whose controller stopped "
                    f"mid-way: start the controller with --to {running['candidate']} to take it up"
                )
            await self.controller.restore(self._mine)
            rollout = self.controller.current(self.endpoint)
            assert rollout is not None
            return rollout, True
        await self.controller.restore(self._mine)  # the ended ones: its history
        spec = self.target.spec(self.endpoint)
        spec.variant(candidate)
        baseline = spec.rollout_baseline(candidate)
        weights = {v.name: v.weight for v in spec.variants}
        rollout = await self.controller.start(
            self.endpoint, candidate, baseline.name, weights, strategy, bake_s, guards
        )
        return rollout, False

    async def follow(self, stop: asyncio.Event, on_decision: Callable[[Decision], None]) -> Rollout:
        """Wait for the rollout to end, telling each decision as it is made; when `stop` is set
        first, roll back (abort) and end."""
        told = 0
        while True:
            rollout = self.controller.current(self.endpoint)
            assert rollout is not None
            for decision in rollout.decisions[told:]:
                on_decision(decision)
            told = len(rollout.decisions)
            if not self.controller.is_running(self.endpoint):
                await self.controller.close()
                return rollout
            if stop.is_set():
                with contextlib.suppress(InvalidRequestError):  # it ended meanwhile, as its last tick decided
                    await self.controller.abort(self.endpoint)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.25)

    def _keep(self, documents: list[dict[str, Any]]) -> None:
        """This endpoint's rollouts; other endpoints' (other controllers') as they are now, under
        the directory's lock."""

        def change(kept: Any) -> dict[str, Any]:
            others = [d for d in (kept or {}).get("rollouts", []) if d.get("endpoint") != self.endpoint]
            return {"rollouts": [*others, *({**d, "controller": COMMAND_CONTROLLER} for d in documents)]}

        self._state.update(FLEET_ROLLOUTS_NAME, change)

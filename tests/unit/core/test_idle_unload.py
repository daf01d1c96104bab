"""Scale to zero's rule, with an injected clock: a model is idle once its requests stopped coming
and none is inside it for its limit; a sweep unloads it only when the record, read again under the
model's lock, shows no use since; an async backlog keeps a model; limits come from the config."""

from __future__ import annotations

import asyncio
from types import MappingProxyType

import pytest

from inferd.config.model import EnsembleConfig, EnsembleStep, ModelConfig, SequenceBatchingConfig
from inferd.core.catalogue import ModelRecord, ModelState, Snapshot, VersionRecord
from inferd.core.handle import Handle
from inferd.core.idle_unload import IdleClock, IdleUnloader, Use, arrivals_of, idle_limit_s, with_steps


def use(arrivals: int, *, busy: bool = False, limit_s: float = 10.0) -> Use:
    return Use(((1, arrivals),), busy, limit_s)


def test_a_model_is_idle_once_nothing_came_for_its_limit() -> None:
    clock = IdleClock()
    assert clock.idle(0.0, {"m": use(0)}) == []  # first seen: just loaded, in use now
    assert clock.idle(9.9, {"m": use(0)}) == []
    assert clock.idle(10.0, {"m": use(0)}) == ["m"]


def test_a_new_arrival_starts_the_idle_time_again() -> None:
    clock = IdleClock()
    clock.idle(0.0, {"m": use(0)})
    assert clock.idle(8.0, {"m": use(1)}) == []  # a request came between the sweeps
    assert clock.idle(17.9, {"m": use(1)}) == []
    assert clock.idle(18.0, {"m": use(1)}) == ["m"]


def test_a_busy_model_is_never_idle_however_long_ago_its_request_came() -> None:
    clock = IdleClock()
    clock.idle(0.0, {"m": use(1)})
    for now in (10.0, 100.0, 1000.0):  # one long request inside (or async jobs waiting)
        assert clock.idle(now, {"m": use(1, busy=True)}) == []
    assert clock.idle(1009.0, {"m": use(1)}) == []
    assert clock.idle(1010.0, {"m": use(1)}) == ["m"]


def test_each_model_has_its_own_limit_and_a_gone_model_is_forgotten() -> None:
    clock = IdleClock()
    clock.idle(0.0, {"short": use(0, limit_s=1), "long": use(0, limit_s=5)})
    assert clock.idle(2.0, {"short": use(0, limit_s=1), "long": use(0, limit_s=5)}) == ["short"]
    assert clock.idle(3.0, {"long": use(0, limit_s=5)}) == []  # short unloaded
    assert clock.idle(4.0, {"short": use(0, limit_s=1), "long": use(0, limit_s=5)}) == []  # loaded again: new
    assert clock.idle(5.0, {"short": use(0, limit_s=1), "long": use(0, limit_s=5)}) == ["short", "long"]


def config(**parameters: str) -> ModelConfig:
    return ModelConfig(name="m", parameters=parameters)


def test_the_limit_is_the_model_s_parameter_over_the_server_s_default() -> None:
    assert idle_limit_s(config(), None) is None  # off unless asked
    assert idle_limit_s(config(), 30.0) == 30.0
    assert idle_limit_s(config(idle_unload_seconds="2.5"), None) == 2.5
    assert idle_limit_s(config(idle_unload_seconds="2.5"), 30.0) == 2.5
    assert idle_limit_s(config(idle_unload_seconds="0"), 30.0) is None  # 0: never
    sequences = ModelConfig(name="m", parameters={"idle_unload_seconds": "1"},
                            sequence_batching=SequenceBatchingConfig(max_idle_us=5_000_000))  # fmt: skip
    assert idle_limit_s(sequences, None) == 6.0  # its sequences idle 5 s, and a sweep more


def record(name: str, handle: Handle) -> ModelRecord:
    versions = {1: VersionRecord(1, ModelState.READY, handle=handle, config=handle.config)}
    return ModelRecord(name, ModelState.READY, versions=MappingProxyType(versions))


class Fakes:
    """A catalogue of one model, the clock, and the unloads the sweep asked for."""

    def __init__(self, parameters: dict[str, str], backlog: list[str] | None = None) -> None:
        self.now = 0.0
        self.handle = Handle(ModelConfig(name="m", parameters=parameters), 1)
        self.unloaded: list[str] = []
        # What the record looks like when the unload takes the model's lock.
        self.under_lock: ModelRecord | None = None
        self.unloader = IdleUnloader(
            lambda: Snapshot.of({"m": record("m", self.handle)}),
            self.scale_to_zero,
            None,
            lambda: backlog or [],
            lambda: self.now,
        )

    async def scale_to_zero(self, name: str, still_idle: object) -> bool:
        assert callable(still_idle)
        if not still_idle(self.under_lock or record(name, self.handle)):
            return False
        self.unloaded.append(name)
        return True

    def sweep_at(self, now: float) -> list[str]:
        self.now = now
        return asyncio.run(self.unloader.sweep())


def test_a_sweep_unloads_an_idle_model_and_sweeps_a_quarter_of_its_limit_apart() -> None:
    fakes = Fakes({"idle_unload_seconds": "2"})
    assert fakes.sweep_at(0.0) == []
    assert fakes.unloader.tick_s == 0.5
    fakes.handle.enter()
    fakes.handle.leave()
    assert fakes.sweep_at(1.0) == []
    assert fakes.sweep_at(3.0) == ["m"] and fakes.unloaded == ["m"]


def test_a_request_that_came_after_the_sweep_keeps_the_model() -> None:
    fakes = Fakes({"idle_unload_seconds": "2"})
    fakes.sweep_at(0.0)
    fresh = Handle(fakes.handle.config, 1)  # the lock's record: a request came in between
    fresh.enter()
    fakes.under_lock = record("m", fresh)
    assert fakes.sweep_at(5.0) == [] and fakes.unloaded == []
    fakes.under_lock = None
    assert fakes.sweep_at(5.5) == ["m"]  # nothing new since: the next sweep unloads it


def test_async_jobs_waiting_for_a_model_keep_it() -> None:
    fakes = Fakes({"idle_unload_seconds": "2"}, backlog=["m"])
    for now in (0.0, 5.0, 50.0):
        assert fakes.sweep_at(now) == []


def test_models_without_a_limit_are_not_watched() -> None:
    fakes = Fakes({})
    assert fakes.unloader.uses() == {}
    assert fakes.sweep_at(1000.0) == []


@pytest.mark.parametrize("arrivals", [0, 3])
def test_arrivals_name_each_handle(arrivals: int) -> None:
    handle = Handle(ModelConfig(name="m"), 1)
    handle.arrivals = arrivals
    assert arrivals_of(record("m", handle)) == ((handle.serial, arrivals),)


def test_an_ensemble_s_async_jobs_keep_its_step_models_nested_ones_too() -> None:
    def ensemble(name: str, *steps: str) -> ModelRecord:
        config = ModelConfig(name=name, ensemble=EnsembleConfig(tuple(EnsembleStep(step) for step in steps)))
        return record(name, Handle(config, 1))

    models = {
        "outer": ensemble("outer", "inner", "a"),
        "inner": ensemble("inner", "b"),
        "c": record("c", Handle(ModelConfig(name="c"), 1)),
    }
    assert with_steps(["outer"], models) == {"outer", "inner", "a", "b"}
    assert with_steps(["c"], models) == {"c"}

"""How models come and go, on Python models (in-process, no sleeps): a load publishes what serves;
a hot swap routes new requests to the new version at once while a request inside the old one
finishes there, then the old one closes; files that did not change keep their handle; a reload
that fails leaves the old version serving; an unload stops routing before it drains; a model
loaded on a request's demand evicts the least recently used; ensembles that need each other are
a load error. Requests are held inside a version by a file its model waits on (bounded)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from inferd.config.loader import parse_model_config
from inferd.config.scale_to_zero import ScaleToZeroDefaults
from inferd.core.budget import LoadBudget
from inferd.core.catalogue import EVICTED, SCALED_TO_ZERO, UNLOADED, ModelState
from inferd.core.handle import HandleState
from inferd.core.registry import ModelRegistry
from inferd.core.repository import LocalRepository
from inferd.errors import ModelLoadError, ModelNotReadyError, ModelTooLargeError
from inferd.testing.models import python_model, write_config
from inferd.types import DataType, InferRequest, InferResponse, RequestContext, Tensor
from tests.unit.core.test_batcher import until

# y = FACTOR * x, after waiting (at most 30 s) while the file HOLD exists.
MODEL = """
import os
import time


class Model:
    inputs = [{{"name": "x", "datatype": "FP32", "shape": [-1]}}]
    outputs = [{{"name": "y", "datatype": "FP32", "shape": [-1]}}]

    def execute(self, inputs):
        deadline = time.monotonic() + 30
        while os.path.exists({hold!r}) and time.monotonic() < deadline:
            time.sleep(0.002)
        return {{"y": inputs["x"] * {factor}}}
"""


def model(root: Path, name: str, factor: int) -> Path:
    """Model `name` multiplying by `factor`; returns the file that holds its requests while it exists."""
    hold = root.parent / f"hold-{name}-{factor}"
    python_model(root / name / "1", MODEL.format(hold=str(hold), factor=factor))
    write_config(root / name, 'backend: "python"')
    return hold


def request(name: str) -> InferRequest:
    x = np.array([1.0, 2.0], dtype=np.float32)
    return InferRequest(name, "", (Tensor("x", DataType.FP32, x.shape, x),))


def answer(response: InferResponse) -> list[float]:
    return [float(v) for v in response.outputs[0].data]


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[ModelRegistry]:
    registry = ModelRegistry(LocalRepository(tmp_path / "models"))
    yield registry
    await registry.close()


async def test_a_load_publishes_every_ready_version_and_the_default(tmp_path: Path, registry: ModelRegistry) -> None:
    model(tmp_path / "models", "m", 2)
    await registry.load("m")
    record = registry.record("m")
    assert record.state is ModelState.READY and record.ready_versions() == [1]
    assert registry.snapshot.serving[("m", "1")] is registry.snapshot.serving[("m", "")]
    assert answer(await registry.dispatcher.infer(request("m"))) == [2.0, 4.0]


async def test_a_hot_swap_routes_new_requests_at_once_and_drains_the_old_version(
    tmp_path: Path, registry: ModelRegistry
) -> None:
    hold = model(tmp_path / "models", "m", 2)
    await registry.load("m")
    old = registry.snapshot.serving[("m", "")]
    hold.touch()
    inside = asyncio.ensure_future(registry.dispatcher.infer(request("m")))
    await until(lambda: old.in_flight == 1)
    model(tmp_path / "models", "m", 30)  # new files (another size): the version loads again beside the old one
    await registry.load("m")
    new = registry.snapshot.serving[("m", "")]
    assert new is not old
    await until(lambda: old.state is HandleState.DRAINING)  # drained in the background
    assert answer(await registry.dispatcher.infer(request("m"))) == [30.0, 60.0]
    hold.unlink()
    assert answer(await inside) == [2.0, 4.0]  # answered by the version it entered
    await until(lambda: old.state is HandleState.CLOSED)


async def test_unchanged_files_keep_their_handle(tmp_path: Path, registry: ModelRegistry) -> None:
    model(tmp_path / "models", "m", 2)
    await registry.load("m")
    serving = registry.snapshot.serving[("m", "")]
    await registry.load("m")
    assert registry.snapshot.serving[("m", "")] is serving and serving.state is HandleState.READY


async def test_a_reload_that_fails_leaves_the_old_version_serving(tmp_path: Path, registry: ModelRegistry) -> None:
    model(tmp_path / "models", "m", 2)
    await registry.load("m")
    serving = registry.snapshot.serving[("m", "")]
    (tmp_path / "models" / "m" / "1" / "model.py").write_text("this is not python\n")
    with pytest.raises(ModelLoadError):
        await registry.load("m")
    assert registry.snapshot.serving[("m", "")] is serving
    assert registry.version_record("m", "1").reason.startswith("reloading failed")
    assert answer(await registry.dispatcher.infer(request("m"))) == [2.0, 4.0]


async def test_an_unload_stops_routing_first_and_answers_the_requests_inside(
    tmp_path: Path, registry: ModelRegistry
) -> None:
    hold = model(tmp_path / "models", "m", 2)
    await registry.load("m")
    handle = registry.snapshot.serving[("m", "")]
    hold.touch()
    inside = asyncio.ensure_future(registry.dispatcher.infer(request("m")))
    await until(lambda: handle.in_flight == 1)
    unloading = asyncio.ensure_future(registry.unload("m"))
    await until(lambda: handle.state is HandleState.DRAINING)
    assert registry.dispatcher.lookup("m", "") is None
    assert registry.record("m").state is ModelState.UNLOADING
    hold.unlink()
    assert answer(await inside) == [2.0, 4.0]
    await unloading
    assert handle.state is HandleState.CLOSED and registry.record("m").reason == UNLOADED
    with pytest.raises(ModelNotReadyError, match="unloaded"):
        await registry.dispatcher.lease("m", "")


async def test_a_model_loaded_on_demand_evicts_the_least_recently_used(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        model(tmp_path / "models", name, 2)
    registry = ModelRegistry(LocalRepository(tmp_path / "models"), budget=LoadBudget(max_models=2))
    try:
        for name in ("a", "b"):
            await registry.dispatcher.lease(name, "")
        assert registry.dispatcher.lookup("a", "") is not None  # a used last: b is the least recent
        await registry.dispatcher.lease("c", "")
        assert {r.name for r in registry.records() if r.ready_versions()} == {"a", "c"}
        assert registry.record("b").reason == EVICTED
    finally:
        await registry.close()


async def test_ensembles_that_need_each_other_are_a_load_error(tmp_path: Path, registry: ModelRegistry) -> None:
    for name, other in (("e1", "e2"), ("e2", "e1")):
        write_config(
            tmp_path / "models" / name,
            f"""
            platform: "ensemble"
            input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }} ]
            output [ {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
            ensemble_scheduling {{ step [ {{ model_name: "{other}"
              input_map {{ key: "x" value: "x" }} output_map {{ key: "y" value: "y" }} }} ] }}
            """,
        )
    with pytest.raises(ModelLoadError, match="cycle: e1 → e2 → e1"):
        await registry.load("e1")


# y = 3 * x; its load waits (at most 30 s) while the file LOAD_HOLD exists.
SLOW_TO_LOAD = """
import os
import time


class Model:
    inputs = [{{"name": "x", "datatype": "FP32", "shape": [-1]}}]
    outputs = [{{"name": "y", "datatype": "FP32", "shape": [-1]}}]

    def initialize(self, args):
        deadline = time.monotonic() + 30
        while os.path.exists({hold!r}) and time.monotonic() < deadline:
            time.sleep(0.002)

    def execute(self, inputs):
        return {{"y": inputs["x"] * 3}}
"""


async def test_a_cold_start_holds_at_most_max_held_requests_round_after_round(tmp_path: Path) -> None:
    """Requests waiting for a model's cold start are counted in and out whatever order they
    finish in: each round admits max_held of them again, and refuses the next with Retry-After."""
    hold = tmp_path / "load-hold"
    python_model(tmp_path / "models" / "m" / "1", SLOW_TO_LOAD.format(hold=str(hold)))
    write_config(tmp_path / "models" / "m", 'backend: "python"')
    registry = ModelRegistry(LocalRepository(tmp_path / "models"), scale_to_zero=ScaleToZeroDefaults(None, 3))
    try:
        await registry.load("m")
        for _ in range(2):
            assert await registry._lifecycle.scale_to_zero("m", lambda record: True)
            assert registry.record("m").reason == SCALED_TO_ZERO
            hold.touch()
            waiting = [asyncio.ensure_future(registry.dispatcher.infer(request("m"))) for _ in range(3)]
            await until(lambda: registry.record("m").state is ModelState.LOADING)
            with pytest.raises(ModelNotReadyError) as refused:
                await registry.dispatcher.infer(request("m"))
            assert "is starting" in refused.value.message and refused.value.retry_after_s is not None
            hold.unlink()
            for answered in await asyncio.gather(*waiting):
                assert answer(answered) == [3.0, 6.0]
    finally:
        hold.unlink(missing_ok=True)
        await registry.close()


async def test_a_model_scaled_to_zero_is_left_there_by_a_poll(tmp_path: Path, registry: ModelRegistry) -> None:
    model(tmp_path / "models", "m", 2)
    await registry.load("m")
    assert await registry._lifecycle.scale_to_zero("m", lambda record: True)
    await registry.poll()
    assert registry.record("m").reason == SCALED_TO_ZERO and not registry.record("m").versions
    assert answer(await registry.dispatcher.infer(request("m"))) == [2.0, 4.0]  # its next request loads it
    assert registry.record("m").state is ModelState.READY


# y = factor * x (the `factor` parameter, 1 without it); its load fails while the file FAIL
# exists; its finalize (on unload) waits, at most 30 s, while the file HOLD exists.
RESTING = """
import os
import time


class Model:
    inputs = [{{"name": "x", "datatype": "FP32", "shape": [-1]}}]
    outputs = [{{"name": "y", "datatype": "FP32", "shape": [-1]}}]

    def initialize(self, args):
        if os.path.exists({fail!r}):
            raise RuntimeError("this load fails by construction")
        self.factor = float(args["parameters"].get("factor", "1"))

    def finalize(self):
        deadline = time.monotonic() + 30
        while os.path.exists({hold!r}) and time.monotonic() < deadline:
            time.sleep(0.002)

    def execute(self, inputs):
        return {{"y": inputs["x"] * self.factor}}
"""


def resting_model(tmp_path: Path) -> tuple[Path, Path]:
    """Model `m` of RESTING, loaded with a config override of factor 5; (its fail file, its hold file)."""
    fail, hold = tmp_path / "fail", tmp_path / "hold"
    python_model(tmp_path / "models" / "m" / "1", RESTING.format(fail=str(fail), hold=str(hold)))
    write_config(tmp_path / "models" / "m", 'backend: "python"')
    return fail, hold


FACTOR_5 = 'backend: "python" parameters { key: "factor" value { string_value: "5" } }'


async def test_a_failed_cold_start_is_one_load_for_its_waiters_and_the_next_request_loads_it_as_it_was(
    tmp_path: Path, registry: ModelRegistry
) -> None:
    fail, _ = resting_model(tmp_path)
    await registry.load("m", config=parse_model_config(FACTOR_5, model_name="m"))
    assert answer(await registry.dispatcher.infer(request("m"))) == [5.0, 10.0]
    assert await registry._lifecycle.scale_to_zero("m", lambda record: True)
    fail.touch()
    failures = registry.metrics.loads["failure"]  # type: ignore[attr-defined]
    results = await asyncio.gather(*(registry.dispatcher.infer(request("m")) for _ in range(5)), return_exceptions=True)
    assert all(isinstance(result, ModelNotReadyError) for result in results), results
    assert "fails by construction" in str(results[0])
    assert registry.metrics.loads["failure"] == failures + 1  # type: ignore[attr-defined]
    assert not registry.all_ready()  # (strict readiness) as any model that failed to load
    fail.unlink()
    assert answer(await registry.dispatcher.infer(request("m"))) == [5.0, 10.0]  # with its override


async def test_a_request_during_the_unload_that_scales_to_zero_waits_and_loads_it_again(
    tmp_path: Path, registry: ModelRegistry
) -> None:
    _, hold = resting_model(tmp_path)
    await registry.load("m")
    hold.touch()
    try:
        unloading = asyncio.ensure_future(registry._lifecycle.scale_to_zero("m", lambda record: True))
        await until(lambda: registry.record("m").state is ModelState.UNLOADING)
        arriving = asyncio.ensure_future(registry.dispatcher.infer(request("m")))
        await asyncio.sleep(0.05)
        assert not arriving.done()  # waits for the unload, then for its own load
    finally:
        hold.unlink(missing_ok=True)
    assert await unloading
    assert answer(await arriving) == [1.0, 2.0]


async def test_an_ensemble_is_ready_while_its_step_model_is_scaled_to_zero(
    tmp_path: Path, registry: ModelRegistry
) -> None:
    model(tmp_path / "models", "step", 2)
    write_config(
        tmp_path / "models" / "twice",
        """
        platform: "ensemble"
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
        ensemble_scheduling { step [ { model_name: "step"
          input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }
        """,
    )
    await registry.load("twice")
    assert await registry._lifecycle.scale_to_zero("step", lambda record: True)
    registry.dispatcher.ready_handle("twice", "")  # ready: its step's request loads the step
    assert answer(await registry.dispatcher.infer(request("twice"))) == [2.0, 4.0]
    assert registry.record("step").state is ModelState.READY


async def test_waiters_of_one_failed_on_demand_load_each_get_their_own_error(tmp_path: Path) -> None:
    """The shared load's error is copied for each waiter: each answer carries its own request id."""
    model(tmp_path / "models", "a", 1)
    model(tmp_path / "models", "b", 2)
    registry = ModelRegistry(
        LocalRepository(tmp_path / "models"), budget=LoadBudget(max_models=1, pinned=frozenset("a"))
    )
    try:
        await registry.load("a")
        requests = [replace(request("b"), context=RequestContext(request_id=f"r{i}")) for i in range(2)]
        errors = await asyncio.gather(*(registry.dispatcher.infer(r) for r in requests), return_exceptions=True)
        assert all(isinstance(error, ModelTooLargeError) for error in errors), errors
        assert errors[0] is not errors[1]
        assert [error.request_id for error in errors] == ["r0", "r1"]  # type: ignore[union-attr]
    finally:
        await registry.close()


async def test_an_ensemble_loaded_again_brings_its_step_back_from_zero_as_it_was(
    tmp_path: Path, registry: ModelRegistry
) -> None:
    resting_model(tmp_path)
    write_config(
        tmp_path / "models" / "fives",
        """
        platform: "ensemble"
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
        ensemble_scheduling { step [ { model_name: "m"
          input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }
        """,
    )
    await registry.load("m", config=parse_model_config(FACTOR_5, model_name="m"))
    await registry.load("fives")
    assert await registry._lifecycle.scale_to_zero("m", lambda record: True)
    await registry.load("fives")  # loads its step: with the step's override, not the repository's config
    assert registry.record("m").state is ModelState.READY
    assert answer(await registry.dispatcher.infer(request("fives"))) == [5.0, 10.0]


SENT = """
class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1]}]

    def execute(self, inputs):
        return {"y": inputs["x"] * 7}
"""


async def test_files_a_failed_reload_sent_do_not_replace_those_the_serving_version_came_back_from(
    tmp_path: Path, registry: ModelRegistry
) -> None:
    config = parse_model_config('backend: "python"', model_name="sent")
    await registry.load("sent", config=config, files={"1/model.py": SENT.encode()})
    with pytest.raises(ModelLoadError):
        await registry.load("sent", config=config, files={"1/model.py": b"raise RuntimeError('broken')\n"})
    assert answer(await registry.dispatcher.infer(request("sent"))) == [7.0, 14.0]  # the old version serves on
    assert await registry._lifecycle.scale_to_zero("sent", lambda record: True)
    assert answer(await registry.dispatcher.infer(request("sent"))) == [7.0, 14.0]  # back from its own files


async def test_an_explicit_load_ends_a_rest_whatever_comes_of_it(tmp_path: Path, registry: ModelRegistry) -> None:
    config = parse_model_config('backend: "python"', model_name="sent")
    await registry.load("sent", config=config, files={"1/model.py": SENT.encode()})
    assert await registry._lifecycle.scale_to_zero("sent", lambda record: True)
    with pytest.raises(ModelLoadError):
        await registry.load("sent", config=config, files={"1/model.py": b"raise RuntimeError('broken')\n"})
    assert not registry._lifecycle.at_rest("sent")
    with pytest.raises(ModelNotReadyError, match="broken"):  # its failure, not a load from a folder gone
        await registry.dispatcher.infer(request("sent"))

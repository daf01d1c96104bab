"""The memory budget: the victim choice alone (pure: least recently used first, as few as make
room, never a model that is busy, pinned or changing, loads under way counted), and the eviction
loop that asks it again after each eviction."""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

import pytest

from inferd.config.model import ModelConfig
from inferd.core.budget import LoadBudget, MemoryBudget, Resident, choose_victims
from inferd.core.catalogue import ModelRecord, ModelState, VersionRecord
from inferd.core.handle import Handle
from inferd.errors import ModelTooLargeError

MIB = 1 << 20


def resident(name: str, mib: int, last_used: int, *, evictable: bool = True) -> Resident:
    return Resident(name, mib * MIB, last_used, evictable)


def test_nothing_is_evicted_while_the_load_fits() -> None:
    room = choose_victims([resident("a", 40, 1)], 50 * MIB, LoadBudget(memory_bytes=100 * MIB), new_model=True)
    assert room.victims == () and room.fits


def test_the_least_recently_used_go_first_and_no_more_than_make_room() -> None:
    loaded = [resident("new", 30, 9), resident("old", 30, 1), resident("mid", 30, 5)]
    room = choose_victims(loaded, 40 * MIB, LoadBudget(memory_bytes=100 * MIB), new_model=True)
    assert room.victims == ("old",) and room.fits
    room = choose_victims(loaded, 70 * MIB, LoadBudget(memory_bytes=100 * MIB), new_model=True)
    assert room.victims == ("old", "mid") and room.fits


def test_busy_pinned_or_changing_models_are_never_chosen() -> None:
    loaded = [resident("busy", 30, 1, evictable=False), resident("idle", 30, 5)]
    room = choose_victims(loaded, 50 * MIB, LoadBudget(memory_bytes=100 * MIB), new_model=True)
    assert room.victims == ("idle",) and room.fits


def test_when_evicting_every_idle_model_is_not_enough_it_does_not_fit() -> None:
    loaded = [resident("busy", 60, 1, evictable=False), resident("idle", 20, 5)]
    room = choose_victims(loaded, 50 * MIB, LoadBudget(memory_bytes=100 * MIB), new_model=True)
    assert room.victims == ("idle",) and not room.fits
    room = choose_victims(loaded[:1], 50 * MIB, LoadBudget(memory_bytes=100 * MIB), new_model=True)
    assert room.victims == () and not room.fits and room.used_bytes == 60 * MIB


def test_the_count_limit_counts_the_new_model_and_loads_under_way() -> None:
    loaded = [resident("a", 1, 2), resident("b", 1, 1)]
    limit = LoadBudget(max_models=3)
    assert choose_victims(loaded, 0, limit, new_model=True).victims == ()
    assert choose_victims(loaded, 0, limit, new_model=True, reserved_models=1).victims == ("b",)
    assert choose_victims(loaded, 0, limit, new_model=False, reserved_models=1).victims == ()  # a reload


def test_reserved_bytes_of_loads_under_way_count_against_the_memory() -> None:
    loaded = [resident("a", 30, 1)]
    room = choose_victims(loaded, 40 * MIB, LoadBudget(memory_bytes=100 * MIB), new_model=True, reserved_bytes=40 * MIB)
    assert room.victims == ("a",) and room.fits


class Models:
    """Loaded models (one version each) that eviction removes, as the lifecycle would."""

    def __init__(self, **mib: int) -> None:
        self.records = {
            name: ModelRecord(
                name,
                ModelState.READY,
                versions=MappingProxyType(
                    {
                        1: VersionRecord(
                            1, ModelState.READY, handle=Handle(ModelConfig(name=name), 1), memory_bytes=size * MIB
                        )
                    }
                ),
            )
            for name, size in mib.items()
        }
        self.evicted: list[str] = []

    def __call__(self) -> Iterable[ModelRecord]:
        return list(self.records.values())

    async def evict(self, name: str) -> None:
        self.evicted.append(name)
        del self.records[name]


async def test_eviction_follows_use_and_the_load_is_reserved_until_released() -> None:
    budget = MemoryBudget(LoadBudget(memory_bytes=100 * MIB))
    models = Models(a=40, b=40)
    budget.touch("b")
    budget.touch("a")  # b is now the least recently used
    await budget.make_room("c", 50 * MIB, True, models, lambda name: False, models.evict)
    assert models.evicted == ["b"]
    # Until released, c's 50 MiB count: 40 (a) + 50 (c) leaves no room for 20 more without evicting a.
    await budget.make_room("d", 20 * MIB, True, models, lambda name: False, models.evict)
    assert models.evicted == ["b", "a"]
    budget.release(50 * MIB, True)
    budget.release(20 * MIB, True)
    await budget.make_room("e", 90 * MIB, True, models, lambda name: False, models.evict)
    assert models.evicted == ["b", "a"]


async def test_a_model_larger_than_the_budget_or_held_out_by_busy_ones_is_refused() -> None:
    budget = MemoryBudget(LoadBudget(memory_bytes=100 * MIB, pinned=frozenset({"p"})))
    models = Models(p=60)
    with pytest.raises(ModelTooLargeError, match=r"needs about 101.0 MiB \(estimated\) but the model memory budget"):
        await budget.make_room("big", 101 * MIB, True, models, lambda name: False, models.evict)
    with pytest.raises(ModelTooLargeError, match="held by models that are pinned or serving requests now"):
        await budget.make_room("c", 50 * MIB, True, models, lambda name: False, models.evict)
    assert models.evicted == []

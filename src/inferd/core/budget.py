"""The memory budget of on-demand loading (the multi-model pattern): what may stay loaded, and
which models leave to make room for one a request needs.

Before a load, room is made: while the loaded models' estimated memory plus the new one's would
pass the budget (or their count the maximum), the least recently used model that is idle (nothing
in flight or queued), not pinned and not changing is evicted. A model that cannot fit even then is
refused (ModelTooLargeError, 507) rather than pushing the process out of memory. Estimates come
from each runtime's rule (`runtimes.estimate_memory_bytes`): RSS deltas cannot be read while loads
run concurrently.

`choose_victims` is the policy, pure: the loaded models as `Resident`s in, the names to evict out,
O(n log n) in the loaded models. `MemoryBudget` holds what the policy reads across requests (each
model's last use, the loads under way) and evicts one victim at a time, looking again after each
eviction: the models' states change while one unloads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from inferd.core.catalogue import ModelRecord
from inferd.errors import ModelTooLargeError

logger = logging.getLogger("inferd.registry")


@dataclass(frozen=True, slots=True)
class LoadBudget:
    """Turns on on-demand loading with eviction."""

    memory_bytes: int | None = None
    """Estimated memory of the loaded models at most."""
    max_models: int | None = None
    """Loaded models at most."""
    pinned: frozenset[str] = frozenset()
    """Models never evicted (the ones loaded at startup with --load-model)."""


@dataclass(frozen=True, slots=True)
class Resident:
    """A loaded model as the victim choice sees it."""

    name: str
    memory_bytes: int
    # The tick of its last use (0: never used since it loaded).
    last_used: int
    # Idle, not pinned and not loading or unloading.
    evictable: bool


@dataclass(frozen=True, slots=True)
class Room:
    """What `choose_victims` found."""

    # Least recently used first: evicted, they make room (or, when `fits` is False, all there is).
    victims: tuple[str, ...]
    # Whether the new load fits once the victims are gone.
    fits: bool
    # Bytes and models held now (loads under way and, for `models`, the new model included).
    used_bytes: int
    models: int


def choose_victims(
    resident: Sequence[Resident],
    need_bytes: int,
    budget: LoadBudget,
    *,
    new_model: bool,
    reserved_bytes: int = 0,
    reserved_models: int = 0,
) -> Room:
    """The fewest least recently used evictable models whose eviction lets `need_bytes` more (and,
    for a `new_model`, one more model) fit the budget, next to `reserved_*` of loads under way.
    No victims and `fits`: it fits now. When evicting every evictable model is not enough, they
    are all named and `fits` is False."""
    used = sum(r.memory_bytes for r in resident) + reserved_bytes
    count = len(resident) + reserved_models + int(new_model)
    left_bytes, left_models = used, count
    victims: list[str] = []
    candidates = sorted((r for r in resident if r.evictable), key=lambda r: r.last_used)
    for candidate in (None, *candidates):
        if candidate is not None:
            victims.append(candidate.name)
            left_bytes -= candidate.memory_bytes
            left_models -= 1
        fits_memory = budget.memory_bytes is None or left_bytes + need_bytes <= budget.memory_bytes
        fits_count = budget.max_models is None or left_models <= budget.max_models
        if fits_memory and fits_count:
            return Room(tuple(victims), True, used, count)
    return Room(tuple(victims), False, used, count)


class MemoryBudget:
    """The budget's state on the event loop: each model's last use and the loads under way."""

    def __init__(self, limits: LoadBudget) -> None:
        self.limits = limits
        # Least recently used, for eviction: model -> the tick of its last use.
        self._last_used: dict[str, int] = {}
        self._tick = 0
        self._room = asyncio.Lock()
        # Estimated bytes of loads under way, counted against the budget until they finish.
        self._reserved_bytes = 0
        self._reserved_models = 0

    def touch(self, name: str) -> None:
        """A request used `name` now."""
        self._tick += 1
        self._last_used[name] = self._tick

    def forget(self, name: str) -> None:
        self._last_used.pop(name, None)

    async def make_room(
        self,
        name: str,
        need_bytes: int,
        new_model: bool,
        models: Callable[[], Iterable[ModelRecord]],
        changing: Callable[[str], bool],
        evict: Callable[[str], Awaitable[None]],
    ) -> None:
        """Evict (`evict`) least recently used idle models of `models()` until `need_bytes` more
        (and, for a model not loaded yet, one more model) fit; then reserve them until `release`.
        `changing`: a model being loaded or unloaded now, never evicted."""
        limits = self.limits
        if limits.memory_bytes is not None and need_bytes > limits.memory_bytes:
            raise ModelTooLargeError(
                f"model '{name}' needs about {_mib(need_bytes)} (estimated) but the model memory budget is "
                f"{_mib(limits.memory_bytes)} (--model-memory-budget)"
            )
        async with self._room:
            while True:
                resident = [
                    Resident(
                        r.name,
                        r.memory_bytes,
                        self._last_used.get(r.name, 0),
                        r.name not in limits.pinned and not r.busy and not changing(r.name),
                    )
                    for r in models()
                    if r.name != name and r.memory_bytes
                ]
                room = choose_victims(
                    resident,
                    need_bytes,
                    limits,
                    new_model=new_model,
                    reserved_bytes=self._reserved_bytes,
                    reserved_models=self._reserved_models,
                )
                if not room.victims:
                    if not room.fits:
                        raise ModelTooLargeError(
                            f"model '{name}' (about {_mib(need_bytes)}, estimated) does not fit: "
                            f"{_mib(room.used_bytes)} of the "
                            f"{_mib(limits.memory_bytes) if limits.memory_bytes else 'unlimited'} model memory "
                            f"budget and {room.models - new_model} of {limits.max_models or 'unlimited'} models are "
                            "held by models that are pinned or serving requests now; retry later"
                        )
                    self._reserved_bytes += need_bytes
                    self._reserved_models += new_model
                    return
                victim = next(r for r in resident if r.name == room.victims[0])
                logger.info(
                    "model %s: evicted (least recently used, %s) to make room for %s",
                    victim.name,
                    _mib(victim.memory_bytes),
                    name,
                    extra={"model": victim.name},
                )
                await evict(victim.name)

    def release(self, need_bytes: int, new_model: bool) -> None:
        """A load that `make_room` reserved for has finished (its model counts as loaded now, or failed)."""
        self._reserved_bytes -= need_bytes
        self._reserved_models -= new_model


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"

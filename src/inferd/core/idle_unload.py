"""Scale to zero: a model that nobody used for its `idle_unload_seconds` is unloaded, and its next
request loads it again (core.lifecycle's `load_on_demand`: a cold start).

Use is read, not recorded: every handle counts the requests that came inside it (`Handle.arrivals`,
one increment on the request path, no clock), and a sweep every `tick_s` compares each loaded
model's counts with what it saw the sweep before. A model is in use at a sweep when its counts
moved, when a request is inside one of its handles (queued, waiting or executing: a long request
keeps its model however long ago it arrived), or when async jobs for it wait in the backlog. It is
idle once it was not in use for its limit; the unload then checks again under the model's lock,
so a request that came in between keeps it.

`IdleClock` is the rule, pure (the loaded models' `Use` in, the idle ones out); `IdleUnloader` runs
it on the event loop against the catalogue."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from inferd.config.model import ModelConfig
from inferd.config.scale_to_zero import idle_unload_seconds
from inferd.core.catalogue import ModelRecord, Snapshot
from inferd.core.ensemble_loading import step_models

logger = logging.getLogger("inferd.registry")

# Seconds between sweeps at most; shorter when a limit is short (a quarter of it), so a model
# unloads within a quarter of its limit after the limit.
MAX_TICK_S = 1.0
MIN_TICK_S = 0.05

# What a model's handles have seen: (the handle's serial, requests that came inside it) per version.
Arrivals = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Use:
    """What one sweep sees of a loaded model."""

    arrivals: Arrivals
    # A request inside one of its handles, or async jobs for it in the backlog.
    busy: bool
    # Seconds of idleness after which it unloads.
    limit_s: float


class IdleClock:
    """When each loaded model was last seen in use, and which have been idle for their limit."""

    def __init__(self) -> None:
        # model -> (its arrivals at the last sweep, when it was last seen in use)
        self._seen: dict[str, tuple[Arrivals, float]] = {}

    def idle(self, now: float, uses: Mapping[str, Use]) -> list[str]:
        """The models of `uses` idle for their limit at `now`. A model seen for the first time counts
        as in use now (it has just loaded); models no longer in `uses` are forgotten."""
        seen: dict[str, tuple[Arrivals, float]] = {}
        idle = []
        for name, use in uses.items():
            before = self._seen.get(name)
            in_use = use.busy or before is None or before[0] != use.arrivals
            since = now if in_use or before is None else before[1]
            seen[name] = (use.arrivals, since)
            if now - since >= use.limit_s:
                idle.append(name)
        self._seen = seen
        return idle

    def still_idle(self, name: str, record: ModelRecord) -> bool:
        """Whether `record` (read again under the model's lock) shows no use since the last sweep."""
        before = self._seen.get(name)
        return before is not None and not record.busy and arrivals_of(record) == before[0]


def arrivals_of(record: ModelRecord) -> Arrivals:
    return tuple(
        (v.handle.serial, v.handle.arrivals) for _, v in sorted(record.versions.items()) if v.handle is not None
    )


def with_steps(names: Iterable[str], models: Mapping[str, ModelRecord]) -> set[str]:
    """`names` and the models their loaded ensembles' steps use, nested ones too: an ensemble's
    async job keeps the models it will run."""
    found = set(names)
    todo = list(found)
    while todo:
        for step in step_models(models.get(todo.pop())):
            if step not in found:
                found.add(step)
                todo.append(step)
    return found


def idle_limit_s(config: ModelConfig, default_s: float | None) -> float | None:
    """The model's idle limit: its parameter over the server's default; None: never unloaded. A
    sequence model waits at least as long as its sequences may idle, and a sweep more (their
    state would be lost: a sequence's idle time counts from its last request's end, a model's from
    the sweep that saw it busy)."""
    limit = idle_unload_seconds(config.parameters, default_s)
    if limit is None or config.ensemble is not None:  # an ensemble holds nothing; its steps scale alone
        return None
    if config.sequence_batching is not None:
        limit = max(limit, config.sequence_batching.max_idle_us / 1e6 + MAX_TICK_S)
    return limit


class IdleUnloader:
    """Sweeps the catalogue every tick and scales the idle models to zero (`scale_to_zero`)."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        scale_to_zero: Callable[[str, Callable[[ModelRecord], bool]], Awaitable[bool]],
        default_s: float | None,
        backlog: Callable[[], Iterable[str]] = tuple,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`snapshot`: the catalogue's current one; `scale_to_zero(name, still_idle)`: unloads the
        model when `still_idle(record)` holds under its lock; `default_s`: --idle-unload-seconds;
        `backlog`: the models async jobs wait for now."""
        self._snapshot = snapshot
        self._scale_to_zero = scale_to_zero
        self._default_s = default_s
        self._backlog = backlog
        self._clock = clock
        self._idle = IdleClock()
        self.tick_s = MAX_TICK_S

    def uses(self) -> dict[str, Use]:
        """The loaded models that have an idle limit, as this sweep sees them."""
        models = self._snapshot().models
        waiting = with_steps(self._backlog(), models)
        uses = {}
        for name, record in models.items():
            if record.reason:  # a reload failed: the version serving now would not come back
                continue
            config = next((v.config for v in record.versions.values() if v.handle is not None and v.config), None)
            limit = idle_limit_s(config, self._default_s) if config is not None else None
            if limit is not None:
                uses[name] = Use(arrivals_of(record), record.busy or name in waiting, limit)
        return uses

    async def sweep(self) -> list[str]:
        """One sweep: the models it scaled to zero."""
        uses = self.uses()
        if uses:
            self.tick_s = max(MIN_TICK_S, min(MAX_TICK_S, min(u.limit_s for u in uses.values()) / 4))
        unloaded = []
        for name in self._idle.idle(self._clock(), uses):
            if await self._scale_to_zero(name, functools.partial(self._idle.still_idle, name)):
                logger.info(
                    "model %s: idle for %g s, scaled to zero (its next request loads it)",
                    name,
                    uses[name].limit_s,
                    extra={"model": name},
                )
                unloaded.append(name)
        return unloaded

    async def run(self) -> None:
        """Sweep until cancelled; an unload that fails is logged, and the model tried again later.
        Cancelled during a sweep, the sweep finishes first (a model left half unloaded would keep
        its sessions open past the server's close)."""
        while True:
            await asyncio.sleep(self.tick_s)
            sweep = asyncio.ensure_future(self.sweep())
            try:
                await asyncio.shield(sweep)
            except asyncio.CancelledError:
                await asyncio.wait({sweep})  # a second cancel does not reach the sweep either
                raise
            except Exception:
                logger.exception("scale to zero: a sweep failed")

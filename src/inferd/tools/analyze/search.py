"""What `inferd analyze` searches over, and how: a point is one model configuration (variant,
max_batch_size, preferred_batch_size, max_queue_delay_microseconds, instance count); the space is
the values of each dimension. `grid` walks every point; `quick` climbs, as Model Analyzer's quick
search does: from the point nearest the model's own configuration it measures the neighbours (one
step along one dimension), moves to the best of them while that improves the objective, and stops
at a local best or when the budget of measured configurations is spent."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Point:
    variant: str
    max_batch_size: int
    preferred_batch_size: tuple[int, ...]
    max_queue_delay_us: int
    instances: int

    def label(self) -> str:
        preferred = f" pref={','.join(map(str, self.preferred_batch_size))}" if self.preferred_batch_size else ""
        batching = "no batching"
        if self.max_batch_size:
            batching = f"mbs={self.max_batch_size}{preferred} delay={self.max_queue_delay_us}us"
        return f"{self.variant} {batching} x{self.instances}"

    def as_dict(self) -> dict[str, object]:
        return {
            "variant": self.variant,
            "max_batch_size": self.max_batch_size,
            "preferred_batch_size": list(self.preferred_batch_size),
            "max_queue_delay_microseconds": self.max_queue_delay_us,
            "instances": self.instances,
        }


@dataclass(frozen=True, slots=True)
class Space:
    variants: tuple[str, ...]
    max_batch_sizes: tuple[int, ...]
    """Empty for a model that does not batch (max_batch_size 0)."""
    queue_delays_us: tuple[int, ...]
    instances: tuple[int, ...]
    preferred: bool = True
    """Also try preferred_batch_size = max_batch_size (a batch runs as soon as it is full)."""

    def _dimensions(self) -> list[Sequence[object]]:
        batching = self.max_batch_sizes or (0,)
        preferred = (False, True) if self.preferred and self.max_batch_sizes else (False,)
        delays = self.queue_delays_us if self.max_batch_sizes else (0,)
        return [self.variants, batching, preferred, delays, self.instances]

    def point(self, indices: Sequence[int]) -> Point:
        variant, batch, preferred, delay, instances = (d[i] for d, i in zip(self._dimensions(), indices, strict=True))
        assert isinstance(variant, str) and isinstance(batch, int) and isinstance(delay, int)
        assert isinstance(instances, int)
        return Point(variant, batch, (batch,) if preferred and batch > 1 else (), delay, instances)

    def size(self) -> int:
        return len({self.point(i) for i in self._all_indices()})

    def _all_indices(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(len(d)) for d in self._dimensions()))

    def nearest(self, point: Point) -> tuple[int, ...]:
        """The indices of the space's point closest to `point` (the model's own configuration)."""
        dims = self._dimensions()
        wanted: list[object] = [point.variant, point.max_batch_size, bool(point.preferred_batch_size),
                                point.max_queue_delay_us, point.instances]  # fmt: skip
        indices = []
        for values, value in zip(dims, wanted, strict=True):
            if value in values:
                indices.append(list(values).index(value))
            elif isinstance(value, int) and all(isinstance(v, int) for v in values):
                indices.append(min(range(len(values)), key=lambda i: abs(int(str(values[i])) - value)))
            else:
                indices.append(0)
        return tuple(indices)

    def neighbours(self, indices: tuple[int, ...]) -> list[tuple[int, ...]]:
        result = []
        for axis, values in enumerate(self._dimensions()):
            for step in (-1, 1):
                moved = indices[axis] + step
                if 0 <= moved < len(values):
                    result.append((*indices[:axis], moved, *indices[axis + 1 :]))
        return result


Measure = Callable[[Point], float | None]
"""Measures a configuration: its objective score (higher is better), None when it is infeasible."""


def grid(space: Space, measure: Measure, budget: int) -> None:
    seen: set[Point] = set()
    for indices in space._all_indices():
        point = space.point(indices)
        if point in seen:
            continue
        if len(seen) >= budget:
            return
        seen.add(point)
        measure(point)


def quick(space: Space, measure: Measure, budget: int, start: Point) -> None:
    scores: dict[Point, float | None] = {}

    def score(indices: tuple[int, ...]) -> float | None:
        point = space.point(indices)
        if point not in scores:
            scores[point] = measure(point)
        return scores[point]

    current = space.nearest(start)
    best = score(current)
    while len(scores) < budget:
        candidates = [n for n in space.neighbours(current) if space.point(n) not in scores]
        if not candidates:
            return
        improved = False
        for neighbour in candidates:
            if len(scores) >= budget:
                return
            value = score(neighbour)
            if value is not None and (best is None or value > best):
                best, current, improved = value, neighbour, True
        if not improved:
            return

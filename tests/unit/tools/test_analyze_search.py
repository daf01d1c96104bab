"""The analyze search strategies against a known landscape: quick search climbs to the best point
within its budget and never measures a point twice; grid walks every distinct point."""

from __future__ import annotations

from inferd.tools.analyze.search import Point, Space, grid, quick

SPACE = Space(variants=("original", "int8"), max_batch_sizes=(1, 4, 8, 16, 32), queue_delays_us=(0, 1000, 5000),
              instances=(1, 2, 3), preferred=True)  # fmt: skip


def landscape(point: Point) -> float:
    """Best at int8, max_batch_size 16, delay 1000, two instances; preferred sizes cost a little."""
    score = 100.0 - abs(point.max_batch_size - 16) - abs(point.max_queue_delay_us - 1000) / 500
    score -= 10 * abs(point.instances - 2) + (0 if point.variant == "int8" else 5)
    return score - (1 if point.preferred_batch_size else 0)


def test_quick_search_climbs_to_the_best_point_within_its_budget() -> None:
    measured: list[Point] = []

    def measure(point: Point) -> float:
        measured.append(point)
        return landscape(point)

    start = Point("original", 4, (), 0, 1)
    quick(SPACE, measure, budget=40, start=start)
    assert measured[0] == start and len(measured) == len(set(measured)) <= 40
    assert max(measured, key=landscape) == Point("int8", 16, (), 1000, 2)
    assert len(measured) < SPACE.size()  # a climb, not the grid


def test_quick_search_stops_at_the_budget_and_skips_infeasible_points() -> None:
    measured: list[Point] = []

    def measure(point: Point) -> float | None:
        measured.append(point)
        return None if point.instances == 3 else landscape(point)

    quick(SPACE, measure, budget=5, start=Point("original", 4, (), 0, 1))
    assert len(measured) == 5


def test_grid_walks_every_distinct_point_up_to_the_budget() -> None:
    seen: list[Point] = []
    grid(SPACE, lambda p: seen.append(p) or 0.0, budget=10_000)
    # max_batch_size 1 has no preferred variant of its own: (1, pref) and (1, no pref) are one point.
    assert len(seen) == len(set(seen)) == SPACE.size() == 2 * (1 + 4 * 2) * 3 * 3
    limited: list[Point] = []
    grid(SPACE, lambda p: limited.append(p) or 0.0, budget=7)
    assert len(limited) == 7


def test_a_model_that_does_not_batch_searches_instances_and_variants_only() -> None:
    space = Space(variants=("original",), max_batch_sizes=(), queue_delays_us=(0, 1000), instances=(1, 2, 4))
    seen: list[Point] = []
    grid(space, lambda p: seen.append(p) or 0.0, budget=100)
    assert seen == [Point("original", 0, (), 0, n) for n in (1, 2, 4)]
    assert Point("original", 0, (), 0, 2).label() == "original no batching x2"

"""The planner's solver: optimal on small problems (checked against brute force), every replica
placed within every limit and never two of one model on an instance, and the published fleet's
arithmetic (3,040 BERT models on Inferentia) reproduced from its stated numbers."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from inferd.testing.fleet import PUBLISHED_MODELS, PUBLISHED_RATE, published_inferentia_profile
from inferd.tools.plan.catalog import Catalog, InstanceType
from inferd.tools.plan.demand import Demand, Limits, ModelDemand, capacity, model_demands
from inferd.tools.plan.solve import Bin, Solution, first_fit_decreasing, solve

NO_RESERVE = Limits(memory=1.0, compute=1.0, reserved_memory_mb=0.0)


def brute_force_cost(demands: list[ModelDemand], catalog: Catalog, limits: Limits) -> float:
    """The cheapest fleet: every count of every type (up to one instance a replica), cheapest
    first, until every assignment of replicas to those instances has been tried and one fits."""
    replicas = [(m, r) for m in demands for r in range(m.replicas)]
    fleets = itertools.product(range(len(replicas) + 1), repeat=len(catalog.instances))
    prices = [t.price_per_hour for t in catalog.instances]
    for counts in sorted(fleets, key=lambda c: sum(n * p for n, p in zip(c, prices, strict=True))):
        instances = [t for n, t in zip(counts, catalog.instances, strict=True) for _ in range(n)]
        if instances and _packs(replicas, instances, limits):
            return sum(t.price_per_hour for t in instances)
    raise AssertionError("no fleet holds these models")


def _packs(replicas: list[tuple[ModelDemand, int]], instances: list[InstanceType], limits: Limits) -> bool:
    bins = [Bin(t, capacity(t, limits)) for t in instances]

    def place(i: int) -> bool:
        if i == len(replicas):
            return True
        model, _ = replicas[i]
        tried_empty: set[str] = set()
        for bin_ in bins:
            if not bin_.models:  # empty instances of one type are alike: try one of them
                if bin_.instance.name in tried_empty:
                    continue
                tried_empty.add(bin_.instance.name)
            demand = model.by_type.get(bin_.instance.name)
            if demand is None or bin_.holds(model.name) or not bin_.room_for(demand.vector()):
                continue
            bin_.add(demand.vector(), model.name)
            if place(i + 1):
                return True
            bin_.models.pop()
            bin_._held.discard(model.name)
            bin_.used = [u - d for u, d in zip(bin_.used, demand.vector(), strict=True)]
        return False

    return place(0)


def check_valid(solution: Solution, demands: list[ModelDemand]) -> None:
    placed = Counter(name for b in solution.bins for name in b.models)
    assert placed == Counter({m.name: m.replicas for m in demands})
    for bin_ in solution.bins:
        assert len(set(bin_.models)) == len(bin_.models), "two replicas of one model on one instance"
        assert all(u <= c for u, c in zip(bin_.used, bin_.capacity, strict=True))
    assert 0 <= solution.lower_bound <= solution.cost + 1e-9


def random_problem(seed: int) -> tuple[list[ModelDemand], Catalog]:
    rng = random.Random(seed)
    catalog = Catalog((
        InstanceType("small", vcpu=2, memory_gb=1.0, price_per_hour=0.10),
        InstanceType("tall", vcpu=2, memory_gb=3.0, price_per_hour=0.21),
        InstanceType("wide", vcpu=8, memory_gb=1.5, price_per_hour=0.26),
    ))  # fmt: skip
    demands = []
    for i in range(rng.randint(3, 5)):
        memory, cpu = rng.randint(150, 1400), rng.randint(100, 3000)
        by_type = {t.name: Demand(memory, cpu) for t in catalog.instances
                   if memory <= capacity(t, NO_RESERVE)[0] and cpu <= capacity(t, NO_RESERVE)[1]}  # fmt: skip
        if by_type:
            demands.append(ModelDemand(f"m{i}", 1.0, rng.choice((1, 1, 2)), by_type))
    return demands, catalog


@pytest.mark.parametrize("seed", range(8))
def test_small_problems_are_solved_to_the_brute_force_optimum(seed: int) -> None:
    demands, catalog = random_problem(seed)
    solution = solve(demands, catalog, NO_RESERVE, time_limit_s=10, workers=2)
    check_valid(solution, demands)
    assert solution.status == "OPTIMAL"
    assert solution.cost == pytest.approx(brute_force_cost(demands, catalog, NO_RESERVE))
    assert solution.gap == 0.0


def test_the_solver_beats_first_fit_decreasing_where_it_can() -> None:
    # Two big models that first-fit decreasing puts on two instances, each then topped up with one
    # small model; the cheap way is the big ones on one tall instance and the small ones together.
    catalog = Catalog((
        InstanceType("one", vcpu=4, memory_gb=1.0, price_per_hour=0.10),
        InstanceType("two", vcpu=4, memory_gb=2.0, price_per_hour=0.15),
    ))  # fmt: skip
    sizes = {"big1": 600, "big2": 600, "small1": 500, "small2": 500}
    demands = [ModelDemand(n, 1.0, 1, {t.name: Demand(mb, 100) for t in catalog.instances}) for n, mb in sizes.items()]
    start = first_fit_decreasing(demands, catalog, NO_RESERVE)
    solution = solve(demands, catalog, NO_RESERVE, time_limit_s=10, workers=2)
    check_valid(solution, demands)
    assert solution.cost == pytest.approx(brute_force_cost(demands, catalog, NO_RESERVE))
    assert solution.cost <= sum(b.instance.price_per_hour for b in start)


INF1 = Catalog((
    InstanceType("inf1.2xlarge", 8, 16, 0.362, "inferentia1", 1, 8),
    InstanceType("inf1.6xlarge", 24, 48, 1.18, "inferentia1", 4, 8),
))  # fmt: skip
PUBLISHED_LIMITS = Limits(memory=7.4 / 8, compute=0.83, reserved_memory_mb=512.0)


def test_the_published_inferentia_fleet_is_reproduced_from_its_stated_numbers() -> None:
    profile = published_inferentia_profile()
    rates = {name: PUBLISHED_RATE / PUBLISHED_MODELS for name in profile.models}
    only_6xl = Catalog(INF1.instances[1:])
    demands = model_demands({"inferentia1": profile}, rates, only_6xl, PUBLISHED_LIMITS)
    published = solve(demands, only_6xl, PUBLISHED_LIMITS, time_limit_s=15, workers=2)
    check_valid(published, demands)
    assert len(published.bins) == 40 and published.cost == pytest.approx(47.2)  # 76 a machine, as published
    assert {len(b.models) for b in published.bins} == {76}

    demands = model_demands({"inferentia1": profile}, rates, INF1, PUBLISHED_LIMITS)
    cheapest = solve(demands, INF1, PUBLISHED_LIMITS, time_limit_s=15, workers=2)
    check_valid(cheapest, demands)
    # 24 a machine on inf1.2xlarge: 127 of them, $45.974/hour, $0.0151 per model-hour.
    assert Counter(b.instance.name for b in cheapest.bins) == {"inf1.2xlarge": 127}
    assert cheapest.cost == pytest.approx(127 * 0.362) and cheapest.status == "OPTIMAL"

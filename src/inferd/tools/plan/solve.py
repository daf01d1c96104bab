"""Placement as multi-dimensional bin packing, cheapest fleet first: first-fit decreasing for a
start, then CP-SAT (OR-Tools) for the optimum or, when the time limit stops it, the best found
with its proven lower bound.

The CP-SAT model counts rather than names: models with the same replica count and the same demand
on every type form a class, and a variable says how many of a class's replicas an instance holds
(at most one replica of each model per instance, so at most the class's size). 3,000 models with
a handful of distinct demands become a few thousand integers instead of millions of booleans. A
solution's counts become names afterwards: the replicas of a class are dealt out across its slots
in turn, so no instance gets two replicas of one model."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.tools.plan.catalog import Catalog, InstanceType
from inferd.tools.plan.demand import Limits, ModelDemand, capacity

Vector = tuple[int, int, int, int]
PRICE_UNITS = 1_000_000
"""CP-SAT takes integer costs: prices in millionths of the currency an hour."""


@dataclass
class Bin:
    """One instance of the plan and the model replicas it holds."""

    instance: InstanceType
    capacity: Vector
    models: list[str] = field(default_factory=list)
    used: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    _held: set[str] = field(default_factory=set, repr=False)

    def room_for(self, demand: Vector) -> bool:
        return all(u + d <= c for u, d, c in zip(self.used, demand, self.capacity, strict=True))

    def holds(self, model: str) -> bool:
        return model in self._held

    def add(self, demand: Vector, model: str) -> None:
        self.models.append(model)
        self._held.add(model)
        self.used = [u + d for u, d in zip(self.used, demand, strict=True)]


@dataclass(frozen=True, slots=True)
class Solution:
    bins: list[Bin]
    cost: float
    lower_bound: float
    status: str
    """OPTIMAL (proven over the whole catalog); OPTIMAL_AMONG_CONSIDERED (proven over the types
    considered; the gap is to the whole catalog's bound); FEASIBLE (the time limit stopped the
    search; the gap says how far it may be); FIRST_FIT (CP-SAT found nothing better in time)."""
    solve_seconds: float
    considered: tuple[str, ...] = ()
    """The instance types CP-SAT chose among."""

    @property
    def gap(self) -> float:
        return max(0.0, (self.cost - self.lower_bound) / self.cost) if self.cost > 0 else 0.0


def cost_of(bins: Sequence[Bin]) -> float:
    return sum(b.instance.price_per_hour for b in bins)


def one_per_instance(demands: Sequence[ModelDemand], catalog: Catalog, limits: Limits) -> list[Bin]:
    """The naive fleet: every replica on its own instance of the cheapest type it fits."""
    prices = {t.name: t for t in catalog.instances}
    bins = []
    for model in demands:
        cheapest = min(model.by_type, key=lambda name: prices[name].price_per_hour)
        for _ in range(model.replicas):
            instance = prices[cheapest]
            bin_ = Bin(instance, capacity(instance, limits))
            bin_.add(model.by_type[cheapest].vector(), model.name)
            bins.append(bin_)
    return bins


def first_fit_decreasing(
    demands: Sequence[ModelDemand], catalog: Catalog, limits: Limits, mixes: Sequence[Sequence[InstanceType]] = ()
) -> list[Bin]:
    """The cheapest of first-fit decreasing on every single instance type that fits every model, on
    the whole catalog, and on each of `mixes`: replicas go biggest first into the first instance
    with room, and one that fits none opens the type with the best price for its largest need."""
    fleets = [_ffd(demands, (t,), limits) for t in catalog.instances if all(t.name in m.by_type for m in demands)]
    fleets += [_ffd(demands, catalog.instances, limits)]
    fleets += [_ffd(demands, mix, limits) for mix in mixes if mix]
    return min((f for f in fleets if f is not None), key=cost_of)


def _ffd(demands: Sequence[ModelDemand], types: Sequence[InstanceType], limits: Limits) -> list[Bin] | None:
    """None when some model fits none of `types`."""
    capacities = {t.name: capacity(t, limits) for t in types}
    if any(not any(t.name in m.by_type for t in types) for m in demands):
        return None

    def share(vector: Vector, name: str) -> float:
        return max(d / c for d, c in zip(vector, capacities[name], strict=True) if c)

    def size(model: ModelDemand) -> float:  # its largest share of the biggest instance it could use
        return max(share(model.by_type[t.name].vector(), t.name) for t in types if t.name in model.by_type)

    bins: list[Bin] = []
    opened: list[str] = []
    # Bins only fill up: for one demand on one type, the bins before the first with room stay
    # without room, so each search starts there (first-fit in O(n) for identical replicas).
    first_with_room: dict[tuple[str, Vector], int] = {}
    for model in sorted(demands, key=size, reverse=True):
        for _ in range(model.replicas):
            placed = False
            for name in opened:
                vector = model.by_type[name].vector() if name in model.by_type else None
                if vector is None:
                    continue
                key = (name, vector)
                index = first_with_room.get(key, 0)
                while index < len(bins):
                    bin_ = bins[index]
                    if bin_.instance.name == name:
                        if not bin_.room_for(vector):
                            if index == first_with_room.get(key, 0):
                                first_with_room[key] = index + 1
                        elif not bin_.holds(model.name):
                            bin_.add(vector, model.name)
                            placed = True
                            break
                    elif index == first_with_room.get(key, 0):
                        first_with_room[key] = index + 1
                    index += 1
                if placed:
                    break
            if placed:
                continue
            choice = min(
                (t for t in types if t.name in model.by_type),
                key=lambda t: t.price_per_hour * max(share(model.by_type[t.name].vector(), t.name), 1e-9),
            )
            bin_ = Bin(choice, capacities[choice.name])
            bin_.add(model.by_type[choice.name].vector(), model.name)
            bins.append(bin_)
            if choice.name not in opened:
                opened.append(choice.name)
    return bins


@dataclass(frozen=True, slots=True)
class _Class:
    models: tuple[str, ...]
    replicas: int
    demands: dict[str, Vector]


def _classes(demands: Sequence[ModelDemand]) -> list[_Class]:
    groups: dict[tuple[object, ...], list[ModelDemand]] = {}
    for model in demands:
        key = (model.replicas, tuple(sorted((n, d.vector()) for n, d in model.by_type.items())))
        groups.setdefault(key, []).append(model)
    return [
        _Class(
            tuple(m.name for m in members), members[0].replicas, {n: d.vector() for n, d in members[0].by_type.items()}
        )
        for members in groups.values()
    ]


def lower_bound(classes: Sequence[_Class], catalog: Catalog, limits: Limits) -> tuple[float, dict[str, float]]:
    """The linear relaxation over the whole catalog: fractional instances of each type, replicas
    split across types, each resource within what is bought, and no instance holding more than one
    replica of a model. No placement costs less; its instances say which types are worth opening."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    capacities = {t.name: capacity(t, limits) for t in catalog.instances}
    types = [t for t in catalog.instances if any(t.name in c.demands for c in classes)]
    bought = {t.name: solver.NumVar(0, solver.infinity(), t.name) for t in types}
    loads: dict[str, list[list[tuple[int, Any]]]] = {t.name: [[], [], [], []] for t in types}
    for c, klass in enumerate(classes):
        placed = []
        for name, demand in klass.demands.items():
            share = solver.NumVar(0, solver.infinity(), f"z_{c}_{name}")
            placed.append(share)
            solver.Add(share <= len(klass.models) * bought[name])
            for d, need in enumerate(demand):
                if need:
                    loads[name][d].append((need, share))
        solver.Add(solver.Sum(placed) == len(klass.models) * klass.replicas)
    for name, dims in loads.items():
        for d, terms in enumerate(dims):
            if terms:
                solver.Add(solver.Sum([need * share for need, share in terms]) <= capacities[name][d] * bought[name])
    solver.Minimize(solver.Sum([t.price_per_hour * bought[t.name] for t in types]))
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return 0.0, {}
    return solver.Objective().Value(), {name: var.solution_value() for name, var in bought.items()}


def solve(
    demands: Sequence[ModelDemand],
    catalog: Catalog,
    limits: Limits,
    time_limit_s: float = 60.0,
    workers: int | None = None,
    max_types: int = 4,
) -> Solution:
    """The cheapest placement CP-SAT finds within `time_limit_s`, started from first-fit decreasing.

    CP-SAT chooses among the `max_types` instance types the linear relaxation buys most of (plus
    those the start uses, and any a model needs): the cheap fleets are made of those. The lower
    bound is the relaxation's over the whole catalog, or CP-SAT's own when it saw every type."""
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    classes = _classes(demands)
    relaxed, bought = lower_bound(classes, catalog, limits)
    # The types worth considering: those the relaxation buys (most spent first), then the rest by price.
    worth = sorted((n for n, v in bought.items() if v > 1e-6), key=lambda n: -bought[n] * _price(catalog, n))
    others = [t.name for t in sorted(catalog.instances, key=lambda t: t.price_per_hour) if t.name not in worth]
    worth = (worth + [n for n in others if any(n in c.demands for c in classes)])[:max_types]
    mix = [t for t in catalog.instances if t.name in worth]
    start = first_fit_decreasing(demands, catalog, limits, mixes=[mix])
    start_cost = cost_of(start)
    names = set(worth) | {b.instance.name for b in start}
    for klass in classes:  # every class keeps its cheapest type, in case the chosen ones do not fit it
        if not names & set(klass.demands):
            names.add(min(klass.demands, key=lambda n: _price(catalog, n)))
    usable = [t for t in catalog.instances if t.name in names]
    every_type = {t.name for t in catalog.instances if any(t.name in c.demands for c in classes)} <= names
    capacities = {t.name: capacity(t, limits) for t in usable}

    # Instances of each type the model may open: no more than the start's cost buys, and no more
    # than first-fit decreasing needs to hold on that type alone everything that fits it (an optimal
    # fleet's instances of one type can always be repacked into that many).
    bounds: dict[str, int] = {}
    for instance in usable:
        held = sum(1 for b in start if b.instance.name == instance.name)
        affordable = math.floor(start_cost / instance.price_per_hour + 1e-9)
        alone = _ffd([m for m in demands if instance.name in m.by_type], (instance,), limits) or []
        bounds[instance.name] = max(held, min(len(alone), affordable))

    model = cp_model.CpModel()
    slots: list[tuple[InstanceType, int]] = [(t, j) for t in usable for j in range(bounds[t.name])]
    used = [model.new_bool_var(f"used_{t.name}_{j}") for t, j in slots]
    counts: dict[tuple[int, int], Any] = {}
    for b, (instance, _) in enumerate(slots):
        cap = capacities[instance.name]
        terms: list[list[tuple[int, Any]]] = [[], [], [], []]
        for c, klass in enumerate(classes):
            demand = klass.demands.get(instance.name)
            if demand is None:
                continue
            most = min([len(klass.models)] + [cap[d] // need for d, need in enumerate(demand) if need > 0])
            if most <= 0:
                continue
            var = model.new_int_var(0, most, f"n_{c}_{b}")
            counts[c, b] = var
            model.add(var <= most * used[b])
            for d, need in enumerate(demand):
                if need:
                    terms[d].append((need, var))
        for d in range(4):
            if terms[d]:
                model.add(sum(need * var for need, var in terms[d]) <= cap[d] * used[b])
    for c, klass in enumerate(classes):
        model.add(sum(var for (cc, _), var in counts.items() if cc == c) == len(klass.models) * klass.replicas)
    # Instances of one type are interchangeable: open them in order (symmetry breaking).
    for b in range(1, len(slots)):
        if slots[b][0].name == slots[b - 1][0].name:
            model.add(used[b] <= used[b - 1])
    # Each resource must be covered by the capacity bought (a cut that gives the bound early).
    for d in range(4):
        need = sum(len(k.models) * k.replicas * min(v[d] for n, v in k.demands.items() if n in names)
                   for k in classes)  # fmt: skip
        if need:
            model.add(sum(capacities[t.name][d] * used[b] for b, (t, _) in enumerate(slots)) >= need)
    prices = [round(t.price_per_hour * PRICE_UNITS) for t, _ in slots]
    model.minimize(sum(p * u for p, u in zip(prices, used, strict=True)))
    _hint(model, start, slots, used, counts, classes)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s - (time.perf_counter() - started))
    solver.parameters.num_workers = workers or max(1, min(8, os.cpu_count() or 1))
    status = solver.solve(model)
    elapsed = time.perf_counter() - started
    bound = relaxed
    if every_type and status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = max(bound, solver.best_objective_bound / PRICE_UNITS)
    considered = tuple(t.name for t in usable)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solution(start, start_cost, min(bound, start_cost), "FIRST_FIT", elapsed, considered)
    bins = _realize(solver, slots, used, counts, classes, demands, capacities)
    cost = cost_of(bins)
    if cost > start_cost + 1e-9:  # never worse than the start (only if CP-SAT rejected the hint)
        return Solution(start, start_cost, min(bound, start_cost), "FIRST_FIT", elapsed, considered)
    if status == cp_model.OPTIMAL and every_type:
        return Solution(bins, cost, cost, "OPTIMAL", elapsed, considered)
    label = "OPTIMAL_AMONG_CONSIDERED" if status == cp_model.OPTIMAL else "FEASIBLE"
    return Solution(bins, cost, min(bound, cost), label, elapsed, considered)


def _price(catalog: Catalog, name: str) -> float:
    return next(t.price_per_hour for t in catalog.instances if t.name == name)


def _hint(
    model: Any,
    start: list[Bin],
    slots: list[tuple[InstanceType, int]],
    used: list[Any],
    counts: dict[tuple[int, int], Any],
    classes: list[_Class],
) -> None:
    """First-fit decreasing as CP-SAT's starting point."""
    class_of = {name: c for c, klass in enumerate(classes) for name in klass.models}
    index = {(t.name, j): b for b, (t, j) in enumerate(slots)}
    seen: dict[str, int] = {}
    held: dict[tuple[int, int], int] = {}
    opened: set[int] = set()
    for bin_ in sorted(start, key=lambda b: -sum(b.used[:2])):
        j = seen.get(bin_.instance.name, 0)
        seen[bin_.instance.name] = j + 1
        b = index[bin_.instance.name, j]
        opened.add(b)
        for name in bin_.models:
            key = (class_of[name], b)
            held[key] = held.get(key, 0) + 1
    for b, var in enumerate(used):
        model.add_hint(var, b in opened)
    for key, var in counts.items():
        model.add_hint(var, held.get(key, 0))


def _realize(
    solver: Any,
    slots: list[tuple[InstanceType, int]],
    used: list[Any],
    counts: dict[tuple[int, int], Any],
    classes: list[_Class],
    demands: Sequence[ModelDemand],
    capacities: dict[str, Vector],
) -> list[Bin]:
    """The solver's counts as named replicas: class c's replicas dealt out in turn over its slots."""
    by_name = {m.name: m for m in demands}
    bins = {b: Bin(t, capacities[t.name]) for b, (t, _) in enumerate(slots) if solver.value(used[b])}
    for c, klass in enumerate(classes):
        turn = 0
        for b in sorted(bins):
            var = counts.get((c, b))
            if var is None:
                continue
            for _ in range(int(solver.value(var))):
                name = klass.models[turn % len(klass.models)]
                bins[b].add(by_name[name].by_type[bins[b].instance.name].vector(), name)
                turn += 1
    return [bins[b] for b in sorted(bins) if bins[b].models]

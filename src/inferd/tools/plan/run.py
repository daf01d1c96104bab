"""`run_plan`: profiles + request rates + SLO + catalog → the cheapest placement found (`solve.py`),
with first-fit decreasing and one model per instance beside it, as a plan file (`plan_file.py`)."""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
import yaml

from inferd.tools import profiles
from inferd.tools.plan.catalog import Catalog, load_catalog
from inferd.tools.plan.demand import DIMENSIONS, Limits, ModelDemand, PlanError, model_demands, zipf_rates
from inferd.tools.plan.plan_file import Plan, PlannedInstance, PlannedModel, Summary
from inferd.tools.plan.solve import Bin, Solution, cost_of, first_fit_decreasing, one_per_instance, solve


@dataclass(frozen=True, slots=True)
class PlanSettings:
    profiles: tuple[Path, ...]
    rates: Path | None = None
    """A file of requests a second per model: YAML / JSON mapping, or CSV lines `model,rate`."""
    zipf_total: float | None = None
    """Or: this many requests a second over all models, shared as Zipf's law (models in name order)."""
    zipf_exponent: float = 1.0
    slo_p99_ms: float | None = None
    catalog: Path | None = None
    instance_types: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    replicas: int = 1
    time_limit_s: float = 60.0
    workers: int | None = None
    max_types: int = 4


def run_plan(settings: PlanSettings) -> Plan:
    if settings.replicas < 1:
        raise PlanError("--replicas must be at least 1")
    if settings.rates is not None and settings.zipf_total is not None:
        raise PlanError("give the rates as a file (--rates) or as a Zipf total (--zipf-total), not both")
    catalog = load_catalog(settings.catalog)
    if settings.instance_types:
        catalog = catalog.only(settings.instance_types)
    by_kind = _profiles(settings.profiles)
    limits = Limits(settings.limits.memory, settings.limits.compute, settings.limits.reserved_memory_mb,
                    max(p.server_memory_mb for p in by_kind.values()))  # fmt: skip
    names = sorted({name for profile in by_kind.values() for name in profile.models})
    if settings.rates is not None:
        rates = read_rates(settings.rates)
    elif settings.zipf_total is not None:
        rates = zipf_rates(names, settings.zipf_total, settings.zipf_exponent)
    else:
        raise PlanError("give the expected load: --rates FILE or --zipf-total REQUESTS_PER_SECOND")
    demands = model_demands(by_kind, rates, catalog, limits, settings.replicas, settings.slo_p99_ms)
    solution = solve(demands, catalog, limits, settings.time_limit_s, settings.workers, settings.max_types)
    baselines = (
        cost_of(first_fit_decreasing(demands, catalog, limits)),
        cost_of(one_per_instance(demands, catalog, limits)),
    )
    return _plan(solution, demands, catalog, settings, limits, baselines)


def read_rates(path: Path) -> dict[str, float]:
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise PlanError(f"cannot read the rates file {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix.lower() == ".csv":
            rows = [row for row in csv.reader(io.StringIO(text)) if row and not row[0].startswith("#")]
            if rows and rows[0][:2] == ["model", "rate"]:
                rows = rows[1:]
            document: object = {row[0].strip(): float(row[1]) for row in rows}
        else:
            document = yaml.safe_load(text) if path.suffix.lower() in (".yaml", ".yml") else orjson.loads(text)
        if not isinstance(document, dict):
            raise ValueError("expected a mapping of model name to requests a second")
        return {str(name): float(rate) for name, rate in document.items()}
    except (ValueError, IndexError, TypeError, yaml.YAMLError) as exc:
        raise PlanError(f"{path}: not a rates file ({exc}); write `model: requests_per_second` lines") from None


def _profiles(paths: Sequence[Path]) -> dict[str, profiles.Profile]:
    """The profiles merged per machine kind ("" for CPU machines, else the accelerator kind)."""
    if not paths:
        raise PlanError("give at least one profile file (inferd profile or inferd analyze writes them)")
    by_kind: dict[str, list[profiles.Profile]] = {}
    for path in paths:
        try:
            profile = profiles.read(path)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        by_kind.setdefault(profile.machine.accelerator, []).append(profile)
    try:
        return {kind: profiles.merge(group) for kind, group in by_kind.items()}
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def _plan(
    solution: Solution,
    demands: Sequence[ModelDemand],
    catalog: Catalog,
    settings: PlanSettings,
    limits: Limits,
    baselines: tuple[float, float],
) -> Plan:
    ordered = sorted(solution.bins, key=lambda b: (b.instance.name, -b.used[0], -b.used[1]))
    width = max(2, len(str(len(ordered) - 1)))
    instances = tuple(_instance(f"bin-{i:0{width}d}", b) for i, b in enumerate(ordered))
    holders: dict[str, list[str]] = {}
    for instance in instances:
        for held in instance.models:
            holders.setdefault(held, []).append(instance.name)
    type_of = {i.name: i.type for i in instances}
    models: dict[str, PlannedModel] = {}
    for model in demands:
        placed_on = tuple(holders[model.name])
        demand = model.by_type[type_of[placed_on[0]]]
        by_type = {t: dict(zip(DIMENSIONS, model.by_type[t].vector(), strict=True))
                   for t in sorted({type_of[i] for i in placed_on})}  # fmt: skip
        models[model.name] = PlannedModel(model.rate, model.replicas, demand.operating, demand.memory_mb, placed_on,
                                          by_type)  # fmt: skip
    summary = Summary(
        cost_per_hour=round(solution.cost, 6),
        cost_per_model_hour=round(solution.cost / len(models), 6) if models else 0.0,
        lower_bound=round(solution.lower_bound, 6),
        gap=round(solution.gap, 6),
        status=solution.status,
        solve_seconds=round(solution.solve_seconds, 3),
        instances_by_type=dict(Counter(i.type for i in instances)),
        first_fit_decreasing=round(baselines[0], 6),
        one_per_instance=round(baselines[1], 6),
    )
    recorded = {
        "profiles": [str(p) for p in settings.profiles],
        "rates": str(settings.rates) if settings.rates else None,
        "zipf_total": settings.zipf_total,
        "zipf_exponent": settings.zipf_exponent if settings.zipf_total is not None else None,
        "slo_p99_ms": settings.slo_p99_ms,
        "limits": asdict(limits),
        "replicas": settings.replicas,
        "time_limit_s": settings.time_limit_s,
        "instance_types": list(settings.instance_types) or None,
        "considered": list(solution.considered),
    }
    about = {"source": catalog.source, "prices_as_of": catalog.prices_as_of, "currency": catalog.currency}
    return Plan(instances, models, summary, about, recorded)


def _instance(name: str, placed: Bin) -> PlannedInstance:
    t = placed.instance
    return PlannedInstance(
        name=name,
        type=t.name,
        price_per_hour=t.price_per_hour,
        vcpu=t.vcpu,
        memory_gb=t.memory_gb,
        models=tuple(placed.models),
        used=dict(zip(DIMENSIONS, placed.used, strict=True)),
        capacity=dict(zip(DIMENSIONS, placed.capacity, strict=True)),
        accelerator=t.accelerator,
        accelerators=t.accelerators,
    )

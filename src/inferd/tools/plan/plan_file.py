"""The plan file: what `inferd plan` decided, for people and for `inferd deploy` / `inferd fleet`.

Schema (JSON, or YAML when the name ends in .yaml / .yml; `"schema": "inferd.plan/1"`):

    {"schema": "inferd.plan/1", "created": str,
     "catalog": {"source": str, "prices_as_of": str, "currency": str},
     "settings": {...what the plan was asked: limits, SLO, replicas, rates, time limit},
     "summary": {"cost_per_hour", "cost_per_model_hour", "lower_bound", "gap", "status",
                 "solve_seconds", "instances_by_type": {TYPE: count},
                 "first_fit_decreasing": $/hour, "one_per_instance": $/hour},
     "instances": [{"name": "bin-00", "type": str, "price_per_hour": float,
                    "vcpu": int, "memory_gb": float, "accelerator": str, "accelerators": int,
                    "models": [NAME, ...],
                    "used": {"memory_mb", "cpu_milli", "device_memory_mb", "device_milli"},
                    "capacity": {... the same, within the plan's limits}}],
     "models": {NAME: {"rate": float, "replicas": int, "operating": "best" | "batch1",
                       "memory_mb": int, "instances": [INSTANCE NAME, ...],
                       "demand": {TYPE: {"memory_mb", "cpu_milli", ...} (one replica)}}}}"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferd.tools.documents import read_document, write_document

SCHEMA = "inferd.plan/1"


@dataclass(frozen=True, slots=True)
class PlannedInstance:
    name: str
    type: str
    price_per_hour: float
    vcpu: int
    memory_gb: float
    models: tuple[str, ...]
    used: dict[str, int]
    capacity: dict[str, int]
    accelerator: str = ""
    accelerators: int = 0

    def utilization(self) -> dict[str, float]:
        return {k: self.used[k] / c for k, c in self.capacity.items() if c > 0}


@dataclass(frozen=True, slots=True)
class PlannedModel:
    rate: float
    replicas: int
    operating: str
    memory_mb: int
    instances: tuple[str, ...]
    demand: dict[str, dict[str, int]] = field(default_factory=dict)
    """One replica's need on each instance type holding one, in the plan's units."""


@dataclass(frozen=True, slots=True)
class Summary:
    cost_per_hour: float
    cost_per_model_hour: float
    lower_bound: float
    gap: float
    status: str
    solve_seconds: float
    instances_by_type: dict[str, int]
    first_fit_decreasing: float
    one_per_instance: float


@dataclass(frozen=True, slots=True)
class Plan:
    instances: tuple[PlannedInstance, ...]
    models: dict[str, PlannedModel]
    summary: Summary
    catalog: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def instance(self, name: str) -> PlannedInstance:
        return next(i for i in self.instances if i.name == name)


def write(plan: Plan, path: Path) -> None:
    document = {"schema": SCHEMA, "created": plan.created, "catalog": plan.catalog, "settings": plan.settings,
                "summary": asdict(plan.summary), "instances": [asdict(i) for i in plan.instances],
                "models": {name: asdict(m) for name, m in plan.models.items()}}  # fmt: skip
    write_document(document, path)


def read(path: Path) -> Plan:
    """A plan file; ValueError naming the file when it is not one."""
    document = read_document(path, SCHEMA, "plan")
    try:
        instances = tuple(PlannedInstance(**{**i, "models": tuple(i["models"])}) for i in document["instances"])
        models = {
            str(name): PlannedModel(**{**m, "instances": tuple(m["instances"])})
            for name, m in document["models"].items()
        }
        summary = Summary(**document["summary"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a valid inferd plan ({type(exc).__name__}: {exc})") from None
    return Plan(instances, models, summary, document.get("catalog", {}), document.get("settings", {}),
                str(document.get("created", "")))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Route:
    """Where requests for `models` go: any of `instances` (all of them hold every one of the models).
    A model on one instance routes to that instance; models with the same set of instances share a
    route, so a deployment needs one Service (or nginx upstream) per distinct set, not per model."""

    name: str
    instances: tuple[str, ...]
    models: tuple[str, ...]


def routes(plan: Plan) -> list[Route]:
    by_holders: dict[tuple[str, ...], list[str]] = {}
    for name, model in sorted(plan.models.items()):
        by_holders.setdefault(tuple(sorted(model.instances)), []).append(name)
    shared = 0
    result = []
    for holders, models in sorted(by_holders.items()):
        if len(holders) == 1:
            label = holders[0]
        else:
            label = f"route-{shared:02d}"
            shared += 1
        result.append(Route(label, holders, tuple(models)))
    return result

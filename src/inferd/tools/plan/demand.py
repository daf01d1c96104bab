"""What each model asks of each instance type: from its profile, its request rate and the latency
SLO, the replicas it needs and, per replica, memory, CPU and accelerator share in whole units
(MiB, thousandths of a vCPU or device: rounded up, so a plan that fits in units fits in fact).

The figures behind it: a replica is one loaded copy of the model in one inferd, with the whole
model's memory and an equal share of its traffic; it costs `cpu_cores / throughput` core-seconds
per inference at the operating point the SLO allows (the best configuration when its p99 is within
the SLO, else batch 1); one replica serves at most its profile's throughput times the compute
limit, so a busier model gets more replicas."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from inferd.tools import profiles
from inferd.tools.plan.catalog import Catalog, InstanceType

DIMENSIONS = ("memory_mb", "cpu_milli", "device_memory_mb", "device_milli")
DIMENSION_NAMES = {
    "memory_mb": "MiB of memory",
    "cpu_milli": "thousandths of a vCPU",
    "device_memory_mb": "MiB of accelerator memory",
    "device_milli": "thousandths of an accelerator",
}


class PlanError(ValueError):
    """No plan can be made from these inputs: one line says why (and names the model)."""


@dataclass(frozen=True, slots=True)
class Limits:
    memory: float = 0.9
    """The share of an instance's memory (and accelerator memory) models may fill."""
    compute: float = 0.8
    """The share of an instance's vCPUs (and accelerators) models may keep busy."""
    reserved_memory_mb: float = 512.0
    """Memory kept for the operating system and agents on every instance, besides inferd's own."""
    server_memory_mb: float = 0.0
    """An empty inferd's memory (from the profiles), held once per instance."""


@dataclass(frozen=True, slots=True)
class Demand:
    """One replica's need on one instance type, in whole units (see DIMENSIONS)."""

    memory_mb: int
    cpu_milli: int
    device_memory_mb: int = 0
    device_milli: int = 0
    operating: str = "best"
    """Which profile figure the SLO allowed: "best" or "batch1"."""

    def vector(self) -> tuple[int, int, int, int]:
        return (self.memory_mb, self.cpu_milli, self.device_memory_mb, self.device_milli)


@dataclass(frozen=True, slots=True)
class ModelDemand:
    name: str
    rate: float
    replicas: int
    by_type: dict[str, Demand] = field(default_factory=dict)
    """Only the instance types the model can run on."""


def capacity(instance: InstanceType, limits: Limits) -> tuple[int, int, int, int]:
    """What models may use of one instance of `instance`, in DIMENSIONS' units."""
    memory = instance.memory_gb * 1024 * limits.memory - limits.reserved_memory_mb - limits.server_memory_mb
    return (
        max(0, math.floor(memory)),
        math.floor(instance.vcpu * 1000 * limits.compute),
        math.floor(instance.accelerators * instance.accelerator_memory_gb * 1024 * limits.memory),
        math.floor(instance.accelerators * 1000 * limits.compute),
    )


def zipf_rates(models: list[str], total: float, exponent: float) -> dict[str, float]:
    """`total` requests a second shared by `models` in order, the k-th getting a share ∝ 1 / k^exponent."""
    weights = [1.0 / (rank**exponent) for rank in range(1, len(models) + 1)]
    scale = total / sum(weights) if weights else 0.0
    return {name: weight * scale for name, weight in zip(models, weights, strict=True)}


def model_demands(
    by_accelerator: Mapping[str, profiles.Profile],
    rates: Mapping[str, float],
    catalog: Catalog,
    limits: Limits,
    min_replicas: int = 1,
    slo_p99_ms: float | None = None,
) -> list[ModelDemand]:
    """Every profiled model's demand on every instance type it can use. `by_accelerator` holds one
    (merged) profile per machine kind: "" for CPU machines, else the accelerator kind."""
    names = sorted({name for profile in by_accelerator.values() for name in profile.models})
    unknown = sorted(set(rates) - set(names))
    if unknown:
        raise PlanError(f"rates name models no profile has: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    negative = sorted(name for name, rate in rates.items() if not rate >= 0)
    if negative:
        raise PlanError(f"request rates must be 0 or more: {negative[:5]}")
    capacities = {t.name: capacity(t, limits) for t in catalog.instances}
    demands = []
    for name in names:
        rate = float(rates.get(name, 0.0))
        usable: dict[str, tuple[profiles.ModelProfile, profiles.Operating, str]] = {}
        slo_misses: list[str] = []
        for kind, profile in by_accelerator.items():
            model = profile.models.get(name)
            if model is None:
                continue
            chosen = _operating_point(model, slo_p99_ms)
            if chosen is None:
                slo_misses.append(f"{kind or 'CPU'}: p99 {min(model.best.p99_ms, model.batch1.p99_ms):.1f} ms")
                continue
            usable[kind] = (model, *chosen)
        if not usable:
            raise PlanError(
                f"model '{name}' cannot meet the {slo_p99_ms:g} ms p99 SLO on any profiled machine "
                f"({'; '.join(slo_misses)})"
            )
        # A replica serves at most what its profile measured, within the compute limit; the count is
        # the most any usable profile needs, so the plan holds on whichever type the solver picks.
        replicas = max(min_replicas, *(math.ceil(rate / (point.throughput * limits.compute)) if rate > 0 else 1
                                        for _, point, _ in usable.values()))  # fmt: skip
        share = rate / replicas
        by_type: dict[str, Demand] = {}
        for instance in catalog.instances:
            kind = instance.accelerator if instance.accelerator in usable else ""
            if kind not in usable:
                continue
            model, point, label = usable[kind]
            demand = _demand(model, point, label, share, on_device=bool(kind))
            if all(need <= cap for need, cap in zip(demand.vector(), capacities[instance.name], strict=True)):
                by_type[instance.name] = demand
        if not by_type:
            raise PlanError(_no_fit(name, usable, share, catalog, capacities, replicas))
        demands.append(ModelDemand(name, rate, replicas, by_type))
    return demands


def _operating_point(model: profiles.ModelProfile, slo_p99_ms: float | None) -> tuple[profiles.Operating, str] | None:
    if slo_p99_ms is None or model.best.p99_ms <= slo_p99_ms:
        return model.best, "best"
    if model.batch1.p99_ms <= slo_p99_ms:
        return model.batch1, "batch1"
    return None


def _demand(
    model: profiles.ModelProfile, point: profiles.Operating, label: str, rate: float, on_device: bool
) -> Demand:
    cores = point.cpu_cores or model.cpu_cores
    cores_per_inference = cores / point.throughput if point.throughput > 0 else 0.0
    return Demand(
        memory_mb=math.ceil(model.memory_mb),
        cpu_milli=math.ceil(1000 * rate * cores_per_inference),
        device_memory_mb=math.ceil(model.device_memory_mb) if on_device else 0,
        device_milli=math.ceil(1000 * rate / point.throughput) if on_device and point.throughput > 0 else 0,
        operating=label,
    )


def _no_fit(
    name: str,
    usable: Mapping[str, tuple[profiles.ModelProfile, profiles.Operating, str]],
    share: float,
    catalog: Catalog,
    capacities: Mapping[str, tuple[int, int, int, int]],
    replicas: int,
) -> str:
    """Why `name` fits no instance type, and the type that comes nearest (the least overcommitted)."""
    nearest: tuple[float, InstanceType, int, int, int] | None = None
    for instance in catalog.instances:
        kind = instance.accelerator if instance.accelerator in usable else ""
        if kind not in usable:
            continue
        model, point, label = usable[kind]
        needs = _demand(model, point, label, share, on_device=bool(kind)).vector()
        caps = capacities[instance.name]
        over = [(need / cap if cap else math.inf, i) for i, (need, cap) in enumerate(zip(needs, caps, strict=True))
                if need > 0]  # fmt: skip
        worst, index = max(over) if over else (0.0, 0)
        if nearest is None or worst < nearest[0]:
            nearest = (worst, instance, index, needs[index], caps[index])
    if nearest is None:
        kinds = sorted(kind or "CPU" for kind in usable)
        return f"model '{name}' has profiles only for {kinds}, and the catalog has no instance type of that kind"
    _, instance, index, need, cap = nearest
    dimension = DIMENSIONS[index]
    return (
        f"model '{name}' fits no instance type: one replica (of {replicas}) needs {need:,} "
        f"{DIMENSION_NAMES[dimension]}; the nearest fit, {instance.name}, offers {cap:,} within the limits"
    )

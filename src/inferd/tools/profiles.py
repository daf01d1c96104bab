"""The profile file: what a model costs and gives on one machine type, measured, for the fleet
planner. `inferd analyze` writes it (and `inferd profile` will); many can be merged, and a profile
taken on another machine type scaled by a stated factor.

Schema (JSON, `"schema": "inferd.profile/1"`):

    {"schema": "inferd.profile/1",
     "machine": {"cpu": str, "cores": int, "memory_gb": float, "scale": float},
     "created": "2026-11-23T12:00:00Z",
     "models": {NAME: {
         "memory_mb": float,          resident memory the model adds to a server (RSS delta)
         "cpu_cores": float,          cores the server used at the best configuration's throughput
         "best": {"throughput": float (inferences/s), "p50_ms": float, "p99_ms": float,
                  "concurrency": float, "config": {max_batch_size, preferred_batch_size,
                  max_queue_delay_microseconds, instances, variant}},
         "batch1": {"throughput": float, "p50_ms": float, "p99_ms": float}}}}

`scale` records a factor already applied (throughput multiplied, latency divided by it)."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

SCHEMA = "inferd.profile/1"


@dataclass(frozen=True, slots=True)
class Operating:
    throughput: float
    """Inferences a second."""
    p50_ms: float
    p99_ms: float
    concurrency: float = 1.0
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelProfile:
    memory_mb: float
    cpu_cores: float
    best: Operating
    batch1: Operating


@dataclass(frozen=True, slots=True)
class Machine:
    cpu: str
    cores: int
    memory_gb: float
    scale: float = 1.0

    @staticmethod
    def this() -> Machine:
        import psutil

        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as info:
                cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
        except OSError:
            pass
        return Machine(cpu, os.cpu_count() or 1, round(psutil.virtual_memory().total / 2**30, 1))


@dataclass(frozen=True, slots=True)
class Profile:
    machine: Machine
    models: dict[str, ModelProfile]
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def scaled(self, factor: float) -> Profile:
        """As measured on a machine `factor` times as fast (throughput times factor, latency divided by it)."""

        def operating(point: Operating) -> Operating:
            return replace(point, throughput=point.throughput * factor, p50_ms=point.p50_ms / factor,
                           p99_ms=point.p99_ms / factor)  # fmt: skip

        models = {
            name: replace(m, best=operating(m.best), batch1=operating(m.batch1)) for name, m in self.models.items()
        }
        return replace(self, machine=replace(self.machine, scale=self.machine.scale * factor), models=models)


def merge(profiles: list[Profile]) -> Profile:
    """One profile of every model; all must come from one machine type (or be scaled to it)."""
    if not profiles:
        raise ValueError("no profiles to merge")
    machines = {(p.machine.cpu, p.machine.cores, p.machine.scale) for p in profiles}
    if len(machines) > 1:
        raise ValueError(f"profiles from different machines {sorted(machines)}: scale them to one first")
    models: dict[str, ModelProfile] = {}
    for profile in profiles:
        models |= profile.models  # a later measurement of a model replaces an earlier one
    return Profile(profiles[0].machine, models)


def write(profile: Profile, path: Path) -> None:
    document = {"schema": SCHEMA, "machine": asdict(profile.machine), "created": profile.created,
                "models": {name: asdict(model) for name, model in profile.models.items()}}  # fmt: skip
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


def read(path: Path) -> Profile:
    document = orjson.loads(path.read_bytes())
    if document.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not an inferd profile (schema {document.get('schema')!r}, expected {SCHEMA})")
    models = {
        name: ModelProfile(m["memory_mb"], m["cpu_cores"], Operating(**m["best"]), Operating(**m["batch1"]))
        for name, m in document["models"].items()
    }
    return Profile(Machine(**document["machine"]), models, document["created"])

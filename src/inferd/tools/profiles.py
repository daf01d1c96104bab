"""The profile file: what a model costs and gives on one machine type, measured, for the fleet
planner. `inferd analyze` writes it (and `inferd profile` will); many can be merged, and a profile
taken on another machine type scaled by a stated factor.

Schema (JSON, or YAML when the file name ends in .yaml / .yml; `"schema": "inferd.profile/1"`):

    {"schema": "inferd.profile/1",
     "machine": {"cpu": str, "cores": int, "memory_gb": float, "scale": float, "accelerator": str},
     "created": "2026-11-23T12:00:00Z",
     "server_memory_mb": float,       an empty inferd's resident memory on that machine (0: not measured)
     "models": {NAME: {
         "memory_mb": float,          resident memory the model adds to a server (RSS delta)
         "cpu_cores": float,          cores the server used at the best configuration's throughput
         "device_memory_mb": float,   accelerator memory the model takes (0 on a CPU machine)
         "best": {"throughput": float (inferences/s), "p50_ms": float, "p99_ms": float,
                  "concurrency": float, "cpu_cores": float, "config": {max_batch_size,
                  preferred_batch_size, max_queue_delay_microseconds, instances, variant}},
         "batch1": {"throughput": float, "p50_ms": float, "p99_ms": float, ...}}}}

`scale` records a factor already applied (throughput multiplied, latency divided by it). On a
machine with an `accelerator` (a kind such as "inferentia1", matched against the planner's
catalog), throughput and `device_memory_mb` are those of one accelerator device."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from inferd.tools.documents import read_document, write_document

SCHEMA = "inferd.profile/1"


@dataclass(frozen=True, slots=True)
class Operating:
    throughput: float
    """Inferences a second."""
    p50_ms: float
    p99_ms: float
    concurrency: float = 1.0
    config: dict[str, Any] = field(default_factory=dict)
    cpu_cores: float = 0.0
    """Cores the server used at this point (0: not measured; the model's cpu_cores stands in)."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    memory_mb: float
    cpu_cores: float
    best: Operating
    batch1: Operating
    device_memory_mb: float = 0.0


@dataclass(frozen=True, slots=True)
class Machine:
    cpu: str
    cores: int
    memory_gb: float
    scale: float = 1.0
    accelerator: str = ""
    """The accelerator kind the profile was measured on; "" for the CPU."""

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
    server_memory_mb: float = 0.0

    def scaled(self, factor: float, machine: Machine | None = None) -> Profile:
        """As measured on a machine `factor` times as fast (throughput times factor, latency divided
        by it): `machine` when given (so the result merges with profiles taken there), else this one."""
        if not factor > 0:
            raise ValueError(f"a scale factor must be above 0, not {factor}")

        def operating(point: Operating) -> Operating:
            return replace(point, throughput=point.throughput * factor, p50_ms=point.p50_ms / factor,
                           p99_ms=point.p99_ms / factor)  # fmt: skip

        models = {
            name: replace(m, best=operating(m.best), batch1=operating(m.batch1)) for name, m in self.models.items()
        }
        target = replace(machine or self.machine, scale=self.machine.scale * factor)
        return replace(self, machine=target, models=models)


def merge(profiles: list[Profile]) -> Profile:
    """One profile of every model; all must come from one machine type (or be scaled to it)."""
    if not profiles:
        raise ValueError("no profiles to merge")
    machines = {(p.machine.cpu, p.machine.cores, p.machine.accelerator) for p in profiles}
    if len(machines) > 1:
        raise ValueError(f"profiles from different machines {sorted(machines)}: scale them to one first")
    models: dict[str, ModelProfile] = {}
    for profile in profiles:
        models |= profile.models  # a later measurement of a model replaces an earlier one
    server = max(p.server_memory_mb for p in profiles)
    return Profile(profiles[0].machine, models, server_memory_mb=server)


def write(profile: Profile, path: Path) -> None:
    document = {"schema": SCHEMA, "machine": asdict(profile.machine), "created": profile.created,
                "server_memory_mb": profile.server_memory_mb,
                "models": {name: asdict(model) for name, model in profile.models.items()}}  # fmt: skip
    write_document(document, path)


def read(path: Path) -> Profile:
    """A profile file; ValueError (naming the file and the field) when it is not a valid one."""
    document = read_document(path, SCHEMA, "profile")
    try:
        models = {
            str(name): ModelProfile(
                float(m["memory_mb"]),
                float(m["cpu_cores"]),
                Operating(**m["best"]),
                Operating(**m["batch1"]),
                float(m.get("device_memory_mb", 0.0)),
            )
            for name, m in document["models"].items()
        }
        machine = Machine(**document["machine"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: not a valid inferd profile ({type(exc).__name__}: {exc})") from None
    return Profile(machine, models, str(document.get("created", "")), float(document.get("server_memory_mb", 0.0)))

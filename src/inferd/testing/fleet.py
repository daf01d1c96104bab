"""Profiles for planner tests and benchmarks: many copies of one measured model, and the published
3,040-model Inferentia fleet rebuilt from its stated numbers (CONTEXT.md, section 4)."""

from __future__ import annotations

from inferd.tools import profiles

PUBLISHED_MODELS = 3040
PUBLISHED_RATE = 6230.0
"""Requests a second over the whole published fleet."""


def copies(profile: profiles.Profile, model: str, count: int, prefix: str = "model") -> profiles.Profile:
    """`count` models that each cost and give what `model` does in `profile` (a fleet of alike models)."""
    entry = profile.models[model]
    models = {f"{prefix}-{i:04d}": entry for i in range(count)}
    return profiles.Profile(profile.machine, models, profile.created, profile.server_memory_mb)


def published_inferentia_profile() -> profiles.Profile:
    """A bert-base model on one Inferentia chip, as the published fleet implies: 24 models fill a
    chip's 7.4 GB usable (308 MiB each), and 76 on an inf1.6xlarge keep its 24 host vCPUs within the
    83% ceiling at 6,230 requests/s over 3,040 models (2.05/s each, 0.26 vCPU a model: 12.69
    cores at 100 inferences/s). Host memory (150 MiB a model) and chip time bind nowhere."""
    best = profiles.Operating(throughput=100.0, p50_ms=20.0, p99_ms=60.0, concurrency=8, cpu_cores=12.69)
    model = profiles.ModelProfile(memory_mb=150.0, cpu_cores=12.69, best=best, batch1=best, device_memory_mb=308.0)
    machine = profiles.Machine("inf1 host (from the published figures)", 8, 16.0, accelerator="inferentia1")
    return profiles.Profile(machine, {f"bert-{i:04d}": model for i in range(PUBLISHED_MODELS)})

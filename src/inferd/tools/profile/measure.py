"""`measure_profile`: each model served as its repository configures it, by its own inferd, and
measured with `inferd perf` over a sweep of concurrency. This is `inferd analyze` with a budget of
one configuration (the model's own), so both tools measure, and write profiles, the same way:
profile the folder analyze wrote to have the best configuration's figures."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from inferd.tools import profiles
from inferd.tools.analyze import AnalyzeSettings, Events, run_analyze
from inferd.tools.documents import is_yaml


class ProfileError(ValueError):
    """A profile cannot be made: one line says why."""


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    models: tuple[Path, ...]
    output: Path
    p99_budget_ms: float | None = None
    concurrency: tuple[float, ...] = (1, 2, 4, 8, 16)
    input_data: str = "random"
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    window_s: float = 2.0
    max_trials: int = 5
    stability_percentage: float = 10.0


def measure_profile(settings: ProfileSettings, events: Events | None = None) -> profiles.Profile:
    if not is_yaml(settings.output) and settings.output.suffix.lower() != ".json":
        raise ProfileError(f"the profile file {settings.output} must end in .json, .yaml or .yml")
    with tempfile.TemporaryDirectory(prefix="inferd-profile-") as scratch:
        analyzed = run_analyze(
            AnalyzeSettings(
                models=settings.models,
                output=Path(scratch),
                budget=1,
                p99_budget_ms=settings.p99_budget_ms,
                concurrency=settings.concurrency,
                input_data=settings.input_data,
                shapes=settings.shapes,
                window_s=settings.window_s,
                max_trials=settings.max_trials,
                stability_percentage=settings.stability_percentage,
            ),
            events,
        )
        profile = profiles.read(analyzed.profile_path)
        failed = {r.name: r.measurements[0].error if r.measurements else "" for r in analyzed.models
                  if r.name not in profile.models}  # fmt: skip
    settings.output.parent.mkdir(parents=True, exist_ok=True)
    profiles.write(profile, settings.output)
    if failed:
        reasons = "; ".join(f"{name}: {why or 'no load within the p99 budget without errors'}"
                            for name, why in failed.items())  # fmt: skip
        raise ProfileError(f"not profiled ({reasons}); the others are in {settings.output}")
    return profile

#!/usr/bin/env python3
"""`inferd plan` at fleet scale, as a user would run it:

1. 3,000 MiniLM-sized models: the example's all-MiniLM-L6-v2 profiled on this machine (`inferd
   profile measure`, 128-token requests, p99 within 250 ms; or --profile, e.g. analyze's
   profile.json), copied 3,000 times, 6,230 requests/s shared by Zipf's law, two replicas each,
   planned on the shipped catalog within --time-limit: $/hour, $/model-hour, bound, gap and solve
   time beside first-fit decreasing and one model per instance.
2. The published fleet (3,040 bert-base models on Inferentia: 76 per inf1.6xlarge at $1.180/hour,
   or 24 per inf1.2xlarge at $0.362/hour) rebuilt from its stated numbers and planned on each type
   alone and on both, with its 7.4 GB / 8 GB and 83% ceilings.

    .venv/bin/python benchmarks/plan_fleet.py [--profile FILE] [--time-limit 60] [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MINILM = ROOT / "examples" / "model_repository" / "minilm"
SHAPES = ("--shape", "input_ids:128", "--shape", "attention_mask:128", "--shape", "token_type_ids:128")


def inferd(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "inferd", *args], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def plan(profile: Path, output: Path, *args: str) -> dict[str, Any]:
    """inferd plan's summary (its tables are left in OUTPUT/plan.txt)."""
    command = [sys.executable, "-m", "inferd", "plan", str(profile), "-o", str(output), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    (output / "plan.txt").write_text(result.stdout)
    summary: dict[str, Any] = json.loads((output / "plan.json").read_text())["summary"]
    return summary


def row(label: str, summary: dict[str, Any], models: int) -> str:
    cost = float(summary["cost_per_hour"])
    counts = ", ".join(f"{n} x {t}" for t, n in sorted(summary["instances_by_type"].items()))
    return (
        f"{label:<34} {cost:>10.3f} {cost / models:>12.5f} {float(summary['lower_bound']):>10.3f} "
        f"{float(summary['gap']):>7.2%} {float(summary['solve_seconds']):>7.1f}s  {summary['status']:<24} {counts}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, help="a MiniLM profile (default: measured now)")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    from inferd.testing.fleet import PUBLISHED_MODELS, PUBLISHED_RATE, copies, published_inferentia_profile
    from inferd.tools import profiles

    output = args.output or Path(tempfile.mkdtemp(prefix="inferd-plan-fleet-"))
    output.mkdir(parents=True, exist_ok=True)
    measured = args.profile
    if measured is None:
        if not (MINILM / "1" / "model.onnx").is_file():
            sys.exit("build the example first: make example")
        measured = output / "minilm-profile.json"
        inferd("profile", "measure", str(MINILM), "-o", str(measured), "--p99-budget", "250", "--input-data", "zero",
               *SHAPES)  # fmt: skip
    minilm = profiles.read(measured)
    name = next(iter(minilm.models))
    entry = minilm.models[name]
    print(f"\n{name} on {minilm.machine.cpu} ({minilm.machine.cores} cores): {entry.memory_mb:.0f} MB, best "
          f"{entry.best.throughput:.1f} inferences/s at p99 {entry.best.p99_ms:.0f} ms on {entry.cpu_cores:.2f} "
          f"cores; batch 1 {entry.batch1.throughput:.1f}/s at p99 {entry.batch1.p99_ms:.0f} ms")  # fmt: skip
    fleet = output / "minilm-3000.json"
    profiles.write(copies(minilm, name, 3000), fleet)

    header = f"{'':<34} {'$/hour':>10} {'$/model-h':>12} {'bound':>10} {'gap':>7} {'solve':>8}  {'status':<24} fleet"
    print(f"\n3,000 MiniLM-sized models, 6,230 requests/s (Zipf), 2 replicas, shipped catalog\n{header}")
    summary = plan(fleet, output / "minilm-3000", "--zipf-total", "6230", "--replicas", "2",
                   "--time-limit", str(args.time_limit))  # fmt: skip
    print(row("inferd plan (CP-SAT)", summary, 3000))
    for label, key in (
        ("first-fit decreasing", "first_fit_decreasing"),
        ("one model per instance", "one_per_instance"),
    ):
        cost = float(summary[key])
        print(f"{label:<34} {cost:>10.3f} {cost / 3000:>12.5f}")

    published = output / "published.json"
    profiles.write(published_inferentia_profile(), published)
    catalog = ROOT / "src" / "inferd" / "tools" / "plan" / "catalog.yaml"
    ceilings = ("--memory-limit", str(7.4 / 8), "--compute-limit", "0.83", "--catalog", str(catalog),
                "--zipf-total", str(PUBLISHED_RATE), "--zipf-exponent", "0",
                "--time-limit", str(args.time_limit))  # fmt: skip
    print(f"\nThe published fleet: {PUBLISHED_MODELS} bert-base models, {PUBLISHED_RATE:g} requests/s; "
          "published: 40 x inf1.6xlarge = $47.200/hour, $0.01553/model-hour (and 24 a model per "
          f"inf1.2xlarge)\n{header}")  # fmt: skip
    for types in ("inf1.6xlarge", "inf1.2xlarge", "inf1.2xlarge,inf1.6xlarge"):
        summary = plan(published, output / f"published-{types}", "--instance-types", types, *ceilings)
        print(row(types, summary, PUBLISHED_MODELS))
    print(f"\nplans and pictures: {output}")


if __name__ == "__main__":
    main()

"""`inferd profile` and `inferd plan` through their CLI: models profiled by real inferd servers and
placed with replicas on distinct instances; profiles merged and scaled; 3,000 synthetic models
placed within the limits with the bound and gap reported; impossible inputs as one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from inferd.testing.models import mlp_model
from inferd.testing.models import write_config as write_model_config
from inferd.tools import profiles

pytestmark = pytest.mark.e2e


def inferd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferd", *args], capture_output=True, text=True, timeout=timeout)


def synthetic(path: Path, count: int, memory_mb: float = 130.0, cpu: str = "cpu A", p99_ms: float = 80.0) -> Path:
    """`count` MiniLM-sized models (memory, CPU and speed of the example's MiniLM on a 2-core machine)."""
    best = profiles.Operating(56.0, 40.0, p99_ms, 8, {"max_batch_size": 8}, cpu_cores=2.0)
    single = profiles.Operating(45.0, 20.0, 25.0, 1, {"max_batch_size": 8}, cpu_cores=1.0)
    model = profiles.ModelProfile(memory_mb, 2.0, best, single)
    names = {f"model-{i:04d}": model for i in range(count)}
    profiles.write(profiles.Profile(profiles.Machine(cpu, 2, 24.0), names, server_memory_mb=250.0), path)
    return path


def check_plan(plan: dict[str, Any], replicas: int) -> None:
    instances = {i["name"]: i for i in plan["instances"]}
    for name, model in plan["models"].items():
        assert len(model["instances"]) == model["replicas"] >= replicas, name
        assert len(set(model["instances"])) == len(model["instances"]), f"{name}: two replicas on one instance"
        for holder in model["instances"]:
            assert name in instances[holder]["models"]
    for instance in instances.values():
        assert all(instance["used"][k] <= instance["capacity"][k] for k in instance["used"]), instance["name"]
    summary = plan["summary"]
    assert summary["cost_per_hour"] == pytest.approx(sum(i["price_per_hour"] for i in instances.values()))
    assert 0 <= summary["lower_bound"] <= summary["cost_per_hour"] + 1e-6
    assert 0 <= summary["gap"] <= 1
    assert summary["cost_per_hour"] <= summary["first_fit_decreasing"] + 1e-6
    assert summary["first_fit_decreasing"] <= summary["one_per_instance"] + 1e-6


@pytest.mark.timeout(300)
def test_models_are_profiled_by_real_servers_and_planned_with_replicas(tmp_path: Path) -> None:
    models = []
    for seed, name in enumerate(("alpha", "beta")):
        model = tmp_path / "models" / name
        mlp_model(model / "1" / "model.onnx", seed=seed)
        write_model_config(model, "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 500 }")
        models.append(str(model))
    profile_path = tmp_path / "profile.yaml"
    result = inferd("profile", "measure", *models, "-o", str(profile_path), "--concurrency", "1,2", "-p", "300",
                    "-r", "3")  # fmt: skip
    assert result.returncode == 0, result.stderr
    profile = profiles.read(profile_path)
    assert sorted(profile.models) == ["alpha", "beta"] and profile.server_memory_mb > 0
    for entry in profile.models.values():
        assert entry.memory_mb >= 0 and entry.best.throughput > 0 and entry.best.p99_ms >= entry.best.p50_ms > 0
        assert entry.batch1.concurrency == 1 and entry.best.config["max_batch_size"] == 8
    assert "alpha" in inferd("profile", "show", str(profile_path)).stdout

    output = tmp_path / "plan"
    result = inferd("plan", str(profile_path), "-o", str(output), "--zipf-total", "20", "--replicas", "2",
                    "--time-limit", "10")  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads((output / "plan.json").read_text())
    check_plan(plan, replicas=2)
    assert plan["summary"]["status"] in ("OPTIMAL", "OPTIMAL_AMONG_CONSIDERED")
    assert len(plan["instances"]) == 2  # two replicas of each on distinct instances: two instances at least
    assert plan["models"]["alpha"]["rate"] == pytest.approx(20 / 1.5)  # Zipf: 1 : 1/2 of 20 requests/s
    assert (output / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "lower bound" in result.stdout and "plan.json" in result.stdout


def test_profiles_merge_and_scale_through_the_cli(tmp_path: Path) -> None:
    here = synthetic(tmp_path / "here.json", 2, cpu="cpu A")
    there = tmp_path / "there.json"
    best = profiles.Operating(100.0, 10.0, 20.0, 4, cpu_cores=2.0)
    profiles.write(profiles.Profile(profiles.Machine("cpu B", 4, 32.0),
                                    {"other": profiles.ModelProfile(90.0, 2.0, best, best)}), there)  # fmt: skip
    refused = inferd("profile", "merge", str(here), str(there), "-o", str(tmp_path / "merged.json"))
    assert refused.returncode == 1 and "different machines" in refused.stderr and "Traceback" not in refused.stderr

    scaled = tmp_path / "scaled.json"
    result = inferd("profile", "scale", str(there), "--factor", "0.5", "--as-machine-of", str(here), "-o", str(scaled))
    assert result.returncode == 0, result.stderr
    assert profiles.read(scaled).models["other"].best.throughput == pytest.approx(50.0)
    result = inferd("profile", "merge", str(here), str(scaled), "-o", str(tmp_path / "merged.yaml"))
    assert result.returncode == 0, result.stderr
    assert sorted(profiles.read(tmp_path / "merged.yaml").models) == ["model-0000", "model-0001", "other"]


@pytest.mark.timeout(300)
def test_three_thousand_models_are_placed_within_the_limits_with_a_gap(tmp_path: Path) -> None:
    profile = synthetic(tmp_path / "profile.json", 3000)
    output = tmp_path / "plan"
    result = inferd("plan", str(profile), "-o", str(output), "--zipf-total", "6230", "--replicas", "2",
                    "--time-limit", "15")  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads((output / "plan.json").read_text())
    assert len(plan["models"]) == 3000
    check_plan(plan, replicas=2)
    assert plan["summary"]["status"] in ("OPTIMAL", "OPTIMAL_AMONG_CONSIDERED", "FEASIBLE", "FIRST_FIT")
    # The busiest model (Zipf rank 1: 6230 / H(3000) ≈ 716 requests/s) needs more than two replicas.
    assert plan["models"]["model-0000"]["replicas"] > 2
    assert Counter(i["type"] for i in plan["instances"]) == plan["summary"]["instances_by_type"]


def test_impossible_inputs_are_one_line_errors(tmp_path: Path) -> None:
    fine = synthetic(tmp_path / "fine.json", 3)
    huge = synthetic(tmp_path / "huge.json", 1, memory_mb=400_000.0)
    out = str(tmp_path / "out")

    def refused(*args: str) -> str:
        result = inferd("plan", *args, "-o", out, "--time-limit", "5")
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        return result.stderr

    message = refused(str(huge), "--zipf-total", "1")
    assert "'model-0000' fits no instance type" in message and "nearest fit, r6i.8xlarge" in message
    assert "cannot meet the 10 ms p99 SLO" in refused(str(fine), "--zipf-total", "1", "--slo-p99", "10")
    assert "--rates FILE or --zipf-total" in refused(str(fine))
    rates = tmp_path / "rates.yaml"
    rates.write_text("model-0000: 3\nnot-profiled: 2\n")
    assert "not-profiled" in refused(str(fine), "--rates", str(rates))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("instances:\n  - {name: x, vcpu: 0, memory_gb: 4, price_per_hour: 0.1}\n")
    assert "instances.0.vcpu" in refused(str(fine), "--zipf-total", "1", "--catalog", str(catalog))
    assert "not in the catalog" in refused(str(fine), "--zipf-total", "1", "--instance-types", "z9.huge")
    (tmp_path / "bad.json").write_text('{"schema": "other/1"}')
    assert "not an inferd profile" in refused(str(tmp_path / "bad.json"), "--zipf-total", "1")

"""`inferd analyze` through its CLI on a tiny model (three configurations, windows under a second):
the report, the results cache (a rerun measures nothing again), the profile, and a winning
config.pbtxt that a real inferd loads; variants; bad arguments as one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inferd.client import Client
from inferd.testing.models import mlp_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import run_server
from inferd.tools import profiles

pytestmark = pytest.mark.e2e
# Three configurations (the model's own and two searched), windows of 0.3 s, at most three each.
QUICK = ("--concurrency", "1,2", "-p", "300", "-r", "3", "--budget", "3")


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "analyze", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    model = tmp_path / "models" / "mlp"
    mlp_model(model / "1" / "model.onnx", seed=5)
    write_model_config(model, "max_batch_size: 16\ndynamic_batching { max_queue_delay_microseconds: 500 }")
    return model


@pytest.mark.timeout(300)
def test_analyze_finds_a_winner_writes_its_config_and_resumes(mlp: Path, tmp_path: Path) -> None:
    output = tmp_path / "analysis"
    arguments = (str(mlp), "-o", str(output), *QUICK, "--max-batch-sizes", "1,8", "--instances", "1,2",
                 "--queue-delays", "0")  # fmt: skip
    result = analyze(*arguments)
    assert result.returncode == 0, result.stderr
    results = json.loads((output / "results.json").read_text())
    measurements = list(results["measurements"].values())
    assert len(measurements) == 3 and results["memory_baseline_mb"] > 0
    assert sum(m["baseline"] for m in measurements) == 1  # the model's own configuration, measured first
    for measurement in measurements:
        assert measurement["score"] and measurement["rss_mb"] > 0 and not measurement["error"]
        assert all(step["load"] in (1, 2) and step["throughput"] > 0 for step in measurement["steps"])
    winner = max(measurements, key=lambda m: m["score"])
    assert "winner" in result.stdout and "mlp" in result.stdout

    config = (output / "mlp" / "config.pbtxt").read_text()
    assert "Chosen by inferd analyze" in config and f"max_batch_size: {winner['point']['max_batch_size']}" in config
    html = (output / "report.html").read_text()
    assert "<img" in html and "data:image/png;base64," in html and "config.pbtxt" in html and "RSS MB" in html
    profile = profiles.read(output / "profile.json")
    entry = profile.models["mlp"]
    assert entry.memory_mb >= 0 and entry.best.throughput == pytest.approx(winner["score"])
    assert entry.batch1.concurrency == 1 and entry.best.config["max_batch_size"] == winner["point"]["max_batch_size"]

    # The winning config drops into a repository beside the model's files, and inferd serves it.
    repository = tmp_path / "repository"
    shutil.copytree(mlp, repository / "mlp")
    shutil.copyfile(output / "mlp" / "config.pbtxt", repository / "mlp" / "config.pbtxt")
    with run_server(repository, tmp_path / "server.log") as server, Client(f"http://{server.http_url}") as client:
        assert client.model_ready("mlp")
        served = client.model_config("mlp")
        assert int(served["max_batch_size"]) == winner["point"]["max_batch_size"]

    # Resumed: the same run again measures nothing (every configuration comes from results.json).
    again = analyze(*arguments)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("cached") == 3
    assert json.loads((output / "results.json").read_text())["measurements"] == results["measurements"]


@pytest.mark.timeout(300)
def test_variants_are_searched_and_a_grid_is_bounded(mlp: Path, tmp_path: Path) -> None:
    variant = tmp_path / "models" / "mlp-copy"
    shutil.copytree(mlp, variant)
    output = tmp_path / "analysis"
    result = analyze(str(mlp), "--variant", str(variant), "-o", str(output), *QUICK, "--search", "grid",
                     "--max-batch-sizes", "8", "--queue-delays", "0", "--instances", "1", "--no-preferred")  # fmt: skip
    assert result.returncode == 0, result.stderr
    points = [m["point"] for m in json.loads((output / "results.json").read_text())["measurements"].values()]
    assert sorted(p["variant"] for p in points) == ["mlp-copy", "original", "original"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--objective", "latency"], "give --request-rate"),
        (["--max-batch-sizes", "8,x"], "comma-separated list"),
        (["--instances", "0"], "at least 1"),
        (["--concurrency", "0"], "above 0"),
        (["--variant", "nowhere"], "is not a model folder"),
    ],
)
def test_bad_arguments_are_one_line_errors(arguments: list[str], message: str, mlp: Path, tmp_path: Path) -> None:
    result = analyze(str(mlp), "-o", str(tmp_path / "out"), *arguments)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_model_that_cannot_load_is_a_one_line_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.onnx").write_bytes(b"not an onnx model")
    result = analyze(str(broken), "-o", str(tmp_path / "out"), *QUICK)
    assert result.returncode == 1 and "inferd could not load the model" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr

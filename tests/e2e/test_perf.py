"""`inferd perf` through its CLI against a real `inferd serve`: output formats parse, its counts
equal the server's statistics, errors are counted by kind, open-loop rates are kept to, input
data comes from files, and bad arguments are one-line errors. Windows are short (0.3 s) and few:
these tests check what is counted, not how fast anything is."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferd.testing.models import add_sub_model, identity_model, sleepy_model, write_config
from inferd.testing.server import ServerProcess, free_port, run_server
from inferd.types import DataType

pytestmark = pytest.mark.e2e

SHORT = ("-p", "300", "-r", "3")


@pytest.fixture(scope="module")
def perf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repository")
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    write_config(root / "add_sub", "max_batch_size: 8\ndynamic_batching { }")
    identity_model(root / "identity" / "1" / "model.onnx", DataType.FP32, ["batch", -1])
    # One request at a time (20 ms), executing or queued: more at once are refused (OVERLOADED).
    sleepy_model(
        root / "narrow", sleep_ms=20, max_batch_size=1,
        config="dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    )  # fmt: skip
    with run_server(root, tmp_path_factory.mktemp("logs") / "server.log") as server:
        yield server


def perf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferd", "perf", *args], capture_output=True, text=True, timeout=120)


def perf_json(*args: str) -> dict[str, Any]:
    result = perf(*args, "--output", "json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_a_concurrency_sweep_counts_what_the_server_counts(perf_server: ServerProcess) -> None:
    report = perf_json(
        "-m", "add_sub", "-u", f"http://{perf_server.http_url}", "--concurrency", "1:4:x2", "-b", "2", *SHORT
    )
    assert [step["load"] for step in report["steps"]] == [1, 2, 4]
    for step in report["steps"]:
        assert step["mode"] == "concurrency" and step["errors"] == {} and 1 <= step["windows"] <= 3
        assert step["throughput"] == pytest.approx(2 * step["request_rate"]) and step["requests"] > 0
        latency = step["latency_ms"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p95"] <= latency["p99"]
        server = step["server"]
        assert server["requests"] > 0 and server["inferences"] == 2 * server["requests"]
        assert server["batch_size"] > 1.9 and server["compute_infer_us"] > 0  # windows cut executions
    assert report["client_errors"] == {}
    assert report["client_requests"] == report["server_requests"] > 0
    assert report["server_inferences"] == 2 * report["server_requests"]


def test_grpc_several_processes_and_a_table(perf_server: ServerProcess) -> None:
    result = perf(
        "-m", "add_sub", "-u", perf_server.grpc_url, "-i", "grpc", "--concurrency", "4", "--processes", "2", *SHORT
    )
    assert result.returncode == 0, result.stderr
    row = [line for line in result.stdout.splitlines() if "│" in line][-1]
    assert "infer/s" in result.stdout and "p99 ms" in result.stdout and row.split("│")[1].strip() == "4"
    counted = result.stdout.split("requests succeeded")[0].split()[-1]
    assert f"the server counted {counted} " in " ".join(result.stdout.split())


def test_an_open_loop_keeps_to_its_schedule_and_counts_errors_by_kind(
    perf_server: ServerProcess, tmp_path: Path
) -> None:
    # 200 requests a second at a model that serves about 50 (one 20 ms execution at a time, one
    # request queued): most are refused, each counted by its code; none is sent ahead of schedule.
    out = tmp_path / "narrow.json"
    result = perf(
        "-m", "narrow", "-u", perf_server.http_url, "--request-rate", "200", "--request-distribution", "poisson",
        "--shape", "x:4", *SHORT, "--output", "csv", "-f", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 1 and rows[0]["mode"] == "rate" and float(rows[0]["load"]) == 200
    report = json.loads(out.read_text())
    step = report["steps"][0]
    assert step["errors"].get("OVERLOADED", 0) > 0 and int(rows[0]["errors"]) == sum(step["errors"].values())
    assert report["client_requests"] == report["server_requests"] > 0
    seconds = step["windows"] * 0.3
    assert step["send_rate"] * seconds <= 200 * seconds * 1.5 + 10  # Poisson's spread, never a flood


def test_input_data_from_perf_analyzer_json_and_npz(perf_server: ServerProcess, tmp_path: Path) -> None:
    values = [[float(i)] * 16 for i in range(3)]
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"INPUT0": v, "INPUT1": {"content": v, "shape": [16]}} for v in values]}))
    report = perf_json("-m", "add_sub", "-u", perf_server.http_url, "--input-data", str(data), *SHORT)
    assert report["client_requests"] == report["server_requests"] > 0 and report["client_errors"] == {}
    arrays = tmp_path / "data.npz"
    np.savez(arrays, INPUT0=np.ones((5, 7), np.float32))
    report = perf_json(
        "-m", "identity", "-u", perf_server.http_url, "--input-data", str(arrays), "--shape", "INPUT0:7", *SHORT
    )
    assert report["client_requests"] == report["server_requests"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--concurrency", "0"), "concurrency '0' must be whole numbers above 0"),
        (("--concurrency", "1:8:x1"), "must be START:END:STEP"),
        (("--concurrency", "2", "--request-rate", "10"), "not both"),
        (("-m", "nope"), "model 'nope' is not loaded or not in the repository"),
        (("-m", "identity"), "input 'INPUT0' has a variable dimension"),
        (("--shape", "INPUT0"), "must be NAME:d1,d2"),
        (("--input-data", "missing.json"), "does not exist"),
        (("-b", "9"), "over model 'add_sub''s max_batch_size 8"),
        (("-u", "ftp://x:1"), "scheme must be http://, https://, grpc:// or grpcs://"),
    ],
)
def test_bad_arguments_are_one_line_errors(perf_server: ServerProcess, args: tuple[str, ...], message: str) -> None:
    base = {"-m": "add_sub", "-u": perf_server.http_url}
    for flag in ("-m", "-u"):
        if flag in args:
            base.pop(flag)
    result = perf(*(a for pair in base.items() for a in pair), *args, *SHORT)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.stderr


def test_a_server_that_is_not_there_is_a_one_line_error() -> None:
    result = perf("-m", "add_sub", "-u", f"127.0.0.1:{free_port()}", *SHORT)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is unavailable" in lines[0], result.stderr


def test_the_locust_file_runs_headless(perf_server: ServerProcess, tmp_path: Path) -> None:
    locustfile = perf("--locustfile").stdout.strip()
    locust = Path(sys.executable).with_name("locust")
    # Six users at a model that holds one execution and one queued request: some are served, the
    # rest refused, and Locust's failure table names the server's error code.
    result = subprocess.run(
        [
            str(locust), "-f", locustfile, "--host", f"http://{perf_server.http_url}", "--model", "narrow",
            "--shape", "x:4", "--headless", "-u", "6", "-r", "6", "-t", "2s", "--csv", str(tmp_path / "run"),
            "--only-summary",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr  # 1: some requests failed, as intended
    stats = {row["Name"]: row for row in csv.DictReader(io.StringIO((tmp_path / "run_stats.csv").read_text()))}
    assert int(stats["infer"]["Request Count"]) > int(stats["infer"]["Failure Count"]) > 0
    failures = list(csv.DictReader(io.StringIO((tmp_path / "run_failures.csv").read_text())))
    assert {row["Error"] for row in failures} == {"CatchResponseError('OVERLOADED: HTTP 503')"}

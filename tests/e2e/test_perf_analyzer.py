"""Triton's own C++ perf_analyzer drives inferd unchanged, over HTTP (binary and JSON) and gRPC."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from inferd.testing.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.perf_analyzer]

PERF_ANALYZER = Path(__file__).resolve().parents[2] / "scripts" / "perf_analyzer"


@pytest.mark.parametrize(
    ("protocol", "extra"),
    [
        ("http", ["--input-tensor-format", "binary"]),
        ("http", ["--input-tensor-format", "json", "--input-data", "zero"]),
        ("grpc", []),
    ],
    ids=["http-binary", "http-json", "grpc"],
)
def test_perf_analyzer_runs_without_errors(server: ServerProcess, protocol: str, extra: list[str]) -> None:
    url = server.http_url if protocol == "http" else server.grpc_url
    completed = subprocess.run(
        [
            str(PERF_ANALYZER),
            "-m",
            "add_sub",
            "-u",
            url,
            "-i",
            protocol,
            "--concurrency-range",
            "2",
            "--measurement-interval",
            "1000",
            "--max-trials",
            "10",
            "--stability-percentage",
            "500",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert "error" not in output.lower(), output
    throughput = re.search(r"Throughput: ([\d.]+) infer/sec", output)
    assert throughput is not None, output
    assert float(throughput.group(1)) > 0

#!/usr/bin/env python3
"""Served throughput against in-process ONNX Runtime, for the example MiniLM model, in one run.

    make example && .venv/bin/python benchmarks/serving_core.py [--seconds 10]

1. In-process: an ONNX Runtime session set up as inferd sets up its own (all cores for one
   instance), batch 1, run back to back: the ceiling a server could reach at concurrency 1.
2. Served: `inferd serve` in a subprocess with every feature on (validation, metrics, request ids,
   default JSON logging), loaded by Triton's C++ perf_analyzer at concurrency 1, over HTTP with
   binary tensors and over gRPC, with the tokenized example sentence as input.
Prints each throughput and its ratio to the in-process figure.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from rich.console import Console
from rich.table import Table

from inferd.runtimes.base import cores_available
from inferd.testing.server import run_server

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = ROOT / "examples" / "model_repository"
REQUEST = ROOT / "examples" / "requests" / "minilm.json"
PERF_ANALYZER = ROOT / "scripts" / "perf_analyzer"


def example_inputs() -> dict[str, np.ndarray]:
    document = json.loads(REQUEST.read_text())
    return {i["name"]: np.array(i["data"], dtype=np.int64).reshape(i["shape"]) for i in document["inputs"]}


def in_process_throughput(seconds: float) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = cores_available()
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        str(REPOSITORY / "minilm" / "1" / "model.onnx"), sess_options=options, providers=["CPUExecutionProvider"]
    )
    feeds = example_inputs()
    for _ in range(5):
        session.run(["sentence_embedding"], feeds)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(["sentence_embedding"], feeds)
        count += 1
    return count / (time.perf_counter() - started)


def perf_analyzer_data_file(directory: Path) -> Path:
    rows = {name: {"content": array.reshape(-1).tolist(), "shape": [128]} for name, array in example_inputs().items()}
    path = directory / "minilm-input.json"
    path.write_text(json.dumps({"data": [rows]}))
    return path


def served_throughput(url: str, protocol: str, data_file: Path, seconds: float) -> float:
    command = [
        str(PERF_ANALYZER),
        "-m",
        "minilm",
        "-u",
        url,
        "-i",
        protocol,
        "--concurrency-range",
        "1",
        "--input-data",
        str(data_file),
        "--measurement-interval",
        str(int(seconds * 1000)),
        "--stability-percentage",
        "20",
        "--max-trials",
        "6",
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600).stdout
    match = re.search(r"Throughput: ([\d.]+) infer/sec", output)
    if match is None:
        raise RuntimeError(f"perf_analyzer printed no throughput:\n{output}")
    return float(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measurement window")
    args = parser.parse_args()
    if not (REPOSITORY / "minilm" / "1" / "model.onnx").is_file():
        print("examples/model_repository/minilm is missing: run `make example` first", file=sys.stderr)
        return 2
    console = Console()
    with console.status("in-process ONNX Runtime, batch 1"):
        baseline = in_process_throughput(args.seconds)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        data_file = perf_analyzer_data_file(Path(scratch))
        with run_server(REPOSITORY, Path(scratch) / "server.log") as server:
            for label, url, protocol in (("HTTP binary", server.http_url, "http"), ("gRPC", server.grpc_url, "grpc")):
                with console.status(f"served over {label}, concurrency 1"):
                    results[label] = served_throughput(url, protocol, data_file, args.seconds)
    table = Table(title="MiniLM (seq 128), batch 1: served / in-process ONNX Runtime")
    table.add_column("path")
    table.add_column("inferences/s", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("in-process ONNX Runtime", f"{baseline:.1f}", "1.000")
    for label, throughput in results.items():
        table.add_row(f"inferd, {label}, concurrency 1", f"{throughput:.1f}", f"{throughput / baseline:.3f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

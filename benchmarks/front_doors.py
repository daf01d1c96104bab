#!/usr/bin/env python3
"""BERT-class inference (all-MiniLM-L6-v2, 128 tokens) through TF Serving's gRPC door and KServe v2's
gRPC door of ONE inferd, in turns, at concurrency 1: the published TF Serving measurement (a Python
client, 100 Predict requests of 128-token inputs, mean latency; 56.5 ms on other hardware) and the
same requests over KServe v2 beside it.

    .venv/bin/python benchmarks/front_doors.py [--requests 100] [--rounds 5]

Target (issue 13): the two doors' mean latencies within 5% of each other (the median of the
rounds' ratios). Clients: KServe v2 with tritonclient's gRPC client; TF Serving with a gRPC stub
of inferd's wire-compatible messages (the official tensorflow-serving-api client sends the same
bytes; its venv is the tests', not the benchmark's). Builds minilm with the example's script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from rich.console import Console
from rich.table import Table

from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc
from inferd.testing.server import free_port, run_server

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 128
NAMES = ("input_ids", "attention_mask", "token_type_ids")
console = Console()


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, size=(1, TOKENS), dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def kserve_call(url: str, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
    client = grpcclient.InferenceServerClient(url)
    tensors = []
    for name in NAMES:
        tensor = grpcclient.InferInput(name, list(feeds[name].shape), "INT64")
        tensor.set_data_from_numpy(feeds[name])
        tensors.append(tensor)
    outputs = [grpcclient.InferRequestedOutput("sentence_embedding")]

    def call() -> None:
        client.infer("minilm", tensors, outputs=outputs)

    return call


def tfserving_call(url: str, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
    stub = serving_grpc.PredictionServiceStub(grpc.insecure_channel(url))
    request = serving_pb.PredictRequest()
    request.model_spec.name = "minilm"
    request.output_filter.append("sentence_embedding")
    for name in NAMES:
        proto = request.inputs[name]
        proto.dtype = tf_pb.DT_INT64
        proto.tensor_shape.dim.extend(tf_pb.TensorShapeProto.Dim(size=s) for s in feeds[name].shape)
        proto.int64_val.extend(feeds[name].ravel().tolist())  # as tf.make_tensor_proto writes int64

    def call() -> None:
        stub.Predict(request, timeout=30)

    return call


def mean_ms(call: Callable[[], None], requests: int) -> tuple[float, float]:
    for _ in range(5):  # warm the connection and the model
        call()
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        call()
        latencies.append((time.perf_counter() - started) * 1000)
    return statistics.fmean(latencies), statistics.median(latencies)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inferd-doors-") as work:
        root = Path(work) / "repository"
        console.print("building minilm (one export) ...")
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "build_example_repository.py"), "--output", str(root),
             "--requests-output", str(Path(work) / "requests"), "--models", "minilm"],
            check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        tf_port = free_port()
        with run_server(root, Path(work) / "server.log", "--tfserving-grpc-port", str(tf_port)) as server:
            feeds = inputs()
            doors = {
                "KServe v2 gRPC": kserve_call(server.grpc_url, feeds),
                "TF Serving gRPC": tfserving_call(f"127.0.0.1:{tf_port}", feeds),
            }
            results: dict[str, list[tuple[float, float]]] = {door: [] for door in doors}
            for round_index in range(args.rounds):
                order = list(doors) if round_index % 2 == 0 else list(reversed(doors))
                for door in order:
                    results[door].append(mean_ms(doors[door], args.requests))
                console.print(
                    f"round {round_index + 1}: "
                    + ", ".join(f"{door} mean {results[door][-1][0]:.2f} ms" for door in doors)
                )
    table = Table(title=f"MiniLM, {TOKENS} tokens, concurrency 1, {args.requests} requests x {args.rounds} rounds")
    for column in ("door", "mean ms (median of rounds)", "p50 ms", "rounds' means"):
        table.add_column(column)
    for door, rounds in results.items():
        table.add_row(
            door,
            f"{statistics.median(m for m, _ in rounds):.2f}",
            f"{statistics.median(p for _, p in rounds):.2f}",
            ", ".join(f"{m:.2f}" for m, _ in rounds),
        )
    console.print(table)
    ratios = [
        tf[0] / kserve[0] for tf, kserve in zip(results["TF Serving gRPC"], results["KServe v2 gRPC"], strict=True)
    ]
    ratio = statistics.median(ratios)
    console.print(
        f"TF Serving / KServe mean latency: {ratio:.3f} (rounds {', '.join(f'{r:.3f}' for r in ratios)}); "
        f"target within 5%: {'met' if abs(ratio - 1) <= 0.05 else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

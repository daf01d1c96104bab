#!/usr/bin/env python3
"""Sentence-pair similarity (tokenizer → all-MiniLM-L6-v2 → mean pooling → cosine) three ways, in
turns, in ONE run: in-process (tokenizers + ONNX Runtime + numpy in a loop, at its best batch),
the example's ensemble served by one inferd, and the same pipeline split across two inferd
processes (the encoder as a `remote` model). Served paths are driven by wrk, one pair per request.

    .venv/bin/python benchmarks/pipeline.py [--seconds 5] [--rounds 3]

Targets (issue 12): the ensemble >= 0.9x the in-process best at concurrency 16 and <= +1 ms p50
at concurrency 1 (over in-process batch 1); the split <= +2 ms p50 at concurrency 1 (measured with
the remote model over each protocol: HTTP with binary tensors, the default, and gRPC). The median
of the rounds counts. Builds the pipeline with scripts/build_example_repository.py (one export).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from rich.console import Console
from rich.table import Table
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import Measurement, wrk

from inferd.testing.models import write_config
from inferd.testing.server import run_server

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ("minilm", "tokenizer", "mean_pooling", "cosine", "sentence_similarity")
PAIR = ("A man is playing a guitar on the stage.", "Someone plays the guitar in front of a crowd.")
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
console = Console()


def build(root: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_example_repository.py"), "--output", str(root),
         "--requests-output", str(root / ".requests"), "--models", *PIPELINE],
        check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
    )  # fmt: skip


class InProcess:
    """The pipeline by hand, as a user without a server would run it: one thread, batches of pairs."""

    def __init__(self, root: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(root / "tokenizer" / "1" / "tokenizer.json"))
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # the longest of the batch, as served
        self.session = ort.InferenceSession(
            str(root / "minilm" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
        )

    def similarity(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch([p[0] for p in pairs] + [p[1] for p in pairs])
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        (hidden,) = self.session.run(["last_hidden_state"], feeds)
        mask = feeds["attention_mask"][:, :, None].astype(np.float32)
        mean = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        embeddings = mean / np.linalg.norm(mean, axis=1, keepdims=True)
        a, b = embeddings[: len(pairs)], embeddings[len(pairs) :]
        return (a * b).sum(axis=1)

    def best_rate(self, seconds: float) -> tuple[int, float]:
        """(batch size, pairs/s) of the best batch, each size measured for its share of `seconds`."""
        rates = {}
        for size in BATCH_SIZES:
            batch = [PAIR] * size
            self.similarity(batch)
            count, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds / len(BATCH_SIZES) or count < 2:
                self.similarity(batch)
                count += 1
            rates[size] = count * size / (time.perf_counter() - started)
        best = max(rates, key=lambda size: rates[size])
        return best, rates[best]

    def p50_us(self, seconds: float) -> float:
        durations = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds or len(durations) < 5:
            t = time.perf_counter()
            self.similarity([PAIR])
            durations.append(time.perf_counter() - t)
        return float(np.median(durations)) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    body = json.dumps(
        {
            "inputs": [
                {"name": "SENTENCE_A", "datatype": "BYTES", "shape": [1, 1], "data": [PAIR[0]]},
                {"name": "SENTENCE_B", "datatype": "BYTES", "shape": [1, 1], "data": [PAIR[1]]},
            ],
            "outputs": [{"name": "SIMILARITY"}],
        }
    ).encode()
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        with console.status("building the pipeline (one MiniLM export)"):
            build(scratch / "whole")
        model_side = scratch / "model_side"
        (model_side / "minilm").mkdir(parents=True)
        shutil.copytree(scratch / "whole" / "minilm", model_side / "minilm", dirs_exist_ok=True)
        in_process = InProcess(scratch / "whole")
        with (
            run_server(scratch / "whole", scratch / "whole.log") as whole,
            run_server(model_side, scratch / "model_side.log") as remote_side,
        ):
            fronts = {}
            for protocol, url in (("http", remote_side.http_url), ("grpc", remote_side.grpc_url)):
                front = fronts[protocol] = scratch / f"front_{protocol}"
                for name in PIPELINE[1:]:
                    shutil.copytree(scratch / "whole" / name, front / name)
                write_config(
                    front / "minilm",
                    f'backend: "remote"\nmax_batch_size: 32\ndynamic_batching {{ }}\n'
                    f'parameters {{ key: "url" value {{ string_value: "{url}" }} }}\n'
                    f'parameters {{ key: "protocol" value {{ string_value: "{protocol}" }} }}',
                )
            with (
                run_server(fronts["http"], scratch / "front_http.log") as split_http,
                run_server(fronts["grpc"], scratch / "front_grpc.log") as split_grpc,
            ):
                paths = {"ensemble": whole, "split (http)": split_http, "split (grpc)": split_grpc}
                want = in_process.similarity([PAIR])[0]
                for server in paths.values():  # the same answer first: the comparison is of the same work
                    reply = json.loads(_post(server.http_url, body))
                    assert abs(reply["outputs"][0]["data"][0] - want) < 1e-5, reply
                rates: dict[str, list[float]] = {}
                p50s: dict[str, list[float]] = {}
                best_batch = 0
                with console.status("measuring in turns") as status:
                    for round_index in range(args.rounds):
                        status.update(f"round {round_index + 1}/{args.rounds}: in-process")
                        best_batch, rate = in_process.best_rate(args.seconds)
                        rates.setdefault("in-process", []).append(rate)
                        p50s.setdefault("in-process", []).append(in_process.p50_us(args.seconds / 2))
                        for label, server in paths.items():
                            url = f"http://{server.http_url}/v2/models/sentence_similarity/infer"
                            for concurrency in (1, 16):
                                status.update(f"round {round_index + 1}/{args.rounds}: {label}, c={concurrency}")
                                m: Measurement = wrk(url, body, concurrency, args.seconds, scratch)
                                if concurrency == 16:
                                    rates.setdefault(label, []).append(m.throughput)
                                else:
                                    p50s.setdefault(label, []).append(m.p50_us)
    table = Table(
        title=f"sentence-pair similarity, median of {args.rounds} rounds in turns (wrk, one pair per request)"
    )
    for column in ("path", "c=16 pairs/s", "/ in-process best", "c=1 p50 us", "+ over in-process"):
        table.add_column(column, justify="left" if column == "path" else "right")
    base_rate, base_p50 = statistics.median(rates["in-process"]), statistics.median(p50s["in-process"])
    for label in ("in-process", *paths):
        rate, p50 = statistics.median(rates[label]), statistics.median(p50s[label])
        name = f"in-process (best batch {best_batch} pairs; c=1: one pair)" if label == "in-process" else label
        table.add_row(
            name, f"{rate:,.1f}", f"{rate / base_rate:.3f}", f"{p50:,.0f}", f"{(p50 - base_p50) / 1000:+.2f} ms"
        )
    console.print(table)
    return 0


def _post(address: str, body: bytes) -> bytes:
    import http.client

    connection = http.client.HTTPConnection(address, timeout=60)
    try:
        connection.request("POST", "/v2/models/sentence_similarity/infer", body, {"Content-Type": "application/json"})
        return connection.getresponse().read()
    finally:
        connection.close()


if __name__ == "__main__":
    sys.exit(main())

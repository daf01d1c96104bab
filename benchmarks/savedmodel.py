#!/usr/bin/env python3
"""A TensorFlow SavedModel against its ONNX conversion and its bfloat16 rewrite, all served by one
inferd: a BERT-shaped Keras encoder (token embeddings, a self-attention block with a feed-forward
layer, masked mean pooling; `inferd.testing.models.bert_shaped_savedmodel`) saved in TF Serving's
layout, the ONNX file tf2onnx makes of it (`inferd optimize`'s conversion), and the same SavedModel
with `MIXED_PRECISION` bfloat16 (`inferd optimize`'s bf16-tf), each with dynamic batching,
measured with wrk in turns, in ONE run.

    .venv/bin/python benchmarks/savedmodel.py [--seconds 5] [--rounds 3]

Throughput at concurrency 16, p50 at 1 and 16; the median of the rounds counts. Needs wrk and
inferd[tensorflow].
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import Measurement, wrk

from inferd.testing.models import bert_shaped_savedmodel, write_config
from inferd.testing.server import run_server
from inferd.tools.optimize.export import convert_saved_model

console = Console()
CONFIG = "max_batch_size: 16\ndynamic_batching { }"
TOKENS = 32
MODELS = ("bert_tf", "bert_onnx", "bert_tf_bf16")
BF16 = 'parameters { key: "MIXED_PRECISION" value { string_value: "bfloat16" } }'


def build(root: Path) -> None:
    # relu: TensorFlow's exact gelu is an Erfc, which tf2onnx 1.17 leaves unconverted.
    bert_shaped_savedmodel(root / "bert_tf" / "1", seed=0, vocabulary=1000, width=128, activation="relu")
    write_config(root / "bert_tf", CONFIG)
    convert_saved_model(root / "bert_tf" / "1", root / "bert_onnx" / "1" / "model.onnx", "serving_default", "serve")
    write_config(root / "bert_onnx", CONFIG)
    shutil.copytree(root / "bert_tf" / "1", root / "bert_tf_bf16" / "1")
    write_config(root / "bert_tf_bf16", f"{CONFIG}\n{BF16}")


def request_body() -> bytes:
    ids = np.random.default_rng(0).integers(1, 1000, size=(1, TOKENS)).tolist()
    mask = [[1] * (TOKENS - 4) + [0] * 4]
    return json.dumps(
        {
            "inputs": [
                {"name": "input_ids", "datatype": "INT32", "shape": [1, TOKENS], "data": ids},
                {"name": "attention_mask", "datatype": "INT32", "shape": [1, TOKENS], "data": mask},
            ]
        }
    ).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    body = request_body()
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        with console.status("building the SavedModel and converting it with tf2onnx"):
            build(scratch / "repository")
        with run_server(scratch / "repository", scratch / "server.log") as server:
            import urllib.request

            answers = []
            for model in MODELS:  # the same answers first: the comparison is of the same work
                request = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/infer", body)
                with urllib.request.urlopen(request, timeout=60) as response:
                    answers.append(np.array(json.loads(response.read())["outputs"][0]["data"], dtype=np.float32))
            np.testing.assert_allclose(answers[1], answers[0], rtol=1e-3, atol=1e-4)
            np.testing.assert_allclose(answers[2], answers[0], rtol=0.02, atol=0.05)  # bfloat16: 8 bits of mantissa
            results: dict[tuple[str, int], list[Measurement]] = {}
            with console.status("measuring in turns") as status:
                for round_index in range(args.rounds):
                    for concurrency in (1, 16):
                        for model in MODELS:
                            status.update(f"round {round_index + 1}/{args.rounds}: {model}, concurrency {concurrency}")
                            url = f"http://{server.http_url}/v2/models/{model}/infer"
                            m = wrk(url, body, concurrency, args.seconds, scratch)
                            results.setdefault((model, concurrency), []).append(m)
    table = Table(
        title=f"BERT-shaped encoder ({TOKENS} tokens): SavedModel vs its tf2onnx conversion and bfloat16, one inferd, "
        f"wrk in turns, median of {args.rounds} rounds"
    )
    for column in ("model", "c=16 inferences/s", "c=1 p50 us", "c=16 p50 us", "c=16 throughput / SavedModel"):
        table.add_column(column, justify="left" if column == "model" else "right")
    tf_rate = statistics.median(m.throughput for m in results[("bert_tf", 16)])
    for model in MODELS:
        rate = statistics.median(m.throughput for m in results[(model, 16)])
        p50_1 = statistics.median(m.p50_us for m in results[(model, 1)])
        p50_16 = statistics.median(m.p50_us for m in results[(model, 16)])
        table.add_row(model, f"{rate:,.0f}", f"{p50_1:.0f}", f"{p50_16:.0f}", f"{rate / tf_rate:.2f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`inferd analyze` on all-MiniLM-L6-v2, as a user would run it: `inferd optimize` makes the INT8
variant (validated on examples/sentence_pairs.tsv), then analyze searches the example's MiniLM
(its own configuration measured first, in the same run: the baseline) and the variant over
max_batch_size, max_queue_delay, preferred batch size and instance count, at 128-token requests,
for the most inferences a second with p99 within the budget.

    .venv/bin/python benchmarks/analyze_minilm.py [--budget 10] [--p99-budget 250] [--output DIR]

Prints analyze's table and the winner's gain over the model's own configuration; the report
(report.html, profile.json, the winning config.pbtxt) stays in --output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MINILM = ROOT / "examples" / "model_repository" / "minilm"
PAIRS = ROOT / "examples" / "sentence_pairs.tsv"
SHAPES = ("--shape", "input_ids:128", "--shape", "attention_mask:128", "--shape", "token_type_ids:128")


def inferd(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "inferd", *args], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=10, help="configurations measured (the own one included)")
    parser.add_argument("--p99-budget", type=float, default=250.0, help="milliseconds")
    parser.add_argument("--output", type=Path, default=None, help="where analyze writes (default: a temp folder)")
    args = parser.parse_args()
    if not (MINILM / "1" / "model.onnx").is_file():
        sys.exit("build the example first: make example")
    from inferd.testing.models import minilm_files

    output = args.output or Path(tempfile.mkdtemp(prefix="inferd-analyze-minilm-"))
    variants = output / "variants"
    started = time.perf_counter()
    if not (variants / "minilm-int8-dynamic").is_dir():
        inferd("optimize", str(MINILM), "-o", str(variants), "--candidates", "fp32,int8-dynamic",
               "--inputs", str(PAIRS), "--tokenizer", str(minilm_files() / "tokenizer.json"))  # fmt: skip
    inferd("analyze", str(MINILM), "--variant", str(variants / "minilm-int8-dynamic"), "-o", str(output),
           "--budget", str(args.budget), "--p99-budget", str(args.p99_budget), "--concurrency", "1:16:x2",
           "--input-data", "zero", *SHAPES, "--max-batch-sizes", "1,4,8,16,32", "--queue-delays", "0,2000,5000",
           "--instances", "1,2", "-p", "2000", "-r", "5")  # fmt: skip
    results = json.loads((output / "results.json").read_text())["measurements"].values()
    own = next(m for m in results if m["baseline"])
    best = max((m for m in results if m["score"]), key=lambda m: m["score"])
    print(f"\nown configuration: {own['score']:.1f} inferences/s; winner {best['point']}: {best['score']:.1f} "
          f"inferences/s = {best['score'] / own['score']:.2f}x, in {time.perf_counter() - started:.0f} s; "
          f"report: {output / 'report.html'}")  # fmt: skip


if __name__ == "__main__":
    main()

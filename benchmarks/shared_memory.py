#!/usr/bin/env python3
"""What system shared memory saves over binary HTTP, measured with Triton's perf_analyzer against
one `inferd serve`, in turns (binary HTTP, then shared memory, then again, for --rounds):

- `image_identity`: a ResNet-50-sized input (FP32 [3, 224, 224], 602 KB) returned as it came: the
  transport alone, where shared memory saves the most;
- `resnet50`: ResNet-50 itself (benchmarks/resnet50.py, seeded weights), 4000 bytes out: what the
  saving is worth beside a real model's compute.

    .venv/bin/python benchmarks/shared_memory.py [--rounds 3] [--interval-ms 3000] [--concurrency 1]

Needs the `example` extra (torch, to export ResNet-50) and scripts/perf_analyzer.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERF_ANALYZER = ROOT / "scripts" / "perf_analyzer"
sys.path.insert(0, str(ROOT / "benchmarks"))


def build_repository(root: Path) -> None:
    from resnet50 import export

    from inferd.testing.models import identity_model, write_config
    from inferd.types import DataType

    identity_model(root / "image_identity" / "1" / "model.onnx", DataType.FP32, ["batch", 3, 224, 224])
    write_config(root / "image_identity", "max_batch_size: 8")
    export(root / "resnet50" / "1" / "model.onnx")
    write_config(root / "resnet50", "max_batch_size: 8")


def measure(
    model: str, url: str, shared: bool, output_bytes: int, args: argparse.Namespace, out: Path
) -> dict[str, float]:
    command = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", "http", "--concurrency-range",
               str(args.concurrency), "--measurement-interval", str(args.interval_ms), "-f", str(out),
               "--input-data", "zero", "--max-trials", "6"]  # fmt: skip
    if shared:
        command += ["--shared-memory", "system", "--output-shared-memory-size", str(output_bytes)]
    for stability in ("10", "25", "60"):  # a shared, noisy machine may not settle within 10%
        completed = subprocess.run([*command, "--stability-percentage", stability], capture_output=True, text=True)
        if completed.returncode == 0:
            break
    else:
        raise RuntimeError(f"perf_analyzer failed:\n{completed.stdout}\n{completed.stderr}")
    with out.open() as table:
        row = next(csv.DictReader(table))
    return {"throughput": float(row["Inferences/Second"]), "latency_us": float(row["p50 latency"]),
            "p99_us": float(row["p99 latency"])}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    from inferd.testing.server import run_server

    with tempfile.TemporaryDirectory(prefix="inferd-shm-bench-") as scratch:
        root = Path(scratch)
        build_repository(root / "models")
        with run_server(root / "models", root / "server.log") as server:
            url = server.http_url
            models = {"image_identity": 3 * 224 * 224 * 4, "resnet50": 1000 * 4}
            results: dict[tuple[str, bool], list[dict[str, float]]] = {}
            for round_ in range(args.rounds):
                for model, output_bytes in models.items():
                    for shared in (False, True):
                        figures = measure(model, url, shared, output_bytes, args, root / "pa.csv")
                        results.setdefault((model, shared), []).append(figures)
                        print(f"round {round_ + 1} {model:<15} {'shared memory' if shared else 'binary HTTP':<14} "
                              f"{figures['throughput']:8.1f} infer/s  p50 {figures['latency_us'] / 1000:7.3f} ms  "
                              f"p99 {figures['p99_us'] / 1000:7.3f} ms", flush=True)  # fmt: skip
    print(f"\nmedians of {args.rounds} rounds, concurrency {args.concurrency}, perf_analyzer over HTTP:")
    print(f"{'model':<15} {'binary HTTP p50 ms':>19} {'shared mem p50 ms':>18} {'saved ms':>9} {'speed-up':>9}")
    for model in models:
        http = statistics.median(r["latency_us"] for r in results[(model, False)]) / 1000
        shm = statistics.median(r["latency_us"] for r in results[(model, True)]) / 1000
        print(f"{model:<15} {http:>19.3f} {shm:>18.3f} {http - shm:>9.3f} {http / shm:>8.2f}x")


if __name__ == "__main__":
    main()

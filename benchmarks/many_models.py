#!/usr/bin/env python3
"""Many models under a memory budget (the multi-model pattern): N small ONNX models in a
repository on S3 (moto's S3 server on 127.0.0.1) and again on local disk, a budget that holds
about a tenth of them, Zipf-distributed requests (s = 1.1) at concurrency 16 for a bounded time.

    .venv/bin/python benchmarks/many_models.py [--models 1000] [--seconds 30] [--fraction 0.1]

Load comes from wrk (a Lua script draws each request's model from the Zipf distribution), so the
client is not the bottleneck. Printed per repository: requests and failures, the on-demand hit
ratio, loads per second, warm latency (a second wrk run over the 10 most requested models, all
loaded), the latency of the mixed run (cold requests included), each load phase's p50/p99
(fetch, session, warm-up; from inferd's histogram buckets), and peak RSS against the budget.

Peak RSS is the server's VmHWM. What it may exceed the budget by: the server's own footprint
with no model loaded (Python, numpy, onnxruntime, grpc, s3fs), measured at the start of each run
and printed as "base RSS"; the budget bounds the models' estimated memory on top of it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import _wrk_latency_us, run_wrk

from inferd.runtimes.onnx import estimate_memory_bytes
from inferd.testing.models import mlp_model
from inferd.testing.server import ServerProcess, free_port, run_server

console = Console()
ZIPF_S = 1.1
CONCURRENCY = 16


def build_models(root: Path, count: int) -> list[str]:
    names = [f"model{i:04d}" for i in range(count)]
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"building {count} ONNX models", total=count)
        for seed, name in enumerate(names):
            mlp_model(root / name / "1" / "model.onnx", seed=seed)
            progress.advance(task)
    return names


@contextlib.contextmanager
def s3_repository(local: Path, names: list[str]) -> Iterator[str]:
    """The same models uploaded to a fresh moto S3 server; yields the s3:// URL (env set for the server)."""
    import logging
    import os

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 request otherwise

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    saved = dict(os.environ)
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"uploading {len(names)} models to S3", total=len(names))
            for name in names:
                client.upload_file(str(local / name / "1" / "model.onnx"), "bench", f"repo/{name}/1/model.onnx")
                progress.advance(task)
        yield "s3://bench/repo"
    finally:
        os.environ.clear()
        os.environ.update(saved)
        moto.stop()


def zipf_script(names: list[str], path: Path) -> Path:
    weights = 1.0 / np.arange(1, len(names) + 1) ** ZIPF_S
    cdf = np.cumsum(weights) / weights.sum()
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]})
    path.write_text(
        "local names = {" + ",".join(f'"{n}"' for n in names) + "}\n"
        "local cdf = {" + ",".join(f"{c:.9f}" for c in cdf) + "}\n"
        f"wrk.method = 'POST'\nwrk.body = '{body}'\n"
        "wrk.headers['Content-Type'] = 'application/json'\n"
        "math.randomseed(os.time())\n"
        "request = function()\n"
        "  local u, lo, hi = math.random(), 1, #cdf\n"
        "  while lo < hi do local mid = math.floor((lo + hi) / 2)\n"
        "    if cdf[mid] < u then lo = mid + 1 else hi = mid end end\n"
        "  return wrk.format(nil, '/v2/models/' .. names[lo] .. '/infer')\n"
        "end\n"
    )
    return path


def wrk(url: str, script: Path, seconds: float) -> dict[str, float]:
    output = run_wrk(url, script, CONCURRENCY, seconds, threads=2)

    def latency_ms(percentile: str) -> float:
        return _wrk_latency_us(output, f"{percentile}%") / 1e3

    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return {
        "requests": float(re.search(r"(\d+) requests in", output).group(1)),  # type: ignore[union-attr]
        "failures": float(non_2xx.group(1) if non_2xx else 0) + (sum(map(float, errors.groups())) if errors else 0),
        "p50_ms": latency_ms("50"),
        "p99_ms": latency_ms("99"),
    }


def metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as response:
        return response.read().decode()


def value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def histogram_quantile(text: str, name: str, quantile: float, **labels: str) -> float:
    """Prometheus' histogram_quantile over one series' buckets (linear within a bucket), in ms."""
    buckets = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            bound = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    target, previous_bound, previous_count = quantile * buckets[-1][1], 0.0, 0.0
    for bound, count in buckets:
        if count >= target:
            if bound == float("inf"):
                return previous_bound * 1e3
            share = (target - previous_count) / (count - previous_count) if count > previous_count else 1.0
            return (previous_bound + (bound - previous_bound) * share) * 1e3
        previous_bound, previous_count = bound, count
    return float("nan")


def rss_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(
    label: str, repository: str, names: list[str], budget: int, per_model: int, seconds: float, scratch: Path
) -> dict[str, str]:
    flags = ("--model-control-mode", "explicit", "--model-memory-budget", str(budget), "--log-level", "WARNING")
    with run_server(repository, scratch / f"{label}.log", *flags) as server:
        url = f"http://127.0.0.1:{server.http_port}"
        # The server's own footprint: with one model loaded (so that onnxruntime and the storage
        # client are imported and initialized), less that model's estimate.
        one = zipf_script(names[:1], scratch / "one.lua")
        wrk(url, one, 1)
        base_rss = rss_mb(server.process.pid, "VmRSS") - per_model / (1 << 20)
        script = zipf_script(names, scratch / "zipf.lua")
        with console.status(f"{label}: Zipf load, concurrency {CONCURRENCY}, {seconds:.0f} s"):
            mixed = wrk(url, script, seconds)
        after = metrics(server)
        warm_script = zipf_script(names[:10], scratch / "warm.lua")
        with console.status(f"{label}: warm requests (the 10 most requested models)"):
            wrk(url, warm_script, 2)  # make sure all ten are loaded
            warm = wrk(url, warm_script, 5)
        peak = rss_mb(server.process.pid, "VmHWM")
    hits, misses = (
        value(after, "inferd_model_on_demand_requests_total", result="hit"),
        value(after, "inferd_model_on_demand_requests_total", result="miss"),
    )
    loads = value(after, "inferd_model_loads_total", outcome="success")

    def phase(name: str) -> str:
        metric = "inferd_model_load_duration_seconds"
        p50, p99 = (histogram_quantile(after, metric, q, phase=name) for q in (0.5, 0.99))
        return f"{p50:.1f} / {p99:.1f}"

    evictions = value(after, "inferd_model_evictions_total")
    budget_mib = budget / (1 << 20)

    return {
        "requests": f"{mixed['requests']:,.0f}",
        "failures": f"{mixed['failures']:,.0f}",
        "hit ratio": f"{hits / max(1.0, hits + misses):.3f}",
        "loads / s": f"{loads / seconds:.1f} ({loads:,.0f} loads, {evictions:,.0f} evictions)",
        "warm p50 / p99 ms": f"{warm['p50_ms']:.2f} / {warm['p99_ms']:.2f}",
        "mixed p50 / p99 ms": f"{mixed['p50_ms']:.2f} / {mixed['p99_ms']:.2f}",
        "load fetch p50 / p99 ms": phase("fetch"),
        "load session p50 / p99 ms": phase("session"),
        "load warm-up p50 / p99 ms": phase("warmup"),
        "base RSS MiB": f"{base_rss:.0f}",
        "peak RSS MiB (budget + base)": f"{peak:.0f} ({budget_mib:.0f} + {base_rss:.0f} = {budget_mib + base_rss:.0f})",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--fraction", type=float, default=0.1, help="share of the models the budget holds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        local = scratch / "repository"
        names = build_models(local, args.models)
        per_model = estimate_memory_bytes((local / names[0] / "1" / "model.onnx").stat().st_size)
        budget = int(per_model * args.models * args.fraction)
        console.print(
            f"{args.models} models, estimated {per_model / (1 << 20):.2f} MiB each; "
            f"budget {budget / (1 << 20):.0f} MiB "
            f"(about {args.fraction:.0%} of them); Zipf s={ZIPF_S}, concurrency {CONCURRENCY}, {args.seconds:.0f} s"
        )
        results = {}
        with s3_repository(local, names) as url:
            results["S3 (moto)"] = run("s3", url, names, budget, per_model, args.seconds, scratch)
        results["local disk"] = run("local", str(local), names, budget, per_model, args.seconds, scratch)
    table = Table(title="many models under a memory budget")
    table.add_column("")
    for label in results:
        table.add_column(label, justify="right")
    for row in next(iter(results.values())):
        table.add_row(row, *(result[row] for result in results.values()))
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What async inference costs and gives, on a model with dynamic batching (the tiny one, or MiniLM
with `--model minilm`: run `make example` first) of one server with --state-dir, with wrk (a C
load generator) so the client is not what is measured:

1. submit latency: POST .../infer_async at 4 connections (the jobs run meanwhile, as they would);
2. throughput: jobs a second (submitted flat out, until the last has its result written) against
   the same model's real-time requests a second (POST .../infer flat out), in turns;
3. real-time latency while a backlog drains: the model's real-time requests at half its capacity,
   paced, with no backlog and while a backlog of jobs drains, in turns.

    .venv/bin/python benchmarks/async_inference.py [--model tiny|minilm] [--rounds 3] [--seconds 3]

What a job's durable steps cost this machine's disk alone: benchmarks/async_floor.py.

Targets (issue "Async inference"): submit p50 under 5 ms; async throughput at least 0.9x the
real-time throughput; real-time p99 during a drain within 10% of its p99 with no backlog.
Needs wrk (apt-get install wrk).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import (
    MINILM,
    Setup,
    _wrk_latency_us,
    build_repository,
    minilm_model,
    paced_wrk,
    run_wrk,
    tiny_model,
    wrk,
)  # fmt: skip

from inferd.testing.server import ServerProcess, run_server

console = Console(width=160)


def post_script(scratch: Path, body: bytes) -> Path:
    script = scratch / "post.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = {json.dumps(body.decode())}\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    return script


def open_jobs(server: ServerProcess) -> bool:
    """Whether any job is queued or running."""
    for state in ("queued", "running"):
        url = f"http://{server.http_url}/v2/async?state={state}&limit=1"
        with urllib.request.urlopen(url, timeout=30) as response:
            if json.loads(response.read())["jobs"]:
                return True
    return False


def drain(server: ServerProcess, model: str, body: bytes, timeout_s: float = 600.0) -> float:
    """Seconds until no job is queued or running. A last job of the lowest priority is submitted and
    waited for (a long poll: the server is not asked over and over while it drains), then the few
    that ran beside it."""
    started = time.monotonic()
    url = f"http://{server.http_url}/v2/models/{model}/infer_async?priority=-1"
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        status_url = f"http://{server.http_url}{json.loads(response.read())['status_url']}?wait_s=60"
    while True:
        with urllib.request.urlopen(status_url, timeout=90) as response:
            if json.loads(response.read())["state"] not in ("queued", "running"):
                break
        if time.monotonic() - started > timeout_s:
            raise TimeoutError("the backlog did not drain")
    while open_jobs(server):
        time.sleep(0.005)
    return time.monotonic() - started


def submit_flat_out(server: ServerProcess, script: Path, model: str, seconds: float) -> tuple[int, str]:
    output = run_wrk(f"http://{server.http_url}/v2/models/{model}/infer_async", script, 32, seconds)
    if "Non-2xx" in output:
        raise RuntimeError(f"submits failed:\n{output}")
    return int(re.search(r"(\d+) requests in", output).group(1)), output  # type: ignore[union-attr]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "minilm"], default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    if args.model == "minilm" and not MINILM.exists():
        print("minilm: run `make example` first", file=sys.stderr)
        return 2
    model, source = (tiny_model(), None) if args.model == "tiny" else (minilm_model(), MINILM)
    body = model.v2_json()
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        repository = build_repository(scratch / "repository", model, source, Setup(batching=True))
        script = post_script(scratch, body)
        with run_server(repository, scratch / "inferd.log", "--state-dir", str(scratch / "state")) as server:
            infer_url = f"http://{server.http_url}/v2/models/{model.name}/infer"
            submit_url = f"http://{server.http_url}/v2/models/{model.name}/infer_async"
            wrk(infer_url, body, 8, 1.0, scratch)  # warm
            submit_flat_out(server, script, model.name, 1.0)
            drain(server, model.name, body)

            with console.status("submit latency"):
                output = run_wrk(submit_url, script, 4, args.seconds)
                submit_p50, submit_p99 = _wrk_latency_us(output, "50%"), _wrk_latency_us(output, "99%")
                drain(server, model.name, body)

            real_time, async_rate = [], []
            with console.status(f"throughput: real-time and async, {args.rounds} rounds in turns"):
                for _ in range(args.rounds):
                    real_time.append(wrk(infer_url, body, 32, args.seconds, scratch).throughput)
                    started = time.monotonic()
                    jobs, _ = submit_flat_out(server, script, model.name, args.seconds)
                    drain(server, model.name, body)
                    async_rate.append(jobs / (time.monotonic() - started))
            capacity = statistics.median(real_time)

            quiet, busy = [], []
            with console.status(f"real-time p99 at half capacity ({capacity / 2:,.0f}/s), with and without a backlog"):
                for _ in range(args.rounds):
                    quiet.append(paced_wrk(infer_url, body, capacity / 2, args.seconds, scratch).p99_us)
                    # A backlog that outlasts the measurement: submitted first, drained during it.
                    submit_flat_out(server, script, model.name, args.seconds)
                    busy.append(paced_wrk(infer_url, body, capacity / 2, args.seconds, scratch).p99_us)
                    left = open_jobs(server)
                    drain(server, model.name, body)
                    if not left:
                        console.print("[yellow]the backlog drained before the measurement ended[/yellow]")

    title = f"async inference on the {model.name} model ({args.rounds} rounds of {args.seconds:g} s, medians)"
    table = Table(title=title)
    for column in ("measure", "figure", "target"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    table.add_row("submit p50 / p99 (4 connections)", f"{submit_p50 / 1000:.2f} ms / {submit_p99 / 1000:.2f} ms",
                  "p50 < 5 ms")  # fmt: skip
    ratio = statistics.median(async_rate) / capacity
    table.add_row("real-time requests/s (32 connections)", f"{capacity:,.0f}", "")
    table.add_row("async jobs/s (submitted flat out, until all written)", f"{statistics.median(async_rate):,.0f}", "")
    table.add_row("async / real-time", f"{ratio:.2f}", ">= 0.9")
    p99_quiet, p99_busy = statistics.median(quiet), statistics.median(busy)
    table.add_row("real-time p99 at half capacity, no backlog", f"{p99_quiet / 1000:.2f} ms", "")
    table.add_row("real-time p99 at half capacity, backlog draining", f"{p99_busy / 1000:.2f} ms", "")
    table.add_row("draining / no backlog", f"{p99_busy / p99_quiet:.2f}", "<= 1.10")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What an `inferd batch --engine server` job costs a server's online traffic: the online p99 with
the job running against the same server, over the p99 without it, in turns.

One inferd server (the model with dynamic batching, every feature on), online load from wrk at a
fixed pace (a share of the server's measured capacity: open loop, so a slower server shows as a
longer tail, not as fewer requests), and a batch job on the same server through the server engine
(its mini-batches are background work: run only in the room online requests leave). Each round
measures the paced load alone, then with the job (started first, and given a second to get
going), or the other way round (the order alternates); the ratio is the median of the rounds'.
On a machine of few cores the batch job's own process (reading, encoding, writing) takes a share
of the cores the server has: it runs under `nice -n 19`, as the batch page says to run a job
beside a server on the server's machine (--no-nice: at normal priority).

    .venv/bin/python benchmarks/batch_online.py [--model tiny|minilm] [--share 0.5] [--rounds 6] [--seconds 5]
        [--concurrency N] [--no-nice]

Target (issue "Batch transform"): the online p99 within 10% of its p99 without the batch job.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_transform import write_data
from serving import MINILM, Measurement, Setup, build_repository, minilm_model, paced_wrk, tiny_model, wrk

from inferd.testing.server import run_server

ROOT = Path(__file__).resolve().parents[1]
# The job runs as the batch page says to run one beside a server on its own machine: at the
# lowest CPU priority (--no-nice: as it is).
NICE = ["nice", "-n", "19"]
console = Console(width=200)


def start_job(
    url: str, model: str, data: Path, out: Path, output: str, concurrency: int | None, nice: bool
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(NICE if nice else []), str(ROOT / ".venv" / "bin" / "inferd"), "batch", model,
            "--engine", "server", "--url", url,
            "--input", str(data), "--output", str(out), "--outputs", output, "--quiet",
            *(["--max-concurrent-transforms", str(concurrency)] if concurrency else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Stopped with Ctrl-C's signal, which a shell without job control leaves ignored in its children.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def stop_job(job: subprocess.Popen[bytes]) -> bool:
    """Stop the job (Ctrl-C, as a user would); whether it was still running (it must have been)."""
    running = job.poll() is None
    if running:
        job.send_signal(signal.SIGINT)
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
    return running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "minilm"], default="tiny")
    parser.add_argument("--share", type=float, default=0.5, help="online load as a share of the measured capacity")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, help="the job's --max-concurrent-transforms (default: its own)")
    parser.add_argument("--no-nice", action="store_true", help="run the job at normal CPU priority")
    args = parser.parse_args()
    model = tiny_model() if args.model == "tiny" else minilm_model()
    source = None if args.model == "tiny" else MINILM
    output = "y" if args.model == "tiny" else "sentence_embedding"
    body = model.v2_json()
    with tempfile.TemporaryDirectory(prefix="inferd-batch-online-") as scratch:
        folder = Path(scratch)
        repository = build_repository(folder / "repository", model, source, Setup(batching=True))
        data = folder / "data" / "records.jsonl"
        data.parent.mkdir()
        write_data(data, args.model, 2_000_000 if args.model == "tiny" else 50_000)
        with run_server(repository, folder / "server.log") as server:
            url = f"http://127.0.0.1:{server.http_port}"
            infer_url = f"{url}/v2/models/{model.name}/infer"
            capacity = wrk(infer_url, body, 16, args.seconds, folder).throughput
            rate = capacity * args.share
            console.print(f"capacity {capacity:,.0f}/s; online load paced at {rate:,.0f}/s ({args.share:.0%})")
            alone: list[Measurement] = []
            beside: list[Measurement] = []
            for index in range(args.rounds):
                order = ("alone", "beside") if index % 2 == 0 else ("beside", "alone")
                for which in order:
                    if which == "alone":
                        alone.append(paced_wrk(infer_url, body, rate, args.seconds, folder))
                        continue
                    job = start_job(
                        url, model.name, data, folder / f"out-{index}", output, args.concurrency, not args.no_nice
                    )
                    time.sleep(1.0)
                    beside.append(paced_wrk(infer_url, body, rate, args.seconds, folder))
                    if not stop_job(job):
                        sys.exit("the batch job ended before the load did: give it more records")
                console.print(
                    f"round {index + 1}: p99 alone {alone[-1].p99_us / 1000:.2f} ms, "
                    f"with the batch job {beside[-1].p99_us / 1000:.2f} ms"
                )
        table = Table(title=f"online p99 with an inferd batch job on the same server: {args.model}, {rate:,.0f}/s")
        for column in (
            "round",
            "p99 alone ms",
            "p99 with job ms",
            "ratio",
            "p50 alone ms",
            "p50 with job ms",
            "failures",
        ):
            table.add_column(column, justify="right")
        ratios = []
        for index, (a, b) in enumerate(zip(alone, beside, strict=True), start=1):
            ratios.append(b.p99_us / a.p99_us)
            table.add_row(
                str(index), f"{a.p99_us / 1000:.2f}", f"{b.p99_us / 1000:.2f}", f"{ratios[-1]:.2f}x",
                f"{a.p50_us / 1000:.2f}", f"{b.p50_us / 1000:.2f}", str(a.failures + b.failures),
            )  # fmt: skip
        table.add_row("median", "", "", f"{statistics.median(ratios):.2f}x", "", "", "")
        console.print(table)


if __name__ == "__main__":
    main()

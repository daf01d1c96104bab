#!/usr/bin/env python3
"""Endurance: the example repository served at about 70% of the rate it sustains, for a bounded
time, with a model reloaded or swapped every minute; the server's RSS, file descriptors and threads
sampled throughout, failed requests counted and p99 given per window.

    make example && .venv/bin/python benchmarks/soak.py                       # 2 minutes, 30 s windows
    .venv/bin/python benchmarks/soak.py --minutes 30 --window 300             # the long one

Load: wrk (C) paced with a per-request pause at `--load` (0.7) of the flat-out rate, on MiniLM
(`examples/requests/minilm.json`, dynamic batching as the example configures it) and on the tiny
`simple_mlp` at once. Every minute, in turns: MiniLM is loaded again with another config while it
serves (a hot swap to a new session: requests in flight finish on the old one, the rest go to the
new one; none may fail), and `add_sub` is unloaded then loaded again (model management under load).
Targets (issue "Hardening", part 7): 0 failed requests, RSS growth under 1% after the first window (warm-up), and
a flat p99 across windows. Windows, samples and the RSS slope are printed and written as CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import MINILM_REQUEST, Measurement, paced_wrk

from inferd.testing.server import run_server

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "model_repository"
console = Console(width=150)


@dataclass
class Sample:
    at_s: float
    rss_mb: float
    fds: int
    threads: int


@dataclass
class Window:
    index: int
    minilm: Measurement
    tiny: Measurement
    swaps: int
    swap_failures: int
    # Seconds from the start of the load to the window's end.
    ended_s: float = 0.0

    def samples(self, samples: list[Sample], window_s: float) -> list[Sample]:
        return [s for s in samples if self.ended_s - window_s < s.at_s <= self.ended_s]


def sample(pid: int, started: float) -> Sample:
    process = psutil.Process(pid)
    return Sample(
        time.monotonic() - started, process.memory_info().rss / 2**20, process.num_fds(), process.num_threads()
    )


def sample_every_second(pid: int, started: float, stop: threading.Event, samples: list[Sample]) -> None:
    """RSS, fds and threads once a second until `stop`: ONNX Runtime's arena grows with a batch and
    shrinks at the next small one, so a sample a window would read that swing as growth."""
    while not stop.wait(1.0):
        samples.append(sample(pid, started))


def swap_every_minute(http_port: int, stop: threading.Event, log: list[tuple[float, str, int]]) -> None:
    """Swap MiniLM's version and cycle add_sub in turns, one a minute, until `stop`. A load of files
    and config already serving keeps the version serving, so each swap loads MiniLM with a config
    that differs from the one serving (its queue delay, 2999 or 2998 us): a new session every time."""
    turn = 0
    while not stop.wait(60):
        if turn % 2 == 0:
            delay_us = 2999 - turn // 2 % 2
            config = {"max_batch_size": 32, "dynamic_batching": {"max_queue_delay_microseconds": delay_us}}
            name, calls = "swap minilm", [("minilm/load", json.dumps({"parameters": {"config": json.dumps(config)}}))]
        else:
            name, calls = "unload+load add_sub", [("add_sub/unload", ""), ("add_sub/load", "")]
        turn += 1
        status = 200
        for path, body in calls:
            request = urllib.request.Request(
                f"http://127.0.0.1:{http_port}/v2/repository/models/{path}", data=body.encode(), method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    status = max(status, response.status)
            except OSError as error:
                status = getattr(error, "code", 599)
        log.append((time.monotonic(), name, status))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2.0, help="how long to hold the load (default 2)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds per reported window (default 30)")
    parser.add_argument("--load", type=float, default=0.7, help="share of the flat-out rate (default 0.7)")
    parser.add_argument("--csv", type=Path, default=None, help="write windows and samples here (two files)")
    args = parser.parse_args()
    if not (EXAMPLE / "minilm" / "1" / "model.onnx").exists():
        console.print("run `make example` first")
        return 2
    minilm_body = MINILM_REQUEST.read_bytes()
    windows: list[Window] = []
    samples: list[Sample] = []
    swaps: list[tuple[float, str, int]] = []
    with tempfile.TemporaryDirectory(prefix="inferd-soak-") as scratch_dir:
        scratch = Path(scratch_dir)
        arguments = ("--model-control-mode", "explicit", "--load-model", "*")
        with run_server(EXAMPLE, scratch / "server.log", *arguments) as server:
            base = f"http://127.0.0.1:{server.http_port}/v2/models"
            minilm_url, tiny_url = f"{base}/minilm/infer", f"{base}/simple_mlp/infer"
            tiny_body = simple_mlp_body(server.http_port)
            with console.status("flat-out rates (MiniLM, then simple_mlp)"):
                paced_wrk(minilm_url, minilm_body, 0, 3, scratch, connections=8)
                minilm_rate = paced_wrk(minilm_url, minilm_body, 0, 10, scratch, connections=8).throughput * args.load
                tiny_rate = paced_wrk(tiny_url, tiny_body, 0, 5, scratch).throughput * args.load * 0.25
            console.print(
                f"holding MiniLM at {minilm_rate:.0f} req/s ({args.load:.0%} of flat out) and simple_mlp at "
                f"{tiny_rate:,.0f} req/s for {args.minutes:g} min"
            )
            started = time.monotonic()
            stop = threading.Event()
            swapper = threading.Thread(target=swap_every_minute, args=(server.http_port, stop, swaps), daemon=True)
            swapper.start()
            count = max(1, round(args.minutes * 60 / args.window))
            samples.append(sample(server.process.pid, started))
            sampler = threading.Thread(
                target=sample_every_second, args=(server.process.pid, started, stop, samples), daemon=True
            )
            sampler.start()
            with Progress(console=console) as progress, ThreadPoolExecutor(2) as pool:
                task = progress.add_task("soak", total=count)
                for index in range(count):
                    before = len(swaps)
                    minilm = pool.submit(paced_wrk, minilm_url, minilm_body, minilm_rate, args.window, scratch, 8)
                    tiny = pool.submit(paced_wrk, tiny_url, tiny_body, tiny_rate, args.window, scratch, 4)
                    window = Window(index, minilm.result(), tiny.result(), 0, 0, time.monotonic() - started)
                    window.swaps = len(swaps) - before
                    window.swap_failures = sum(1 for _, _, status in swaps[before:] if status != 200)
                    windows.append(window)
                    progress.advance(task)
            stop.set()
            swapper.join(150)
            sampler.join(10)
            samples.append(sample(server.process.pid, started))
            alive = server.process.poll() is None
    report(args, windows, samples, swaps, alive)
    if args.csv is not None:
        write_csv(args.csv, windows, samples)
    return 0


def simple_mlp_body(http_port: int) -> bytes:
    """One row of zeros for the example's simple_mlp, shaped from its metadata."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/simple_mlp", timeout=10) as response:
        metadata = json.loads(response.read())
    inputs = []
    for tensor in metadata["inputs"]:
        shape = [1 if d == -1 else d for d in tensor["shape"]]
        inputs.append(
            {"name": tensor["name"], "shape": shape, "datatype": tensor["datatype"], "data": [0] * int(np.prod(shape))}
        )
    return json.dumps({"inputs": inputs}).encode()


def rss_growth(samples: list[Sample], warmup_s: float) -> tuple[float, float]:
    """(growth %, slope in MiB/hour) after warm-up, from the least-squares line through the samples
    after `warmup_s`: the trend, which the arena's swing around it (tens of MiB either way between a
    batch and the next shrink) does not move as it moves any two single samples."""
    after_warmup = [s for s in samples if s.at_s > warmup_s] or samples
    if len(after_warmup) < 2:
        return 0.0, 0.0
    times = np.array([s.at_s for s in after_warmup])
    rss = np.array([s.rss_mb for s in after_warmup])
    slope, intercept = np.polyfit(times, rss, 1)
    start, end = slope * times[0] + intercept, slope * times[-1] + intercept
    return float((end - start) / start * 100), float(slope * 3600)


def report(
    args: argparse.Namespace,
    windows: list[Window],
    samples: list[Sample],
    swaps: list[tuple[float, str, int]],
    alive: bool,
) -> None:
    table = Table(title=f"Soak: {args.minutes:g} min at {args.load:.0%} of flat out, {args.window:g} s windows")
    for column in ("window", "MiniLM req/s", "MiniLM p99 ms", "tiny req/s", "tiny p99 ms", "failed", "swaps",
                   "RSS MiB min / median / max", "fds max", "threads max"):  # fmt: skip
        table.add_column(column, justify="right")
    for window in windows:
        inside = window.samples(samples, args.window) or samples[-1:]
        rss = [s.rss_mb for s in inside]
        table.add_row(
            str(window.index + 1),
            f"{window.minilm.throughput:.1f}",
            f"{window.minilm.p99_us / 1000:.0f}",
            f"{window.tiny.throughput:,.0f}",
            f"{window.tiny.p99_us / 1000:.1f}",
            str(window.minilm.failures + window.tiny.failures),
            f"{window.swaps} ({window.swap_failures} failed)" if window.swap_failures else str(window.swaps),
            f"{min(rss):.0f} / {float(np.median(rss)):.0f} / {max(rss):.0f}",
            str(max(s.fds for s in inside)),
            str(max(s.threads for s in inside)),
        )
    console.print(table)
    growth, slope = rss_growth(samples[:-1], args.window)  # the last: after the load stopped
    first, last = samples[0], samples[-1]
    failed = sum(w.minilm.failures + w.tiny.failures for w in windows)
    console.print(
        f"start: RSS {first.rss_mb:.0f} MiB, {first.fds} fds, {first.threads} threads; end (load stopped): RSS "
        f"{last.rss_mb:.0f} MiB, {last.fds} fds, {last.threads} threads; {len(samples)} samples"
    )
    console.print(
        f"RSS growth after warm-up (the first window) {growth:+.2f}% by the least-squares line (target < 1%), slope "
        f"{slope:+.1f} MiB/hour; failed requests {failed} (target 0); model swaps {len(swaps)} "
        f"({sum(1 for *_, s in swaps if s != 200)} failed); server alive: {alive}"
    )


def write_csv(path: Path, windows: list[Window], samples: list[Sample]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["window", "minilm_rps", "minilm_p99_ms", "tiny_rps", "tiny_p99_ms", "failed", "ended_s"])
        for window in windows:
            writer.writerow([
                window.index + 1, round(window.minilm.throughput, 1), round(window.minilm.p99_us / 1000, 1),
                round(window.tiny.throughput), round(window.tiny.p99_us / 1000, 2),
                window.minilm.failures + window.tiny.failures, round(window.ended_s, 1),
            ])  # fmt: skip
    samples_path = path.with_name(path.stem + "-samples.csv")
    with samples_path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["at_s", "rss_mb", "fds", "threads"])
        for point in samples:
            writer.writerow([round(point.at_s, 1), round(point.rss_mb, 1), point.fds, point.threads])
    console.print(f"windows written to {path}, samples to {samples_path}")


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""inferd under overload: open-loop load at a multiple (default 4x) of the throughput the server
sustains, on the example MiniLM model with a bounded queue. Prints the shed ratio, the latency of
the admitted requests, the health endpoint's worst latency during the run, the server's peak RSS
and how soon it serves normally after the load stops.

    make example && .venv/bin/python benchmarks/overload.py [--factor 4] [--seconds 20]

The sustainable throughput is measured first with perf_analyzer (closed loop, binary HTTP, best of
concurrency 8/16). The overload itself is open loop at a fixed rate, which a closed-loop C
generator (wrk, perf_analyzer) cannot do; at a few hundred requests per second an asyncio client
is far from being the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import MINILM, minilm_model, perf_analyzer

from inferd.testing.models import write_config
from inferd.testing.server import run_server

console = Console()
MAX_QUEUE_SIZE = 32


def build_repository(root: Path) -> Path:
    (root / "minilm" / "1").mkdir(parents=True)
    (root / "minilm" / "1" / "model.onnx").symlink_to(MINILM)
    write_config(
        root / "minilm",
        "max_batch_size: 32\n"
        "dynamic_batching { max_queue_delay_microseconds: 2000 "
        f"default_queue_policy {{ max_queue_size: {MAX_QUEUE_SIZE} }} }}\n",
    )
    return root


def peak_rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def open_loop(url: str, body: bytes, rate: float, seconds: float) -> list[tuple[int, float]]:
    """Send at `rate` per second for `seconds`, not waiting for answers; (status, latency s) each."""
    results: list[tuple[int, float]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    results.append((response.status, time.perf_counter() - started))
            except aiohttp.ClientError:
                results.append((0, time.perf_counter() - started))

        tasks = []
        start = time.perf_counter()
        for index in range(int(rate * seconds)):
            delay = start + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds + 120)
    return results


async def health_probe(url: str, stop: asyncio.Event) -> list[float]:
    latencies = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.1)
    return latencies


async def run(
    args: argparse.Namespace, server_url: str, body: bytes, rate: float
) -> tuple[list[tuple[int, float]], list[float]]:
    stop = asyncio.Event()
    probe = asyncio.ensure_future(health_probe(f"http://{server_url}/v2/health/live", stop))
    results = await open_loop(f"http://{server_url}/v2/models/minilm/infer", body, rate, args.seconds)
    stop.set()
    return results, await probe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factor", type=float, default=4.0, help="offered load / sustainable throughput")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the overload")
    args = parser.parse_args()
    if not MINILM.exists():
        print("run `make example` first", file=sys.stderr)
        return 2
    model = minilm_model()
    body = model.v2_json()
    with tempfile.TemporaryDirectory() as scratch:
        repository = build_repository(Path(scratch) / "repository")
        with run_server(repository, Path(scratch) / "server.log") as server:
            with console.status("sustainable throughput (perf_analyzer, binary HTTP)"):
                sustained = max(
                    perf_analyzer(model, server.http_url, "http", c, 5, Path(scratch)).throughput for c in (8, 16)
                )
            rss_before, _ = peak_rss_mb(server.process.pid)
            rate = sustained * args.factor
            stats_before = model_statistics(server.http_url)
            with console.status(f"overload: {rate:.0f} requests/s for {args.seconds:.0f} s"):
                results, health = asyncio.run(run(args, server.http_url, body, rate))
            rss_after, rss_peak = peak_rss_mb(server.process.pid)
            inside = server_side_ms(stats_before, model_statistics(server.http_url))
            with console.status("recovery"):
                recovered_after = recovery_s(server.http_url, body)
                # Light traffic after the load: the first small execution gives back the arena
                # the load's batches grew (runtimes.onnx.ArenaShrink).
                for _ in range(5):
                    recovery_s(server.http_url, body)
                    time.sleep(0.2)
            rss_settled, _ = peak_rss_mb(server.process.pid)
    statuses = np.array([s for s, _ in results])
    admitted = np.array([latency for status, latency in results if status == 200]) * 1000
    table = Table(title=f"MiniLM under {args.factor:.0f}x overload (max_queue_size {MAX_QUEUE_SIZE})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, value in (
        ("sustainable throughput (req/s)", f"{sustained:.1f}"),
        ("offered load (req/s)", f"{rate:.1f}"),
        ("requests sent", f"{len(results)}"),
        ("admitted (200)", f"{int((statuses == 200).sum())}"),
        ("shed (503)", f"{int((statuses == 503).sum())}"),
        ("other outcomes", f"{int(((statuses != 200) & (statuses != 503)).sum())}"),
        ("shed ratio", f"{(statuses == 503).mean():.3f}"),
        ("admitted p50 / p99 latency (ms)", f"{np.percentile(admitted, 50):.0f} / {np.percentile(admitted, 99):.0f}"),
        ("server side: queue / compute / whole, mean (ms)", " / ".join(f"{v:.0f}" for v in inside)),
        ("health endpoint worst latency (ms)", f"{max(health) * 1000:.1f}"),
        ("server RSS before / after / peak (MiB)", f"{rss_before:.0f} / {rss_after:.0f} / {rss_peak:.0f}"),
        ("server RSS after light traffic (MiB)", f"{rss_settled:.0f} ({rss_settled / rss_before - 1:+.1%})"),
        ("first normal answer after the load (s)", f"{recovered_after:.2f}"),
    ):
        table.add_row(label, value)
    console.print(table)
    return 0


def model_statistics(server_url: str) -> dict[str, dict[str, int]]:
    """MiniLM's inference_stats (Triton's statistics extension)."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{server_url}/v2/models/minilm/stats", timeout=30) as response:
        return json.loads(response.read())["model_stats"][0]["inference_stats"]  # type: ignore[no-any-return]


def server_side_ms(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> tuple[float, float, float]:
    """Mean queue, compute and whole time inside the server of the requests served in between: what
    the admitted requests' latency at the client has beyond this waited outside the model's queue."""

    def mean(key: str) -> float:
        count = after[key]["count"] - before[key]["count"]
        return (after[key]["ns"] - before[key]["ns"]) / max(1, count) / 1e6

    compute = mean("compute_input") + mean("compute_infer") + mean("compute_output")
    return mean("queue"), compute, mean("success")


def recovery_s(server_url: str, body: bytes) -> float:
    """Seconds from the end of the load until a request is answered 200 (polled, bounded)."""
    import http.client

    started = time.perf_counter()
    while time.perf_counter() - started < 60:
        connection = http.client.HTTPConnection(*server_url.split(":"), timeout=30)
        connection.request("POST", "/v2/models/minilm/infer", body, {"Content-Type": "application/json"})
        if connection.getresponse().status == 200:
            return time.perf_counter() - started
        connection.close()
        time.sleep(0.05)
    return float("inf")


if __name__ == "__main__":
    sys.exit(main())

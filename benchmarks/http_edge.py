#!/usr/bin/env python3
"""The REST edge: `inferd serve` on its own HTTP/1.1 server (server/http11.py) against the same
server on granian's embedded one (`--http-server granian`, server/rsgi.py), in turns.

    .venv/bin/python benchmarks/http_edge.py [--rounds 3] [--seconds 5] [--concurrency 1 8 32]
                                              [--models tiny minilm]

Both servers run throughout with every feature on (inferd's defaults: validation, metrics,
request ids, JSON logs, dynamic batching as the model's config.pbtxt says); each is idle but for
its turn. Load comes from wrk over HTTP JSON (KServe v2 infer, benchmarks/serving.py's body).
Each round measures every concurrency, each edge in turn, the first edge alternating between
rounds so neither always runs on a warmer or cooler machine; before each window the machine's
1-minute load average is awaited below --quiet-load (bounded), and what it was is reported.

Reported per edge and concurrency, as the median of the rounds and their min-max: requests/s,
p50 and p99 latency (wrk), the server process's CPU (user + system seconds over the window's
wall time: cores) and requests/s per core; and granian / inferd as the median of the rounds'
paired ratios. Needs wrk (apt-get install wrk) and granian (pip install 'inferd[granian]').
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import MINILM, Setup, _wait_listening, build_repository, minilm_model, tiny_model, wrk

from inferd.testing.server import free_port, run_server

EDGE_SERVER = Path(__file__).resolve().parent / "baselines" / "edge_server.py"
BARE_EDGES = ("inferd", "granian", "granian-raw")
wait_listening = _wait_listening
# Wide enough for the tables when the output is not a terminal (a log, CI).
console = Console(width=None if sys.stdout.isatty() else 150)


@dataclass(frozen=True)
class Window:
    """One wrk window against one edge."""

    throughput: float
    p50_us: float
    p99_us: float
    cores: float  # the server process's CPU seconds per wall second
    load: float  # the 1-minute load average just before the window

    @property
    def per_core(self) -> float:
        return self.throughput / self.cores if self.cores > 0 else 0.0


def wait_quiet(below: float, timeout_s: float) -> float:
    """Until the 1-minute load average is below `below` (polled every 10 s, at most `timeout_s`);
    the load average then."""
    deadline = time.monotonic() + timeout_s
    load = os.getloadavg()[0]
    while load >= below and time.monotonic() < deadline:
        time.sleep(10)
        load = os.getloadavg()[0]
    return load


@dataclass(frozen=True)
class Target:
    """An edge under test: its server process and the URL wrk posts to."""

    pid: int
    url: str


def measure(target: Target, body: bytes, concurrency: int, args: argparse.Namespace) -> Window:
    load = wait_quiet(args.quiet_load, args.quiet_timeout)
    process = psutil.Process(target.pid)
    before, started = process.cpu_times(), time.perf_counter()
    result = wrk(target.url, body, concurrency, args.seconds, args.scratch)
    after, wall = process.cpu_times(), time.perf_counter() - started
    cpu = (after.user - before.user) + (after.system - before.system)
    return Window(result.throughput, result.p50_us, result.p99_us, cpu / wall, load)


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def in_turns(name: str, body: bytes, targets: dict[str, Target], args: argparse.Namespace) -> None:
    """Every concurrency, each target in turn, `args.rounds` times (the order reversed every other
    round); then the report."""
    edges = list(targets)
    windows: dict[tuple[str, int], list[Window]] = {(e, c): [] for e in edges for c in args.concurrency}
    for edge in edges:  # warm-up: sessions, allocators, the batcher's first batches
        wrk(targets[edge].url, body, max(args.concurrency), 1, args.scratch)
    for round_index in range(args.rounds):
        order = edges if round_index % 2 == 0 else edges[::-1]
        for concurrency in args.concurrency:
            for edge in order:
                with console.status(f"{name}: round {round_index + 1}/{args.rounds}, c={concurrency}, {edge}"):
                    window = measure(targets[edge], body, concurrency, args)
                windows[edge, concurrency].append(window)
                console.print(
                    f"  {name} round {round_index + 1} c={concurrency:<3} {edge:<11} {window.throughput:9,.0f} req/s"
                    f"  p50 {window.p50_us:7.0f} us  p99 {window.p99_us:7.0f} us  {window.cores:.2f} cores"
                    f"  load {window.load:.2f}"
                )
    report(name, edges, windows, args)


def benchmark(name: str, body: bytes, repository: Path, args: argparse.Namespace) -> None:
    """`inferd serve` with each edge, every feature on."""
    scratch = args.scratch
    with (
        run_server(repository, scratch / f"{name}-inferd.log", "--http-server", "inferd") as own,
        run_server(repository, scratch / f"{name}-granian.log", "--http-server", "granian") as granian,
    ):
        servers = {"inferd": own, "granian": granian}
        targets = {
            edge: Target(server.process.pid, f"http://{server.http_url}/v2/models/{name}/infer")
            for edge, server in servers.items()
        }
        in_turns(name, body, targets, args)


def bare(body: bytes, args: argparse.Namespace) -> None:
    """The edges alone (benchmarks/baselines/edge_server.py): a handler that answers a fixed document."""
    processes: dict[str, subprocess.Popen[bytes]] = {}
    targets: dict[str, Target] = {}
    try:
        for edge in BARE_EDGES:
            port = free_port()
            processes[edge] = subprocess.Popen(
                [sys.executable, str(EDGE_SERVER), edge, str(port)],
                stdout=(args.scratch / f"bare-{edge}.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
            wait_listening(port, processes[edge])
            targets[edge] = Target(processes[edge].pid, f"http://127.0.0.1:{port}/v2/models/tiny/infer")
        in_turns("bare edge", body, targets, args)
    finally:
        for process in processes.values():
            process.terminate()
            process.wait(timeout=30)


def report(name: str, edges: list[str], windows: dict[tuple[str, int], list[Window]], args: argparse.Namespace) -> None:
    table = Table(title=f"{name}: the REST edge, HTTP JSON via wrk; median of {args.rounds} rounds in turns (min-max)")
    for column in ("concurrency", "edge", "req/s", "p50 us", "p99 us", "server cores", "req/s per core"):
        table.add_column(column, justify="left" if column == "edge" else "right")

    def rate(value: float) -> str:
        return f"{value:,.0f}"

    def micros(value: float) -> str:
        return f"{value:.0f}"

    def cores(value: float) -> str:
        return f"{value:.2f}"

    base = edges[0]
    ratios = Table(title=f"{name}: each edge / {base}, the median of the rounds' paired ratios (min-max)")
    for column in ("concurrency", "edge", "req/s", "p50", "p99", "req/s per core"):
        ratios.add_column(column, justify="left" if column == "edge" else "right")
    for concurrency in args.concurrency:
        for edge in edges:
            ws = windows[edge, concurrency]
            table.add_row(
                str(concurrency),
                edge,
                spread([w.throughput for w in ws], rate),
                spread([w.p50_us for w in ws], micros),
                spread([w.p99_us for w in ws], micros),
                spread([w.cores for w in ws], cores),
                spread([w.per_core for w in ws], rate),
            )
        for edge in edges[1:]:
            pairs = list(zip(windows[edge, concurrency], windows[base, concurrency], strict=True))

            def ratio(field: Callable[[Window], float], pairs: list[tuple[Window, Window]] = pairs) -> str:
                values = [field(e) / field(b) for e, b in pairs if field(b) > 0]
                return spread(values, lambda v: f"{v:.3f}")

            ratios.add_row(
                str(concurrency),
                edge,
                ratio(lambda w: w.throughput),
                ratio(lambda w: w.p50_us),
                ratio(lambda w: w.p99_us),
                ratio(lambda w: w.per_core),
            )
    console.print(table)
    console.print(ratios)
    loads = [w.load for ws in windows.values() for w in ws]
    load = spread(loads, lambda v: f"{v:.2f}")
    console.print(f"1-minute load average before the windows: {load}; {os.cpu_count()} CPUs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each edge once per concurrency in each")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each wrk window")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--models", nargs="+", default=["tiny"], choices=["tiny", "minilm"])
    parser.add_argument(
        "--bare",
        action="store_true",
        help="measure the edges alone instead (inferd's server, granian through inferd's adapter, granian "
        "with a bare RSGI app), each answering a fixed document: what the adapter costs, and each edge's floor",
    )
    parser.add_argument("--quiet-load", type=float, default=0.7, help="wait for a 1-minute load average below this")
    parser.add_argument("--quiet-timeout", type=float, default=180.0, help="but no longer than this (seconds)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    try:
        import granian  # noqa: F401
    except ImportError:
        print("needs granian (pip install 'inferd[granian]')", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        args.scratch = Path(scratch)
        if args.bare:
            bare(tiny_model().v2_json(), args)
            return 0
        for name in args.models:
            if name == "tiny":
                model, source = tiny_model(), None
            elif MINILM.exists():
                model, source = minilm_model(), MINILM
            else:
                print("minilm: run `make example` first; skipped", file=sys.stderr)
                continue
            repository = build_repository(args.scratch / name, model, source, Setup(batching=True))
            benchmark(name, model.v2_json(), repository, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fuzzing at scale: generated requests for every door (KServe v2 JSON and binary, KServe gRPC
ModelInfer, TF Serving REST and gRPC Predict, SageMaker, TorchServe, OpenAI, the repository and shared memory
routes) against one real `inferd serve` with every door on, from the hypothesis strategies the
tests use (`inferd.testing.strategies`).

    .venv/bin/python benchmarks/fuzz.py [--requests 100000] [--seconds S] [--workers 2] [--rss-every 10000]

It counts requests, answers by class (2xx, 4xx, a 503 that says to retry, any other 5xx), hangs
(no answer within --timeout) and crashes (the server process gone), and samples the server's RSS
at the start, every --rss-every requests and at the end, to show that memory stays bounded. It
exits 1 on any 5xx, hang or crash, and then keeps the server's log in benchmarks/results/.

Workers are processes, each running hypothesis over the call strategies in rounds of --round
examples, so the run is as long as asked and its progress is reported as it goes.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import queue
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from inferd.testing.doors import serve_every_door
from inferd.testing.fuzzing import CLASSES, GrpcSender, HttpSender, Tally
from inferd.testing.strategies import GrpcCall, HttpCall, grpc_calls, http_calls

console = Console()
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class Job:
    http_port: int
    grpc_port: int
    tfserving_grpc_port: int
    requests: int
    deadline: float  # time.time() after which a worker sends no more
    timeout_s: float
    round_size: int


def worker(job: Job, reports: Any, stop: Any) -> None:
    """Send generated calls until the job's share is sent, the deadline passes or `stop` is set;
    report a Tally after each round, or the exception that ended the worker (as text)."""
    http = HttpSender(job.http_port, job.timeout_s)
    grpc = GrpcSender(job.grpc_port, job.tfserving_grpc_port, job.timeout_s)
    # Eight kinds of HTTP call, two of gRPC (KServe's ModelInfer, TF Serving's Predict): one weight each.
    calls = st.one_of(*([http_calls()] * 4), grpc_calls())
    sent = 0
    try:
        while sent < job.requests and time.time() < job.deadline and not stop.is_set():
            tally = fuzz_round(job, calls, min(job.round_size, job.requests - sent), http, grpc, stop)
            sent += tally.requests
            reports.put(tally)
            if tally.requests == 0:
                return
    except Exception as exc:  # the server gone (the main process sees that too), or a bug here
        reports.put(f"a worker stopped: {type(exc).__name__}: {exc}")
    finally:
        http.close()
        grpc.close()


def fuzz_round(
    job: Job, calls: st.SearchStrategy[HttpCall | GrpcCall], count: int, http: HttpSender, grpc: GrpcSender, stop: Any
) -> Tally:
    tally = Tally()

    @settings(
        max_examples=count, deadline=None, database=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(call=calls)
    def each(call: HttpCall | GrpcCall) -> None:
        if stop.is_set() or time.time() >= job.deadline:
            return
        if isinstance(call, HttpCall):
            http.send(call, tally)
        else:
            grpc.send(call, tally)

    each()
    return tally


@dataclass
class Run:
    tally: Tally = field(default_factory=Tally)
    rss: list[tuple[int, float]] = field(default_factory=list)  # (requests so far, MiB)
    crashed: str = ""
    seconds: float = 0.0


def fuzz(args: argparse.Namespace, workspace: Path) -> Run:
    run = Run()
    with serve_every_door(workspace, "--log-level", "error") as door:
        server = psutil.Process(door.server.process.pid)
        run.rss.append((0, server.memory_info().rss / 2**20))
        context = multiprocessing.get_context("spawn")
        reports, stop = context.Queue(), context.Event()
        deadline = time.time() + args.seconds if args.seconds else float("inf")
        shares = [args.requests // args.workers + (i < args.requests % args.workers) for i in range(args.workers)]
        jobs = [
            Job(
                door.server.http_port,
                door.server.grpc_port,
                door.tfserving_grpc_port,
                share,
                deadline,
                args.timeout,
                args.round,
            )
            for share in shares
        ]
        processes = [context.Process(target=worker, args=(job, reports, stop), daemon=True) for job in jobs]
        started = time.perf_counter()
        next_rss = args.rss_every
        columns = (
            TextColumn("fuzzing"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>6.0f}/s  5xx {task.fields[errors]}  hangs {task.fields[hangs]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("fuzz", total=args.requests, rate=0.0, errors=0, hangs=0)
            for process in processes:
                process.start()
            while any(p.is_alive() for p in processes) or not reports.empty():
                with contextlib.suppress(queue.Empty):
                    message = reports.get(timeout=0.5)
                    if isinstance(message, str):
                        run.crashed = run.crashed or message
                    else:
                        run.tally.merge(message)
                done = run.tally.requests
                elapsed = time.perf_counter() - started
                progress.update(
                    task,
                    completed=done,
                    rate=done / elapsed if elapsed else 0.0,
                    errors=run.tally.by_class["5xx"],
                    hangs=run.tally.by_class["hang"],
                )
                if door.server.process.poll() is not None:
                    run.crashed = f"the server exited with {door.server.process.returncode} after {done} requests"
                    stop.set()
                    break
                while done >= next_rss:
                    run.rss.append((done, server.memory_info().rss / 2**20))
                    next_rss += args.rss_every
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
        run.seconds = time.perf_counter() - started
        if not run.crashed and run.rss[-1][0] != run.tally.requests:
            run.rss.append((run.tally.requests, server.memory_info().rss / 2**20))
        if run.crashed or run.tally.by_class["5xx"] or run.tally.by_class["hang"]:
            RESULTS.mkdir(exist_ok=True)
            shutil.copyfile(door.server.log_path, RESULTS / "fuzz-server.log")
    return run


def report(run: Run) -> None:
    tally = run.tally
    summary = Table(title="inferd fuzz: every door, one server")
    summary.add_column("requests", justify="right")
    summary.add_column("seconds", justify="right")
    summary.add_column("per second", justify="right")
    for kind in CLASSES:
        summary.add_column(kind, justify="right")
    summary.add_column("crash")
    summary.add_row(
        f"{tally.requests:,}",
        f"{run.seconds:.0f}",
        f"{tally.requests / run.seconds:.0f}" if run.seconds else "-",
        *(f"{tally.by_class[kind]:,}" for kind in CLASSES),
        run.crashed or "none",
    )
    console.print(summary)
    if tally.retry_codes:
        console.print(
            "retryable 503s by code: " + ", ".join(f"{code} {n:,}" for code, n in tally.retry_codes.most_common())
        )
    doors = Table(title="by door")
    doors.add_column("door")
    doors.add_column("requests", justify="right")
    for kind in CLASSES:
        doors.add_column(kind, justify="right")
    for door, count in sorted(tally.by_door.items()):
        doors.add_row(door, f"{count:,}", *(f"{tally.by_door_class[door, kind]:,}" for kind in CLASSES))
    console.print(doors)
    memory = Table(title="server RSS")
    memory.add_column("after requests", justify="right")
    memory.add_column("MiB", justify="right")
    for done, mib in run.rss:
        memory.add_row(f"{done:,}", f"{mib:.1f}")
    console.print(memory)
    if len(run.rss) > 2:
        # From the first sample under load: start-up and the first requests' one-time costs aside.
        (first_done, first), (last_done, last) = run.rss[1], run.rss[-1]
        growth = f"{first:.1f} -> {last:.1f} MiB ({last - first:+.1f})"
        console.print(f"RSS from {first_done:,} to {last_done:,} requests: {growth}")
    for failure in tally.failures:
        console.print(f"[red]{failure}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests to send in all (default 100000)")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long, whatever was sent")
    parser.add_argument("--workers", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--rss-every", type=int, default=10_000, help="sample the server's RSS every N requests")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds without an answer that make a hang")
    parser.add_argument("--round", type=int, default=500, help="examples per hypothesis round in a worker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inferd-fuzz-") as workspace:
        run = fuzz(args, Path(workspace))
    report(run)
    failed = run.crashed or run.tally.by_class["5xx"] or run.tally.by_class["hang"]
    if failed:
        console.print(f"[red]failed: the server's log is in {RESULTS / 'fuzz-server.log'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

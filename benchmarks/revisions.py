#!/usr/bin/env python3
"""What each of several revisions of inferd costs the tiny model, measured in turns in ONE run: to
find which commit of a change costs what (a bisect of a slowdown) and to check a change's budget
("the hardening must not cost more than 3%").

    .venv/bin/python benchmarks/revisions.py REV [REV ...] [--rounds 8] [--seconds 3]

Each revision's `src/` is exported with git archive (`.` names the working tree) and served with
the same repository, venv and flags (tiny MLP 16 → 64 → 4, dynamic batching, KServe v2 JSON,
every feature on as `inferd serve` defaults it). All servers run throughout; each round measures
each in turn with wrk at concurrency 16 (and p50 at concurrency 1), the order rotated from round
to round so the machine's drift falls on every revision alike. Reported against the first
revision: throughput and CPU per request (user + system of the server's threads, /proc), from
the medians and round by round (median, min .. max). With `--pin`, every server runs on the last
CPU and wrk on the others (the tiny model executes inline, so a server needs one core): the two
no longer take turns on the same cores (the throughput measured is the server's alone, and
higher). Needs wrk, git and Linux (taskset).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import tiny_model, wrk
from tracing import ROOT, Figures, Variant, build_repository, export_baseline, measure, serving

from inferd.testing.server import ServerProcess

console = Console(width=150)


def source_of(ref: str, scratch: Path, index: int) -> Path:
    if ref == ".":
        return ROOT / "src"
    into = scratch / f"rev-{index}"
    into.mkdir()
    return export_baseline(ref, into)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("refs", nargs="+", help="git revisions (the first is the reference; '.' is the working tree)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pin", action="store_true", help="servers on the last CPU, wrk on the others")
    args = parser.parse_args()
    body = tiny_model().v2_json()
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        repository = build_repository(scratch / "repository")
        variants = [Variant(ref, source_of(ref, scratch, i)) for i, ref in enumerate(args.refs)]
        figures = [Figures() for _ in variants]
        with contextlib.ExitStack() as stack:
            servers = [
                stack.enter_context(serving(v, repository, scratch / f"server-{i}.log")) for i, v in enumerate(variants)
            ]
            if args.pin:
                pin(servers)
            for server in servers:  # warm up each: first requests allocate
                wrk(f"http://{server.http_url}/v2/models/tiny/infer", body, args.concurrency, 2, scratch)
            order = list(range(len(variants)))
            with console.status("measuring in turns") as status:
                for round_index in range(args.rounds):
                    shift = round_index % len(order)
                    for i in order[shift:] + order[:shift]:
                        status.update(f"round {round_index + 1}/{args.rounds}: {variants[i].label}")
                        measure(servers[i], body, args, scratch, figures[i])
    report(variants, figures, args)
    return 0


def pin(servers: list[ServerProcess]) -> None:
    """Every thread of every server on the last CPU; this process (and so wrk) on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs")
    for server in servers:
        command = ["taskset", "--all-tasks", "--pid", "--cpu-list", str(cpus[-1]), str(server.process.pid)]
        subprocess.run(command, check=True, capture_output=True)
    os.sched_setaffinity(0, cpus[:-1])


def report(variants: list[Variant], figures: list[Figures], args: argparse.Namespace) -> None:
    table = Table(
        title=f"tiny MLP, wrk in turns: {args.rounds} rounds of {args.seconds:g} s, c={args.concurrency}; "
        f"costs against {variants[0].label}"
    )
    columns = (
        "revision", "req/s median", "spread", "cost", "per round", "CPU us/req", "added", "per round", "p50 us c=1",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "revision" else "right")
    reference = figures[0]
    for variant, f in zip(variants, figures, strict=True):
        lost = [1 - a / b for a, b in zip(f.throughput, reference.throughput, strict=True)]
        added = [a / b - 1 for a, b in zip(f.cpu_us, reference.cpu_us, strict=True)]
        table.add_row(
            variant.label,
            f"{statistics.median(f.throughput):,.0f}",
            f"{(max(f.throughput) - min(f.throughput)) / statistics.median(f.throughput):.1%}",
            f"{1 - statistics.median(f.throughput) / statistics.median(reference.throughput):+.1%}",
            f"{statistics.median(lost):+.1%} ({min(lost):+.1%} .. {max(lost):+.1%})",
            f"{statistics.median(f.cpu_us):.1f}",
            f"{statistics.median(f.cpu_us) / statistics.median(reference.cpu_us) - 1:+.1%}",
            f"{statistics.median(added):+.1%} ({min(added):+.1%} .. {max(added):+.1%})",
            f"{statistics.median(f.p50_us):.0f}",
        )
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())

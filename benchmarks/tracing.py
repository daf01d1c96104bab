#!/usr/bin/env python3
"""What tracing costs the tiny model (MLP 16 → 64 → 4, dynamic batching, KServe v2 JSON), in ONE run:

* off-cost: inferd as a baseline revision built it (`--baseline-ref`, main before tracing) against
  this tree with tracing off. Target: under 2%.
* on-cost: this tree tracing every request (ratio 1.0), exporting by OTLP/gRPC to a receiver on
  127.0.0.1 (inferd.testing.otlp, in this process: on a 2-core machine it competes with the server
  as a local collector would); and configured but sampling nothing (ratio 0).

    .venv/bin/python benchmarks/tracing.py [--baseline-ref main] [--rounds 16] [--seconds 3]

Every server runs throughout; each round measures each of them in turn with wrk at concurrency 16
(and p50 at concurrency 1), the order rotated from round to round so that the machine's drift
falls on every server alike. Two figures per run: requests per second, and the server's CPU time
per request (user + system of all its threads over the run, from /proc, divided by the requests
wrk counted). Throughput moves with whatever else the shared machine runs; CPU per request is what
the server itself spent, and moves much less. Reported per server: the median and the spread
(max - min over median) of each; per comparison: the cost from the medians, and the median and
range of the round-by-round costs. Needs wrk and git; Linux (/proc) for the CPU figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import tiny_model, wrk

from inferd.testing.models import mlp_model, write_config
from inferd.testing.otlp import OtlpReceiver
from inferd.testing.server import ServerProcess, run_server

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=150)
MODEL = "tiny"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Variant:
    label: str
    # Where its inferd package comes from (PYTHONPATH), and how it is started.
    source: Path
    args: tuple[str, ...] = ()


@dataclass
class Figures:
    """One server's runs."""

    throughput: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    """CPU microseconds the server spent per request."""
    p50_us: list[float] = field(default_factory=list)


def build_repository(root: Path) -> Path:
    mlp_model(root / MODEL / "1" / "model.onnx", sizes=(16, 64, 4), seed=0)
    write_config(root / MODEL, "max_batch_size: 32\ndynamic_batching { }")
    return root


def export_baseline(ref: str, into: Path) -> Path:
    """The baseline revision's `src/` (git archive: no checkout, no worktree to clean up)."""
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


@contextlib.contextmanager
def serving(variant: Variant, repository: Path, log: Path) -> Iterator[ServerProcess]:
    env = {name: "" for name in os.environ if name.startswith("OTEL_")}  # only the flags configure tracing
    env["PYTHONPATH"] = str(variant.source)
    with run_server(repository, log, *variant.args, env=env) as server:
        # The package it runs is the one asked for (an editable install must not win over PYTHONPATH).
        probe = subprocess.run(
            [sys.executable, "-c", "import inferd, sys; sys.stdout.write(inferd.__file__)"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        if not probe.stdout.startswith(str(variant.source)):
            raise RuntimeError(f"{variant.label}: PYTHONPATH={variant.source} imports inferd from {probe.stdout}")
        yield server


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of every thread of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def measure(server: ServerProcess, body: bytes, args: argparse.Namespace, scratch: Path, figures: Figures) -> None:
    seconds = max(1, round(args.seconds))  # as wrk runs it
    before = cpu_seconds(server.process.pid)
    loaded = wrk(url(server), body, args.concurrency, seconds, scratch)
    spent = cpu_seconds(server.process.pid) - before
    figures.throughput.append(loaded.throughput)
    figures.cpu_us.append(spent / (loaded.throughput * seconds) * 1e6)
    figures.p50_us.append(wrk(url(server), body, 1, max(1, seconds // 2), scratch).p50_us)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-ref", default="main", help="git revision whose inferd is the baseline")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write every figure here too")
    args = parser.parse_args()
    body = tiny_model().v2_json()
    with tempfile.TemporaryDirectory() as scratch_name, OtlpReceiver(keep=False) as receiver:
        scratch = Path(scratch_name)
        repository = build_repository(scratch / "repository")
        (scratch / "baseline").mkdir()
        here = ROOT / "src"
        variants = [
            Variant(f"baseline ({args.baseline_ref})", export_baseline(args.baseline_ref, scratch / "baseline")),
            Variant("tracing off", here),
            Variant("tracing on, ratio 0", here, ("--otlp-endpoint", receiver.endpoint, "--trace-sample-ratio", "0")),
            Variant("tracing on, ratio 1", here, ("--otlp-endpoint", receiver.endpoint)),
        ]
        figures = {v.label: Figures() for v in variants}
        with contextlib.ExitStack() as stack:
            servers = {
                v.label: stack.enter_context(serving(v, repository, scratch / f"server-{index}.log"))
                for index, v in enumerate(variants)
            }
            for server in servers.values():  # warm up each: first requests allocate
                wrk(url(server), body, args.concurrency, 2, scratch)
            with console.status("measuring in turns") as status:
                for round_index in range(args.rounds):
                    shift = round_index % len(variants)
                    for variant in variants[shift:] + variants[:shift]:
                        status.update(f"round {round_index + 1}/{args.rounds}: {variant.label}")
                        measure(servers[variant.label], body, args, scratch, figures[variant.label])
        spans = receiver.count
    report(variants, figures, args, spans)
    if args.json:
        document = {label: vars(f) for label, f in figures.items()} | {"spans": spans}
        args.json.write_text(json.dumps(document, indent=2))
    return 0


def url(server: ServerProcess) -> str:
    return f"http://{server.http_url}/v2/models/{MODEL}/infer"


def report(variants: list[Variant], figures: dict[str, Figures], args: argparse.Namespace, spans: int) -> None:
    table = Table(title=f"tiny MLP, wrk in turns: {args.rounds} rounds of {args.seconds:g} s, c={args.concurrency}")
    columns = ("server", "requests/s: median", "spread", "CPU us/request: median", "spread", "p50 us at c=1: median")
    for column in columns:
        table.add_column(column, justify="left" if column == "server" else "right")
    for v in variants:
        f = figures[v.label]
        table.add_row(
            v.label,
            f"{statistics.median(f.throughput):,.0f}",
            f"{_spread(f.throughput):.1%}",
            f"{statistics.median(f.cpu_us):.1f}",
            f"{_spread(f.cpu_us):.1%}",
            f"{statistics.median(f.p50_us):.0f}",
        )
    console.print(table)
    base, off, unsampled, on = (v.label for v in variants)
    comparisons = Table(title="costs: throughput lost, CPU per request added (per round: median, min .. max)")
    for column in ("", "throughput", "per round", "CPU/request", "per round", "p50 at c=1"):
        comparisons.add_column(column, justify="left" if not column else "right")
    for label, reference, name in ((off, base, "off-cost"), (unsampled, off, "ratio 0"), (on, off, "on-cost")):
        ours, theirs = figures[label], figures[reference]
        comparisons.add_row(
            f"{name}: {label} vs {reference}",
            *_cost(ours.throughput, theirs.throughput, lambda a, b: 1 - a / b),
            *_cost(ours.cpu_us, theirs.cpu_us, lambda a, b: a / b - 1),
            f"{statistics.median(ours.p50_us) / statistics.median(theirs.p50_us) - 1:+.1%}",
        )
    console.print(comparisons)
    console.print(f"spans received by the OTLP receiver: {spans:,}")


def _cost(ours: list[float], theirs: list[float], cost: Callable[[float, float], float]) -> tuple[str, str]:
    per_round = [cost(a, b) for a, b in zip(ours, theirs, strict=True)]
    overall = cost(statistics.median(ours), statistics.median(theirs))
    return f"{overall:+.1%}", f"{statistics.median(per_round):+.1%} ({min(per_round):+.1%} .. {max(per_round):+.1%})"


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


if __name__ == "__main__":
    sys.exit(main())

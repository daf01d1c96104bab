#!/usr/bin/env python3
"""What tracing costs the tiny model (MLP 16 → 64 → 4, dynamic batching, KServe v2 JSON), in ONE run:

* off-cost: inferd as a baseline revision built it (`--baseline-ref`, main before tracing) against
  this tree with tracing off. Target: under 2%.
* on-cost: this tree tracing every request (ratio 1.0), exporting by OTLP/gRPC to a receiver on
  127.0.0.1 (inferd.testing.otlp, in this process: on a 2-core machine it competes with the server
  as a local collector would); and configured but sampling nothing (ratio 0).

    .venv/bin/python benchmarks/tracing.py [--baseline-ref main] [--rounds 5] [--seconds 8]

Every server runs throughout; each round measures each of them in turn with wrk (throughput at
concurrency 16, p50 at concurrency 1), the order rotated from round to round so that the
machine's drift falls on every server alike. With `--pin` (the default on 2 cores or more) the
servers run on the last core and wrk (and the receiver) on the others, so that the scheduler's
moves do not land in the figures. Reported per server: every round's figure, the median and the
spread (max - min over median); per comparison: the cost from the medians, and the median and
range of the round-by-round costs (the runs of a round are a minute apart at most). Needs wrk
and git; Linux for --pin.
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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import Measurement, tiny_model, wrk

from inferd.testing.models import mlp_model, write_config
from inferd.testing.otlp import OtlpReceiver
from inferd.testing.server import ServerProcess, run_server

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=150)
MODEL = "tiny"


@dataclass(frozen=True)
class Variant:
    label: str
    # Where its inferd package comes from (PYTHONPATH), and how it is started.
    source: Path
    args: tuple[str, ...] = ()


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-ref", default="main", help="git revision whose inferd is the baseline")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2)
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
        throughput: dict[str, list[float]] = {v.label: [] for v in variants}
        latency: dict[str, list[float]] = {v.label: [] for v in variants}
        with contextlib.ExitStack() as stack:
            servers = {
                v.label: stack.enter_context(serving(v, repository, scratch / f"server-{index}.log"))
                for index, v in enumerate(variants)
            }
            if args.pin:
                pin(servers.values())
            for server in servers.values():  # warm up each: first requests allocate
                wrk(url(server), body, args.concurrency, 2, scratch)
            with console.status("measuring in turns") as status:
                for round_index in range(args.rounds):
                    shift = round_index % len(variants)
                    for variant in variants[shift:] + variants[:shift]:
                        status.update(f"round {round_index + 1}/{args.rounds}: {variant.label}")
                        loaded: Measurement = wrk(url(servers[variant.label]), body, args.concurrency, args.seconds,
                                                  scratch)  # fmt: skip
                        alone: Measurement = wrk(url(servers[variant.label]), body, 1, args.seconds / 2, scratch)
                        throughput[variant.label].append(loaded.throughput)
                        latency[variant.label].append(alone.p50_us)
        spans = receiver.count
    report(variants, throughput, latency, args, spans)
    if args.json:
        args.json.write_text(json.dumps({"throughput": throughput, "p50_us": latency, "spans": spans}, indent=2))
    return 0


def pin(servers: Iterable[ServerProcess]) -> None:
    """Every thread of the servers on the last core; this process (and so wrk, started from it)
    on the others."""
    cores = sorted(os.sched_getaffinity(0))
    for server in servers:
        for task in Path(f"/proc/{server.process.pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), {cores[-1]})
    os.sched_setaffinity(0, set(cores[:-1]))


def url(server: ServerProcess) -> str:
    return f"http://{server.http_url}/v2/models/{MODEL}/infer"


def report(
    variants: list[Variant],
    throughput: dict[str, list[float]],
    latency: dict[str, list[float]],
    args: argparse.Namespace,
    spans: int,
) -> None:
    table = Table(title=f"tiny MLP, wrk in turns: {args.rounds} rounds of {args.seconds:g} s, c={args.concurrency}")
    for column in ("server", "requests/s, each round", "median", "spread", "p50 us at c=1 (median)"):
        table.add_column(column, justify="left" if column == "server" else "right")
    for v in variants:
        rates = throughput[v.label]
        median = statistics.median(rates)
        table.add_row(
            v.label,
            " ".join(f"{r:,.0f}" for r in rates),
            f"{median:,.0f}",
            f"{(max(rates) - min(rates)) / median:.1%}",
            f"{statistics.median(latency[v.label]):.0f}",
        )
    console.print(table)
    base, off, unsampled, on = (v.label for v in variants)
    comparisons = Table(title="cost: 1 - throughput / the reference's")
    for column in ("", "cost, from medians", "cost per round: median [min .. max]", "p50 at c=1, from medians"):
        comparisons.add_column(column, justify="left" if not column else "right")
    for label, reference, name in ((off, base, "off-cost"), (unsampled, off, "on, ratio 0"), (on, off, "on-cost")):
        per_round = [1 - t / r for t, r in zip(throughput[label], throughput[reference], strict=True)]
        cost = 1 - statistics.median(throughput[label]) / statistics.median(throughput[reference])
        p50 = statistics.median(latency[label]) / statistics.median(latency[reference]) - 1
        comparisons.add_row(
            f"{name} ({label} vs {reference})",
            f"{cost:+.1%}",
            f"{statistics.median(per_round):+.1%} [{min(per_round):+.1%} .. {max(per_round):+.1%}]",
            f"{p50:+.1%}",
        )
    console.print(comparisons)
    console.print(f"spans received by the OTLP receiver: {spans:,}")


if __name__ == "__main__":
    sys.exit(main())

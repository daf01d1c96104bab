#!/usr/bin/env python3
"""inferd against the floor server at each concurrency, in turns: what request handling costs where
batching cannot hide it.

    .venv/bin/python benchmarks/floor.py [--concurrency 1 8 32] [--rounds 3] [--seconds 3] [--plot FILE.png]

The tiny model (MLP 16 → 64 → 4, dynamic batching, every feature on as `inferd serve` defaults
it) served by inferd, and by the floor server (benchmarks/baselines/floor_server.py: uvicorn +
orjson + ONNX Runtime inline, nothing else), both running throughout. At each concurrency wrk
measures one, then the other, `--rounds` times (serving.py's `median_latency`), so the machine's
drift falls on both alike; each path's median counts. serving.py reports the best of a sweep;
this reports every concurrency, as the one-call issue's targets are stated (inferd ≥ 0.95x the
floor at concurrency 1, 8 and 32). `--plot` draws both throughputs and the ratio (PNG).
Needs wrk (apt-get install wrk).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import FLOOR_SERVER, Measurement, Setup, baseline_server, build_repository, median_latency, tiny_model, wrk

from inferd.testing.models import mlp_model
from inferd.testing.server import run_server

console = Console()


@dataclass(frozen=True)
class Level:
    """The medians of one concurrency's rounds, for inferd and for the floor."""

    concurrency: int
    inferd: Measurement
    floor: Measurement

    @property
    def ratio(self) -> float:
        return self.inferd.throughput / self.floor.throughput


def measure(concurrencies: list[int], rounds: int, seconds: float, scratch: Path) -> list[Level]:
    model = tiny_model()
    path = scratch / "tiny.onnx"
    mlp_model(path, sizes=(16, 64, 4), seed=0)
    repository = build_repository(scratch / "repository", model, None, Setup(batching=True))
    body = model.v2_json()
    levels = []
    with (
        baseline_server(FLOOR_SERVER, [str(path)], scratch) as floor_port,
        run_server(repository, scratch / "inferd.log") as server,
    ):
        urls = {
            "inferd": f"http://{server.http_url}/v2/models/{model.name}/infer",
            "floor": f"http://127.0.0.1:{floor_port}/",
        }
        for url in urls.values():  # warm both
            wrk(url, body, 8, 1.0, scratch)
        for concurrency in concurrencies:
            with console.status(f"concurrency {concurrency}: {rounds} rounds of {seconds:g} s each, in turns"):
                paths = {
                    label: functools.partial(wrk, url, body, concurrency, seconds, scratch)
                    for label, url in urls.items()
                }
                medians = dict(median_latency(paths, rounds))
            levels.append(Level(concurrency, medians["inferd"], medians["floor"]))
    return levels


def report(levels: list[Level], rounds: int, seconds: float) -> None:
    table = Table(title=f"tiny model, inferd and the floor server in turns ({rounds} rounds of {seconds:g} s, medians)")
    for column in ("concurrency", "inferd req/s", "floor req/s", "inferd / floor", "inferd p50 us", "floor p50 us",
                   "inferd p99 us", "floor p99 us"):  # fmt: skip
        table.add_column(column, justify="right")
    for level in levels:
        table.add_row(
            str(level.concurrency),
            f"{level.inferd.throughput:,.0f}",
            f"{level.floor.throughput:,.0f}",
            f"{level.ratio:.3f}",
            f"{level.inferd.p50_us:.0f}",
            f"{level.floor.p50_us:.0f}",
            f"{level.inferd.p99_us:.0f}",
            f"{level.floor.p99_us:.0f}",
        )
    console.print(table)


def plot(levels: list[Level], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    positions = range(len(levels))
    width = 0.38
    axes.bar([p - width / 2 for p in positions], [lv.inferd.throughput for lv in levels], width, label="inferd")
    axes.bar([p + width / 2 for p in positions], [lv.floor.throughput for lv in levels], width, label="floor server")
    for position, level in zip(positions, levels, strict=True):
        top = max(level.inferd.throughput, level.floor.throughput)
        axes.annotate(f"{level.ratio:.2f}x", (position, top), ha="center", va="bottom", fontsize=10)
    axes.set_xticks(list(positions), [f"concurrency {lv.concurrency}" for lv in levels])
    axes.set_ylabel("requests / s")
    axes.set_title(title, fontsize=10)
    axes.legend(loc="upper left")
    axes.margins(y=0.15)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--plot", type=Path, help="write a PNG of both throughputs and their ratio here")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        levels = measure(args.concurrency, args.rounds, args.seconds, Path(scratch))
    report(levels, args.rounds, args.seconds)
    if args.plot is not None:
        title = f"tiny model over v2 HTTP JSON, in turns ({args.rounds} x {args.seconds:g} s, medians); ratio above"
        plot(levels, args.plot, title)
        console.print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

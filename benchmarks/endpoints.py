#!/usr/bin/env python3
"""What an endpoint costs over calling its model directly: the tiny model (dynamic batching, every
feature on) on one server, called by name, through an endpoint of one variant (the model: what
routing costs), and through an endpoint of two variants (90/10 over two versions of it) beside the
client sending the same 90/10 to the two versions itself (the same two batchers, so what is left is
the routing), in turns at each concurrency with wrk (serving.py's `in_turns`: the order reverses
every round; every path is driven by the same wrk script, so each costs the client alike). Each
ratio is the median of the rounds' ratios (each round's endpoint over the same round's baseline),
with the lowest and highest round beside it: the machine's drift falls on both sides of a ratio
alike. Beside each, the server's CPU a request (user + system, from /proc), whose ratio moves far
less with the neighbours' load than the throughput's: at saturation the throughput is the cores over
the CPU a request.

    .venv/bin/python benchmarks/endpoints.py [--concurrency 1 8 32] [--rounds 5] [--seconds 3]

Target (issue "Endpoints"): an endpoint within 3% of the bare model's throughput (one variant over
the model; 90/10 over the client's own 90/10). The endpoint's work per request is a dict lookup, the
round robin's pick (a step of a cycle made when the endpoint is set), the variant header, and the
count under its variant (the window's own `fromlist`, which /metrics reads too): each a C call, so
what an endpoint costs is the few lines of Python around them. Needs wrk (apt-get install wrk).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import Measurement, Setup, build_repository, in_turns, tiny_model, with_server_cpu, wrk_cycle

from inferd.testing.server import run_server

console = Console(width=220)


def median(values: Iterable[float]) -> float:
    return statistics.median(values)


def ratios(measured: list[Measurement], baseline: list[Measurement], field: str = "throughput") -> str:
    """The median of the rounds' ratios of `field`, and [lowest, highest]."""
    each = sorted(getattr(m, field) / getattr(b, field) for m, b in zip(measured, baseline, strict=True))
    return f"{statistics.median(each):.3f} [{each[0]:.2f}, {each[-1]:.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    model = tiny_model()
    body = model.v2_json()
    table = Table(title=f"tiny model: called directly and through an endpoint, in turns ({args.rounds} rounds of "
                        f"{args.seconds:g} s, medians)")  # fmt: skip
    for column in ("concurrency", "model req/s", "one variant req/s", "one / model [range]", "90/10 by client req/s",
                   "90/10 endpoint req/s", "endpoint / client 90/10 [range]", "90/10 endpoint / model",
                   "CPU us a request: model, one, client 90/10, endpoint 90/10", "CPU: one / model [range]",
                   "p50 us: model, one, client 90/10, endpoint 90/10"):  # fmt: skip
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        repository = build_repository(scratch / "repository", model, None, Setup(batching=True))
        (repository / model.name / "2").mkdir()
        (repository / model.name / "2" / "model.onnx").symlink_to(repository / model.name / "1" / "model.onnx")
        config = repository / model.name / "config.pbtxt"
        config.write_text(config.read_text() + "\nversion_policy: { all { } }\n")
        with run_server(repository, scratch / "inferd.log") as server:
            endpoints = {
                "one": [{"name": "only", "model": model.name, "version": "1"}],
                "split": [{"name": "blue", "model": model.name, "version": "1", "weight": 90},
                          {"name": "green", "model": model.name, "version": "2", "weight": 10}],
            }  # fmt: skip
            for name, variants in endpoints.items():
                document = json.dumps({"variants": variants}).encode()
                url = f"http://{server.http_url}/v2/endpoints/{name}"
                urllib.request.urlopen(urllib.request.Request(url, document, method="PUT"), timeout=30).close()
            by_version = [f"/v2/models/{model.name}/versions/{version}/infer" for version in ("1", "2")]
            # Every path is driven by one wrk script (`wrk_cycle`), so each costs the client alike.
            paths = {
                "model": [(by_version[0], 1)],
                "one": [("/v2/models/one/infer", 1)],
                "client split": [(by_version[0], 90), (by_version[1], 10)],
                "split": [("/v2/models/split/infer", 1)],
            }
            base_url = f"http://{server.http_url}"
            for cycle in paths.values():  # warm every path
                wrk_cycle(base_url, cycle, body, 8, 1.0, scratch)
            for concurrency in args.concurrency:
                with console.status(f"concurrency {concurrency}: {args.rounds} rounds, in turns"):
                    measures = {
                        label: functools.partial(
                            with_server_cpu, server.process.pid, args.seconds,
                            functools.partial(wrk_cycle, base_url, cycle, body, concurrency, args.seconds, scratch),
                        )
                        for label, cycle in paths.items()
                    }  # fmt: skip
                    rounds = in_turns(measures, args.rounds)
                bare, one, by_client, split = (rounds[label] for label in paths)
                table.add_row(
                    str(concurrency),
                    f"{median(m.throughput for m in bare):,.0f}",
                    f"{median(m.throughput for m in one):,.0f}",
                    ratios(one, bare),
                    f"{median(m.throughput for m in by_client):,.0f}",
                    f"{median(m.throughput for m in split):,.0f}",
                    ratios(split, by_client),
                    ratios(split, bare),
                    ", ".join(f"{median(m.cpu_us for m in ms):.0f}" for ms in (bare, one, by_client, split)),
                    ratios(one, bare, "cpu_us"),
                    ", ".join(f"{median(m.p50_us for m in ms):.0f}" for ms in (bare, one, by_client, split)),
                )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

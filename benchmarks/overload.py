#!/usr/bin/env python3
"""inferd under overload: open-loop load at a multiple (default 4x) of the throughput the server
sustains, on the example MiniLM model with a bounded queue (max_queue_size 32). Prints, per round,
the admitted requests' rate and latency against the sustainable rate and the time a full queue
takes to drain, the shed ratio, the health endpoint's worst latency, the server-side split of the
admitted requests' time, and the server's RSS before, at its peak and after light traffic.

    make example h2load && .venv/bin/python benchmarks/overload.py [--factor 4] [--seconds 20] [--rounds 2] \
        [--plot FILE.png]

`--plot` draws each queue bound's last round second by second: requests admitted and shed against
the sustainable rate, and the admitted requests' p50 and p99 against the queue-drain time.

Two ways of bounding the queue are measured in turns, each on its own server: inferd's default (the
bound counts queued and executing requests) and Triton's (`max_queue_size_includes_executing:
false`: queued requests only; see core/batcher.py). Targets (issue "Hardening", part 4): admitted p99
within 1.5x the queue-drain time (max_queue_size / sustainable rate), admitted rate >= 0.9x the
sustainable one, RSS back within 10% of its start after the load.

Load comes from h2load (C++, Debian's nghttp2-client), with the same JSON request (all of MiniLM's
outputs, 540 KB of JSON an answer) for both measures: the sustainable rate is the best of closed
loops at concurrency 16 and 32 (keep-alive); the overload is an open loop, a new connection a
request started at a fixed rate whatever the server answers (closed-loop generators such as wrk
and perf_analyzer slow down with the server, and perf_analyzer stops at the first 503), each
request's status and latency logged. The health probe is a second h2load, 10 GETs a second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import MINILM, minilm_model

from inferd.testing.models import write_config
from inferd.testing.server import run_server

console = Console(width=220)
MAX_QUEUE_SIZE = 32
# How each way of bounding the queue is written in the model's config.pbtxt.
BOUNDS = {
    "queued (Triton's)": 'parameters { key: "max_queue_size_includes_executing" value: { string_value: "false" } }\n',
    "queued + executing (the default)": "",
}


def build_repository(root: Path, bound: str) -> Path:
    (root / "minilm" / "1").mkdir(parents=True)
    (root / "minilm" / "1" / "model.onnx").symlink_to(MINILM)
    write_config(
        root / "minilm",
        "max_batch_size: 32\n"
        "dynamic_batching { max_queue_delay_microseconds: 2000 "
        f"default_queue_policy {{ max_queue_size: {MAX_QUEUE_SIZE} }} }}\n" + BOUNDS[bound],
    )
    return root


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def h2load(*arguments: str, timeout_s: float) -> str:
    completed = subprocess.run(
        ["h2load", "--h1", "-t", "1", *arguments], capture_output=True, text=True, timeout=timeout_s, check=True
    )
    return completed.stdout


def closed_loop_rate(url: str, body: Path, concurrency: int, seconds: float) -> float:
    """Requests a second answered 200 by `concurrency` keep-alive connections, each sending again
    when answered."""
    output = h2load(
        "-d", str(body), "-H", "content-type: application/json", "-c", str(concurrency),
        "-D", str(round(seconds)), "--warm-up-time", "2", url, timeout_s=seconds + 60,
    )  # fmt: skip
    succeeded = int(output.split(" succeeded")[0].rsplit(" ", 1)[1])
    return succeeded / round(seconds)


def rate_schedule(rate: float) -> tuple[int, int]:
    """(connections, period in ms) for h2load's --rate and --rate-period closest to `rate` a second."""
    return min(
        ((max(1, round(rate * period / 1000)), period) for period in range(1, 51)),
        key=lambda pair: abs(pair[0] * 1000 / pair[1] - rate),
    )


def open_loop(url: str, body: Path, rate: float, seconds: float, log: Path) -> np.ndarray:
    """Requests started at `rate` a second for `seconds`, each on a connection of its own; rows of
    (start us, status, latency us), status -1 for a failed stream."""
    connections, period_ms = rate_schedule(rate)
    total = round(connections * 1000 / period_ms * seconds)
    h2load(
        "-d", str(body), "-H", "content-type: application/json", "-r", str(connections),
        "--rate-period", f"{period_ms}ms", "-c", str(total), "-n", str(total), "--log-file", str(log),
        url, timeout_s=seconds + 180,
    )  # fmt: skip
    return np.loadtxt(log, dtype=np.int64, ndmin=2)


@dataclass(frozen=True)
class Timeline:
    """The overload second by second, by the second each request started in."""

    admitted: np.ndarray  # requests answered 200
    shed: np.ndarray  # requests answered 503
    p50_ms: np.ndarray  # of the admitted ones (NaN: none admitted that second)
    p99_ms: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray) -> Timeline:
        second = (rows[:, 0] - rows[:, 0].min()) // 1_000_000
        admitted_rows = rows[:, 1] == 200
        bins = np.arange(int(second.max()) + 1)

        def percentile(q: float) -> np.ndarray:
            return np.array([
                np.percentile(rows[(second == s) & admitted_rows, 2], q) / 1000
                if ((second == s) & admitted_rows).any() else np.nan
                for s in bins
            ])  # fmt: skip

        return cls(
            admitted=np.bincount(second[admitted_rows], minlength=len(bins)),
            shed=np.bincount(second[rows[:, 1] == 503], minlength=len(bins)),
            p50_ms=percentile(50),
            p99_ms=percentile(99),
        )


@dataclass(frozen=True)
class Round:
    bound: str
    sustained: float
    offered: float
    admitted_rate: float
    shed: int
    other: int
    p50_ms: float
    p99_ms: float
    health_worst_ms: float
    inside_ms: tuple[float, float, float]
    rss_before: float
    rss_peak: float
    rss_after: float
    timeline: Timeline = field(repr=False)

    @property
    def drain_ms(self) -> float:
        """The time a full queue takes to drain at the sustainable rate."""
        return MAX_QUEUE_SIZE / self.sustained * 1000

    @property
    def p99_over_drain(self) -> float:
        return self.p99_ms / self.drain_ms

    @property
    def admitted_over_sustained(self) -> float:
        return self.admitted_rate / self.sustained

    @property
    def rss_after_over_before(self) -> float:
        return self.rss_after / self.rss_before


def one_round(bound: str, args: argparse.Namespace, scratch: Path) -> Round:
    model = minilm_model()
    body = scratch / "request.json"
    body.write_bytes(model.v2_json())
    folder = Path(tempfile.mkdtemp(dir=scratch))
    repository = build_repository(folder / "repository", bound)
    with run_server(repository, folder / "server.log") as server:
        url = f"http://{server.http_url}/v2/models/minilm/infer"
        sustained = max(closed_loop_rate(url, body, c, args.sustain_seconds) for c in (16, 32))
        rss_before, _ = rss_mb(server.process.pid)
        stats_before = model_statistics(server.http_url)
        rate = sustained * args.factor
        health_log = folder / "health.log"
        health = subprocess.Popen(
            ["h2load", "--h1", "-t", "1", "-c", "1", "--rps", "10", "-n", str(round(args.seconds * 10)),
             "--log-file", str(health_log), f"http://{server.http_url}/v2/health/live"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        rows = open_loop(url, body, rate, args.seconds, folder / "overload.log")
        health.wait(timeout=args.seconds + 60)
        _, rss_peak = rss_mb(server.process.pid)
        inside = server_side_ms(stats_before, model_statistics(server.http_url))
        # Light traffic after the load, a request every half second: the first small execution
        # 10 s or more after the last shrink gives back the arena the load's batches grew
        # (runtimes.onnx.ArenaShrink).
        settle_until = time.monotonic() + args.settle_seconds
        while time.monotonic() < settle_until:
            answer(url, body.read_bytes())
            time.sleep(0.5)
        rss_after, _ = rss_mb(server.process.pid)
    health_rows = np.loadtxt(health_log, dtype=np.int64, ndmin=2)
    duration_s = (rows[:, 0].max() - rows[:, 0].min()) / 1e6
    statuses, latencies_ms = rows[:, 1], rows[:, 2] / 1000
    admitted = latencies_ms[statuses == 200]
    return Round(
        bound=bound,
        sustained=sustained,
        offered=len(rows) / duration_s,
        admitted_rate=len(admitted) / duration_s,
        shed=int((statuses == 503).sum()),
        other=int(((statuses != 200) & (statuses != 503)).sum()),
        p50_ms=float(np.percentile(admitted, 50)),
        p99_ms=float(np.percentile(admitted, 99)),
        health_worst_ms=float(health_rows[:, 2].max() / 1000),
        inside_ms=inside,
        rss_before=rss_before,
        rss_peak=rss_peak,
        rss_after=rss_after,
        timeline=Timeline.of(rows),
    )


def answer(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.status)


def model_statistics(server_url: str) -> dict[str, dict[str, int]]:
    """MiniLM's inference_stats (Triton's statistics extension)."""
    with urllib.request.urlopen(f"http://{server_url}/v2/models/minilm/stats", timeout=30) as response:
        return json.loads(response.read())["model_stats"][0]["inference_stats"]  # type: ignore[no-any-return]


def server_side_ms(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> tuple[float, float, float]:
    """Mean queue, compute and whole time inside the server of the requests served in between."""

    def mean(key: str) -> float:
        count = after[key]["count"] - before[key]["count"]
        return (after[key]["ns"] - before[key]["ns"]) / max(1, count) / 1e6

    compute = mean("compute_input") + mean("compute_infer") + mean("compute_output")
    return mean("queue"), compute, mean("success")


def report(rounds: list[Round], factor: float) -> None:
    table = Table(title=f"MiniLM under {factor:g}x overload, max_queue_size {MAX_QUEUE_SIZE}, open loop (h2load)")
    for column in (
        "queue bound counts", "sustainable req/s", "offered req/s", "admitted req/s (x sustainable)",
        "shed", "other", "admitted p50 / p99 ms", "drain ms", "p99 / drain", "server: queue / compute / whole ms",
        "health worst ms", "RSS MiB before / peak / after (after/before)",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rounds:
        table.add_row(
            r.bound,
            f"{r.sustained:.1f}",
            f"{r.offered:.0f}",
            f"{r.admitted_rate:.1f} ({r.admitted_over_sustained:.2f}x)",
            str(r.shed),
            str(r.other),
            f"{r.p50_ms:.0f} / {r.p99_ms:.0f}",
            f"{r.drain_ms:.0f}",
            f"{r.p99_over_drain:.2f}",
            " / ".join(f"{v:.0f}" for v in r.inside_ms),
            f"{r.health_worst_ms:.1f}",
            f"{r.rss_before:.0f} / {r.rss_peak:.0f} / {r.rss_after:.0f} ({r.rss_after_over_before:.2f})",
        )
    console.print(table)
    summary = Table(title="medians over the rounds, against the targets")
    for column in ("queue bound counts", "p99 / drain (<= 1.5)", "admitted / sustainable (>= 0.9)",
                   "RSS after / before (<= 1.1)", "health worst ms"):  # fmt: skip
        summary.add_column(column, justify="right")
    for bound in BOUNDS:
        mine = [r for r in rounds if r.bound == bound]
        if not mine:
            continue
        summary.add_row(
            bound,
            f"{statistics.median(r.p99_over_drain for r in mine):.2f}",
            f"{statistics.median(r.admitted_over_sustained for r in mine):.2f}",
            f"{statistics.median(r.rss_after_over_before for r in mine):.2f}",
            f"{statistics.median(r.health_worst_ms for r in mine):.1f}",
        )
    console.print(summary)


def plot(rounds: list[Round], path: Path, factor: float) -> None:
    """Each bound's last round, a column each: admitted and shed per second over the
    sustainable rate; the admitted requests' latency over the drain time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = {r.bound: r for r in rounds}
    figure, axes = plt.subplots(2, len(last), figsize=(6 * len(last), 6), sharex=True, squeeze=False)
    for column, r in enumerate(last.values()):
        seconds = np.arange(len(r.timeline.admitted))
        rate, latency = axes[0][column], axes[1][column]
        rate.plot(seconds, r.timeline.admitted, label="admitted (200)", color="tab:green")
        rate.plot(seconds, r.timeline.shed, label="shed (503)", color="tab:red")
        rate.axhline(r.sustained, linestyle="--", color="grey", label=f"sustainable {r.sustained:.0f}/s")
        rate.set_title(f"queue bound counts {r.bound}")
        rate.set_ylabel("requests / s")
        rate.legend(loc="upper right", fontsize="small")
        latency.plot(seconds, r.timeline.p50_ms, label="admitted p50", color="tab:blue")
        latency.plot(seconds, r.timeline.p99_ms, label="admitted p99", color="tab:purple")
        latency.axhline(r.drain_ms, linestyle="--", color="grey", label=f"queue drain {r.drain_ms:.0f} ms")
        latency.axhline(1.5 * r.drain_ms, linestyle=":", color="grey", label="target: 1.5x drain")
        latency.set_ylabel("ms")
        latency.set_xlabel("second of the overload")
        latency.legend(loc="upper right", fontsize="small")
    figure.suptitle(f"MiniLM under {factor:g}x overload, max_queue_size {MAX_QUEUE_SIZE}, open loop (h2load)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factor", type=float, default=4.0, help="offered load / sustainable throughput")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the overload")
    parser.add_argument("--sustain-seconds", type=float, default=8.0, help="length of each closed-loop measure")
    parser.add_argument("--settle-seconds", type=float, default=12.0, help="light traffic after the load")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each queue bound, in turns")
    parser.add_argument("--bound", choices=list(BOUNDS), action="append", help="measure only these bounds")
    parser.add_argument("--plot", type=Path, help="write a PNG of each bound's last round, second by second")
    args = parser.parse_args()
    if not MINILM.exists():
        print("run `make example` first", file=sys.stderr)
        return 2
    if shutil.which("h2load") is None:
        print("h2load not found: run `make h2load` (Debian's nghttp2-client)", file=sys.stderr)
        return 2
    rounds = []
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(args.rounds):
            for bound in args.bound or list(BOUNDS):
                with console.status(f"round {index + 1}/{args.rounds}: queue bound counting {bound}"):
                    rounds.append(one_round(bound, args, Path(scratch)))
                console.print(rounds[-1])
    report(rounds, args.factor)
    if args.plot is not None:
        plot(rounds, args.plot, args.factor)
        console.print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

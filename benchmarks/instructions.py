#!/usr/bin/env python3
"""Instructions per request of several revisions of inferd, counted by callgrind: a cost that the
machine's noise does not move, for budgets of a few percent that timings on shared cores cannot
resolve (the same revision served by `revisions.py` reads 10-56% apart from run to run here).

    .venv/bin/python benchmarks/instructions.py REV [REV ...] [--requests 2000]
    .venv/bin/python benchmarks/instructions.py --endpoints [--requests 2000]

Each revision's `src/` is exported with git archive (`.` names the working tree). In process, with
no socket, a v2 REST request for the tiny MLP (16 → 64 → 4, dynamic batching, every feature as
`inferd serve` defaults it) goes through the server's own `HttpApp`: the route table, the door,
the inference call, the dispatcher, the scheduler and ONNX Runtime. Each revision runs twice under
`valgrind --tool=callgrind` (after the same warm-up, 500 requests and 500 + N), and the difference
of the event loop thread's instructions divided by N is the revision's cost of one request, the
load and the warm-up cancelled out. ONNX Runtime's own threads are left out (their spinning
depends on timing); the model runs inline, on the loop's thread, as the tiny model does when
served. What it does not count: the HTTP parser (`server/http11.py`) and the socket. Needs valgrind.

`--endpoints` measures what an endpoint costs (issue "Endpoints": within 3%), in the working tree:
the tiny model by name (its newest version) and its version 1, a one-variant endpoint of version
1, the client's own 90/10 over versions 1 and 2, and an endpoint of that 90/10, each as a revision
above is (its cycle of request paths repeated), with the ratios of the endpoints over their
baselines (the one-variant endpoint over version 1 and over the model by name, whose path has as
many segments as the endpoint's).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = 500
BODY = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [%s]}]}' % b",".join([b"0.5"] * 16)
console = Console(width=120)


# The request paths a run cycles through (path, times in a row): one model by name by default.
DEFAULT_CYCLE = [("/v2/models/tiny/infer", 1)]
# `--endpoints`: the paths measured, and the endpoints set (through the management API) before.
ENDPOINTS = {
    "one": [{"name": "only", "model": "tiny", "version": "1"}],
    "split": [{"name": "blue", "model": "tiny", "version": "1", "weight": 90},
              {"name": "green", "model": "tiny", "version": "2", "weight": 10}],
}  # fmt: skip
ENDPOINT_CYCLES = {
    "model by name": [("/v2/models/tiny/infer", 1)],
    "model version 1": [("/v2/models/tiny/versions/1/infer", 1)],
    "one-variant endpoint": [("/v2/models/one/infer", 1)],
    "client's own 90/10": [("/v2/models/tiny/versions/1/infer", 9), ("/v2/models/tiny/versions/2/infer", 1)],
    "90/10 endpoint": [("/v2/models/split/infer", 1)],
}


async def drive(repository: Path, requests: int, cycle: list[tuple[str, int]], endpoints: dict[str, object]) -> None:
    """The measured process: `WARM_UP + requests` requests through the server's HttpApp, their
    paths from `cycle`, after `endpoints` are set. Only APIs that every measured revision has
    (since 743666c) are used, endpoints aside."""
    from inferd.config.server import ServerSettings
    from inferd.core.registry import ModelRegistry
    from inferd.core.repository import LocalRepository
    from inferd.core.service import InferenceService
    from inferd.core.statistics import ServingStatistics
    from inferd.server.app import build_router
    from inferd.server.http import HttpApp
    from inferd.server.http11 import HttpRequest

    statistics = ServingStatistics()
    registry = ModelRegistry(LocalRepository(repository), statistics)
    await registry.load_all()
    settings = ServerSettings(model_repository=(str(repository),))
    service = InferenceService(registry, statistics=statistics, limits=settings.request_limits)
    app = HttpApp(build_router(service, settings), max_request_bytes=settings.max_request_bytes)
    for name, variants in endpoints.items():
        body = json.dumps({"variants": variants}).encode()
        answer = await app(HttpRequest("PUT", f"/v2/endpoints/{name}", b"", {}, body))
        if answer.status not in (200, 201):
            raise RuntimeError(f"endpoint '{name}' was answered {answer.status}: {answer.body[:200]!r}")
    headers = {b"content-type": b"application/json"}
    paths = itertools.cycle(
        [HttpRequest("POST", path, b"", headers, BODY) for path, times in cycle for _ in range(times)]
    )
    for request in itertools.islice(paths, WARM_UP + requests):
        response = await app(request)
        if response.status != 200:
            raise RuntimeError(f"the request was answered {response.status}: {response.body[:200]!r}")
        await asyncio.sleep(0)  # a server's next request comes in a later loop turn
    await registry.close()


def loop_thread_instructions(
    source: Path,
    repository: Path,
    requests: int,
    scratch: Path,
    cycle: list[tuple[str, int]] = DEFAULT_CYCLE,
    endpoints: dict[str, object] | None = None,
) -> int:
    """The event loop thread's instructions over a run of `requests` measured requests."""
    out = scratch / f"callgrind.{requests}"
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}.%p",
         sys.executable, __file__, "--drive", str(repository), str(requests), json.dumps(cycle),
         json.dumps(endpoints or {})],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    [main_thread] = scratch.glob(f"callgrind.{requests}.*-01")  # thread 1: the loop's
    summary = re.search(r"^(?:summary|totals): (\d+)", main_thread.read_text(), re.MULTILINE)
    if summary is None:
        raise RuntimeError(f"{main_thread}: no instruction total")
    return int(summary.group(1))


def export(ref: str, into: Path) -> Path:
    if ref == ".":
        return ROOT / "src"
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*")
    parser.add_argument("--requests", type=int, default=2000, help="measured requests per revision")
    parser.add_argument("--endpoints", action="store_true", help="what an endpoint costs, in the working tree")
    parser.add_argument(
        "--drive", nargs=4, metavar=("REPOSITORY", "REQUESTS", "CYCLE", "ENDPOINTS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.drive:
        cycle = [(path, times) for path, times in json.loads(args.drive[2])]
        asyncio.run(drive(Path(args.drive[0]), int(args.drive[1]), cycle, json.loads(args.drive[3])))
        return 0
    if args.endpoints:
        return endpoint_costs(args.requests)
    if not args.revisions:
        parser.error("name at least one revision ('.' is the working tree)")
    from inferd.testing.models import mlp_model, write_config

    costs: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        repository = scratch / "models"
        mlp_model(repository / "tiny" / "1" / "model.onnx")
        write_config(repository / "tiny", "max_batch_size: 32\ndynamic_batching { }")
        for index, revision in enumerate(args.revisions):
            place = scratch / f"revision{index}"
            place.mkdir()
            source = export(revision, place)
            status = console.status(f"{revision}: two runs under callgrind side by side (a minute or two)")
            with status, ThreadPoolExecutor(2) as runs:
                short_run = runs.submit(loop_thread_instructions, source, repository, 0, place)
                long_run = runs.submit(loop_thread_instructions, source, repository, args.requests, place)
                short, long = short_run.result(), long_run.result()
            costs[revision] = (long - short) / args.requests
    table = Table(
        title=f"instructions per request (event loop thread), {args.requests} requests, tiny MLP over v2 REST"
    )
    table.add_column("revision")
    table.add_column("instructions", justify="right")
    table.add_column("against the first", justify="right")
    first = costs[args.revisions[0]]
    for revision, cost in costs.items():
        table.add_row(revision, f"{cost:,.0f}", f"{cost / first - 1:+.1%}")
    console.print(table)
    return 0


def endpoint_costs(requests: int) -> int:
    """`--endpoints`: each of ENDPOINT_CYCLES' instructions per request, and the endpoints' ratios."""
    from inferd.testing.models import mlp_model, write_config

    costs: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        repository = scratch / "models"
        for version in ("1", "2"):
            mlp_model(repository / "tiny" / version / "model.onnx")
        write_config(repository / "tiny", "max_batch_size: 32\ndynamic_batching { }\nversion_policy: { all { } }")
        for index, (label, cycle) in enumerate(ENDPOINT_CYCLES.items()):
            place = scratch / f"path{index}"
            place.mkdir()
            with console.status(f"{label}: two runs under callgrind side by side (a minute or two)"), \
                    ThreadPoolExecutor(2) as runs:  # fmt: skip
                short_run = runs.submit(loop_thread_instructions, ROOT / "src", repository, 0, place, cycle, ENDPOINTS)
                long_run = runs.submit(
                    loop_thread_instructions, ROOT / "src", repository, requests, place, cycle, ENDPOINTS
                )
                short, long = short_run.result(), long_run.result()
            costs[label] = (long - short) / requests
    table = Table(title=f"instructions per request (event loop thread), {requests} requests, tiny MLP over v2 REST")
    table.add_column("path")
    table.add_column("instructions", justify="right")
    table.add_column("against its baseline", justify="right")
    table.add_column("against the model by name", justify="right")
    by_name = "model by name"
    baselines = {"one-variant endpoint": "model version 1", "90/10 endpoint": "client's own 90/10"}
    for label, cost in costs.items():
        baseline = baselines.get(label)
        table.add_row(
            label,
            f"{cost:,.0f}",
            f"{cost / costs[baseline] - 1:+.2%}" if baseline else "",
            f"{cost / costs[by_name] - 1:+.2%}" if label == "one-variant endpoint" else "",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

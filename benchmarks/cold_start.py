#!/usr/bin/env python3
"""What a cold start costs: MiniLM (the example repository's, exported by `make example`) served
alone with `--idle-unload-seconds 1`, its first load at the server's start, then N cold starts:
each waits until the model is scaled to zero, sends one request and reads the load's phases from
the repository index (`load_ms`: fetch, session, warm-up) and the request's own latency.

    make example && .venv/bin/python benchmarks/cold_start.py [--cold-starts 5]

The first load runs in a fresh process (imports, ONNX Runtime's first session, files not yet in
the page cache); the later ones in a warm process, as a model that scaled to zero comes back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from inferd.testing.server import ServerProcess, run_server

ROOT = Path(__file__).resolve().parents[1]
MINILM = ROOT / "examples" / "model_repository" / "minilm"
REQUEST = ROOT / "examples" / "requests" / "minilm.json"
console = Console()


def minilm_entry(server: ServerProcess) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        entries = json.loads(response.read())
    entry: dict[str, Any] = next(e for e in entries if e["name"] == "minilm")
    return entry


def wait_at_zero(server: ServerProcess) -> None:
    deadline = time.monotonic() + 60
    while minilm_entry(server).get("reason") != "scaled to zero":
        if time.monotonic() > deadline:
            raise TimeoutError("MiniLM was never scaled to zero")
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold-starts", type=int, default=5)
    args = parser.parse_args()
    if not (MINILM / "1" / "model.onnx").is_file():
        print("MiniLM not exported: make example", file=sys.stderr)
        return 2
    body = REQUEST.read_bytes()
    rows: list[tuple[str, dict[str, float], float | None]] = []
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder) / "repository"
        shutil.copytree(MINILM, repository / "minilm")
        with run_server(repository, Path(folder) / "server.log", "--idle-unload-seconds", "1") as server:
            rows.append(("first (server start)", dict(minilm_entry(server)["load_ms"]), None))
            for index in range(args.cold_starts):
                wait_at_zero(server)
                started = time.perf_counter()
                request = urllib.request.Request(f"http://{server.http_url}/v2/models/minilm/infer", body)
                with urllib.request.urlopen(request, timeout=60) as response:
                    response.read()
                latency_ms = (time.perf_counter() - started) * 1000
                rows.append((f"cold start {index + 1}", dict(minilm_entry(server)["load_ms"]), latency_ms))
    table = Table(title="MiniLM: the first load and later cold starts (ms)")
    for column in ("load", "fetch", "session", "warm-up", "request (cold start included)"):
        table.add_column(column, justify="right")
    for label, phases, latency in rows:
        table.add_row(label, *(f"{phases.get(k, 0.0):.0f}" for k in ("fetch", "session", "warmup")),
                      f"{latency:.0f}" if latency is not None else "")  # fmt: skip
    later = rows[1:]
    if later:
        table.add_row(
            "cold starts, median",
            *(f"{statistics.median(p.get(k, 0.0) for _, p, _ in later):.0f}" for k in ("fetch", "session", "warmup")),
            f"{statistics.median(lat for _, _, lat in later if lat is not None):.0f}",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What a cold start costs: MiniLM (the example repository's, exported by `make example`) served
alone with `--idle-unload-seconds 1`, its first load at the server's start, then N cold starts:
each waits until the model is scaled to zero, sends one request and reads the load's phases from
the repository index (`load_ms`: fetch, session, warm-up) and the request's own latency.

Each round runs, in turns, a server without the optimized-model cache (`--onnx-cache-size 0`), one
whose cache starts empty (its first load writes the entry, its cold starts read it), and a second
server on that written cache (a restart: its first load reads it too).

    make example && .venv/bin/python benchmarks/cold_start.py [--cold-starts 5] [--rounds 3]

The first load runs in a fresh process (imports, ONNX Runtime's first session); the later ones in
a warm process, as a model that scaled to zero comes back. Files are in the page cache throughout.
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
console = Console(width=110)


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


Phases = dict[str, float]
PHASES = ("fetch", "session", "warmup")


def serve_and_cold_start(folder: Path, cache_args: list[str], cold_starts: int) -> tuple[Phases, list[Phases]]:
    """One server's first load and its cold starts (each with the request's latency as "request")."""
    body = REQUEST.read_bytes()
    with run_server(folder / "repository", folder / "server.log", "--idle-unload-seconds", "1", *cache_args) as server:
        first: Phases = dict(minilm_entry(server)["load_ms"])
        later: list[Phases] = []
        for _ in range(cold_starts):
            wait_at_zero(server)
            started = time.perf_counter()
            request = urllib.request.Request(f"http://{server.http_url}/v2/models/minilm/infer", body)
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()
            latency_ms = (time.perf_counter() - started) * 1000
            later.append({**minilm_entry(server)["load_ms"], "request": latency_ms})
    return first, later


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold-starts", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not (MINILM / "1" / "model.onnx").is_file():
        print("MiniLM not exported: make example", file=sys.stderr)
        return 2
    firsts: dict[str, list[Phases]] = {}
    laters: dict[str, list[Phases]] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        shutil.copytree(MINILM, root / "repository" / "minilm")
        for round_index in range(args.rounds):
            cache = root / f"cache-{round_index}"
            runs = (
                ("no cache", ["--onnx-cache-size", "0"]),
                ("cache, written by this server", ["--onnx-cache-dir", str(cache)]),
                ("cache, written by the server before", ["--onnx-cache-dir", str(cache)]),
            )
            for label, cache_args in runs:
                console.print(f"round {round_index + 1}/{args.rounds}: {label}")
                first, later = serve_and_cold_start(root, cache_args, args.cold_starts)
                firsts.setdefault(label, []).append(first)
                laters.setdefault(label, []).extend(later)
    table = Table(title=f"MiniLM: first load and cold starts, ms (median of {args.rounds} rounds)")
    for column in ("server", "load", "fetch", "session", "warm-up", "request (cold start included)"):
        table.add_column(column, justify="right")
    for label, loads in firsts.items():
        table.add_row(label, "first", *(f"{statistics.median(p.get(k, 0.0) for p in loads):.0f}" for k in PHASES), "")
        later = laters[label]
        table.add_row(
            "",
            f"cold starts ({len(later)})",
            *(f"{statistics.median(p.get(k, 0.0) for p in later):.0f}" for k in (*PHASES, "request")),
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

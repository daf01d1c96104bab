#!/usr/bin/env python3
"""The durable floor under one async job, with nothing else running: the steps the embedded queue
and a local output path make a job take, in the way inferd takes them, on this machine's disk.

Per job: the submit's insert (one transaction, the body in the row), a share of a lease of 32
(one transaction), its result written beside its name, flushed, linked into place (the 32 of a
group flushed in one pass, their folder once), and a share of the group's end (one transaction).
No HTTP, no model, one thread: what is left is the disk's and SQLite's cost, which no code of
inferd's around them changes. Compare it with what a real-time request costs the server
(benchmarks/async_inference.py: the cores over the real-time requests a second).

    .venv/bin/python benchmarks/async_floor.py [--jobs 3200] [--folder DIR]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

GROUP = 32
BODY = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[0.1,0.2,0.3,0.4]}]}'
RESULT = b'{"outputs":[{"name":"y","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'


def measure(folder: Path, jobs: int) -> dict[str, float]:
    """CPU microseconds a job of each step."""
    db = sqlite3.connect(folder / "jobs.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT, priority INT, submitted_at REAL, body BLOB)")
    db.execute("CREATE INDEX jobs_to_run ON jobs (state, priority DESC, submitted_at)")
    results = folder / "results"
    results.mkdir()
    spent = dict.fromkeys(("submit", "lease", "result file", "end"), 0.0)
    clock = time.process_time
    for _ in range(jobs // GROUP):
        started = clock()
        for _ in range(GROUP):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO jobs VALUES (?, 'queued', 0, ?, ?)", (str(uuid.uuid4()), time.time(), BODY))
            db.execute("COMMIT")
        spent["submit"], started = spent["submit"] + clock() - started, clock()
        db.execute("BEGIN IMMEDIATE")
        rows = db.execute(
            "SELECT id, body FROM jobs WHERE state = 'queued' ORDER BY priority DESC, submitted_at LIMIT ?", (GROUP,)
        ).fetchall()
        for job_id, _ in rows:
            db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (job_id,))
        db.execute("COMMIT")
        spent["lease"], started = spent["lease"] + clock() - started, clock()
        partials = []
        for job_id, _ in rows:
            partial = results / f".{job_id}.partial"
            partial.write_bytes(RESULT)
            partials.append((partial, results / f"{job_id}.out"))
        for partial, _ in partials:
            descriptor = os.open(partial, os.O_RDONLY)
            os.fsync(descriptor)
            os.close(descriptor)
        for partial, final in partials:
            os.link(partial, final)
            partial.unlink()
        descriptor = os.open(results, os.O_RDONLY)
        os.fsync(descriptor)
        os.close(descriptor)
        spent["result file"], started = spent["result file"] + clock() - started, clock()
        db.execute("BEGIN IMMEDIATE")
        for job_id, _ in rows:
            db.execute("UPDATE jobs SET state = 'succeeded', body = NULL WHERE id = ?", (job_id,))
        db.execute("COMMIT")
        spent["end"] += clock() - started
    db.close()
    return {step: seconds / jobs * 1e6 for step, seconds in spent.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3200)
    parser.add_argument("--folder", type=Path, default=None, help="where to measure (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        each = measure(Path(folder), max(GROUP, args.jobs))
    table = Table(title=f"the durable floor of an async job ({args.jobs} jobs, groups of {GROUP}, CPU a job)")
    table.add_column("step")
    table.add_column("CPU a job", justify="right")
    for step, microseconds in each.items():
        table.add_row(step, f"{microseconds:,.0f} us")
    table.add_row("all", f"{sum(each.values()):,.0f} us")
    Console(width=100).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

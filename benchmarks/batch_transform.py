#!/usr/bin/env python3
"""What `inferd batch` costs over a plain script doing the same job, in turns.

The plain script is what a user would write without inferd: read the JSON Lines file a line at a
time with orjson, stack the rows into batches at the batch size ONNX Runtime runs best (chosen
first, by a sweep), run the session, write each output row as a JSON line. `inferd batch` runs the
same model (max_batch_size set to that batch size, its config otherwise inferd's defaults) over
the same file, into the same JSON lines, plus what the plain script does not do: shards written
whole for resuming, the manifest, per-record errors, the summary. Each round runs both, each in a
fresh process, one after the other; each reports records/s over its own run (the model loaded
first), and the ratio is taken per round.

    .venv/bin/python benchmarks/batch_transform.py [--model tiny|minilm] [--records N] [--rounds 3]
        [--engines local server ray]

The server engine runs against an inferd server of the same repository on this machine (one
connection, its default); the Ray engine on a cluster of two nodes on it (2 + 1 CPUs, 2 actors).

MiniLM needs the example repository (`make example`); its records are 32 token ids each, and
both sides compute and write only `sentence_embedding`.
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
import time
from pathlib import Path

import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from inferd.testing.ray_cluster import ray_cluster  # noqa: E402
from inferd.testing.server import run_server  # noqa: E402

MINILM = ROOT / "examples" / "model_repository" / "minilm" / "1" / "model.onnx"
SWEEP = (32, 64, 128, 256, 512)
MINILM_TOKENS = 32
console = Console(width=200)

PLAIN = r"""
import sys, time
import numpy as np, orjson, onnxruntime as ort

data, model, out_path, batch, output = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
names = [i.name for i in session.get_inputs()]
dtypes = {i.name: (np.float32 if "float" in i.type else np.int64) for i in session.get_inputs()}
started = time.perf_counter()
records = 0
with open(data, "rb") as lines, open(out_path, "wb") as out:
    rows = []

    def flush():
        if len(names) == 1 and not isinstance(rows[0], dict):
            feeds = {names[0]: np.array(rows, dtype=dtypes[names[0]])}
        else:
            feeds = {name: np.array([row[name] for row in rows], dtype=dtypes[name]) for name in names}
        (y,) = session.run([output], feeds)
        out.write(b"".join(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for row in y))

    for line in lines:
        rows.append(orjson.loads(line))
        if len(rows) == batch:
            flush()
            records += len(rows)
            rows = []
    if rows:
        flush()
        records += len(rows)
print(records / (time.perf_counter() - started))
"""

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: {batch}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def write_data(path: Path, model: str, records: int) -> None:
    rng = np.random.default_rng(0)
    with path.open("wb") as out:
        for start in range(0, records, 10_000):
            count = min(10_000, records - start)
            if model == "tiny":
                rows = rng.standard_normal((count, 16)).astype(np.float32)
                out.write(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in rows))
            else:
                ids = rng.integers(1000, 20000, size=(count, MINILM_TOKENS))
                ids[:, 0], ids[:, -1] = 101, 102
                ones, zeros = [1] * MINILM_TOKENS, [0] * MINILM_TOKENS
                out.write(
                    b"".join(
                        orjson.dumps({"input_ids": row.tolist(), "attention_mask": ones, "token_type_ids": zeros})
                        + b"\n"
                        for row in ids
                    )
                )


def model_file(model: str, folder: Path) -> Path:
    if model == "minilm":
        if not MINILM.exists():
            sys.exit("MiniLM needs the example repository: make example")
        return MINILM
    sys.path.insert(0, str(ROOT / "src"))
    from inferd.testing.models import mlp_model

    path = folder / "tiny.onnx"
    mlp_model(path, sizes=(16, 64, 4), seed=0)
    return path


def plain(data: Path, model: Path, out: Path, batch: int, output: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", PLAIN, str(data), str(model), str(out), str(batch), output],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def inferd_batch(
    repository: Path, data: Path, out: Path, output: str, engine: list[str], env: dict[str, str] | None = None
) -> tuple[float, dict[str, float]]:
    """`inferd batch` on `engine`'s arguments (default: the local engine over `repository`)."""
    where = engine or ["--model-repository", str(repository)]
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "inferd"), "batch", "model", *where,
            "--input", str(data), "--output", str(out), "--outputs", output, "--quiet",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    summary = json.loads((out / "_summary.json").read_text())
    return float(summary["records_per_second"]), summary["phases_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "minilm"], default="tiny")
    parser.add_argument("--records", type=int, help="default: 1,000,000 (tiny), 4,000 (minilm)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--engines", nargs="+", choices=["local", "server", "ray"], default=["local"],
        help="server: an inferd server of the same repository on this machine; ray: a cluster of two nodes on it",
    )  # fmt: skip
    args = parser.parse_args()
    records = args.records or (1_000_000 if args.model == "tiny" else 4_000)
    output = "y" if args.model == "tiny" else "sentence_embedding"
    with tempfile.TemporaryDirectory(prefix="inferd-batch-bench-") as scratch:
        folder = Path(scratch)
        model = model_file(args.model, folder)
        data = folder / "data" / "records.jsonl"
        data.parent.mkdir()
        with console.status(f"writing {records:,} records"):
            write_data(data, args.model, records)
        sweep_data = folder / "sweep.jsonl"
        sweep_lines = data.read_bytes().splitlines(keepends=True)[: max(1, records // 10)]
        sweep_data.write_bytes(b"".join(sweep_lines))
        rates = {}
        with console.status("choosing the plain script's batch size"):
            for size in SWEEP:
                rates[size] = plain(sweep_data, model, folder / "sweep.out", size, output)
        batch = max(rates, key=lambda size: rates[size])
        console.print("plain script, records/s by batch size: " + ", ".join(f"{s}: {r:,.0f}" for s, r in rates.items()))
        repository = folder / "repository"
        (repository / "model" / "1").mkdir(parents=True)
        (repository / "model" / "1" / "model.onnx").symlink_to(model)
        (repository / "model" / "config.pbtxt").write_text(CONFIG.format(batch=batch))
        with contextlib.ExitStack() as stack:
            engines: dict[str, tuple[list[str], dict[str, str] | None]] = {"local": ([], None)}
            if "server" in args.engines:
                server = stack.enter_context(run_server(repository, folder / "server.log"))
                engines["server"] = (["--engine", "server", "--url", f"http://127.0.0.1:{server.http_port}"], None)
            if "ray" in args.engines:
                cluster = stack.enter_context(ray_cluster(folder / "ray-logs"))
                ray_args = ["--engine", "ray", "--ray-address", cluster.address, "--model-repository", str(repository)]
                engines["ray"] = ([*ray_args, "--max-concurrent-transforms", "2"], cluster.env)
            rows = []
            for round_index in range(args.rounds):
                with console.status(f"round {round_index + 1}: plain"):
                    baseline = plain(data, model, folder / "plain.out", batch, output)
                measured = {}
                for name in args.engines:
                    engine, env = engines[name]
                    with console.status(f"round {round_index + 1}: inferd batch, {name} engine"):
                        started = time.perf_counter()
                        out = folder / f"out-{name}-{round_index}"
                        rate, phases = inferd_batch(repository, data, out, output, engine, env)
                        measured[name] = (rate, time.perf_counter() - started, phases)
                rows.append((baseline, measured))
                console.print(
                    f"round {round_index + 1}: plain {baseline:,.0f}/s, "
                    + ", ".join(f"{name} {m[0]:,.0f}/s ({m[0] / baseline:.2f}x)" for name, m in measured.items())
                )
        table = Table(title=f"inferd batch vs a plain script: {args.model}, {records:,} records, batch {batch}")
        table.add_column("round", justify="right")
        table.add_column("plain records/s", justify="right")
        for name in args.engines:
            table.add_column(f"{name} records/s", justify="right")
            table.add_column(f"{name} ratio", justify="right")
            table.add_column(f"{name} process s", justify="right")
        for index, (baseline, measured) in enumerate(rows, start=1):
            cells = [str(index), f"{baseline:,.0f}"]
            for name in args.engines:
                rate, wall, _ = measured[name]
                cells += [f"{rate:,.0f}", f"{rate / baseline:.2f}x", f"{wall:.1f}"]
            table.add_row(*cells)
        medians = ["median", ""]
        for name in args.engines:
            medians += ["", f"{statistics.median(m[name][0] / b for b, m in rows):.2f}x", ""]
        table.add_row(*medians)
        console.print(table)
        for name in args.engines:
            phases = rows[-1][1][name][2]
            console.print(f"{name}: phases of the last round (s; infer summed over mini-batches): {json.dumps(phases)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""inferd's serving benchmark: served throughput and latency against in-process ONNX Runtime and a
floor server, measured in ONE run on this machine, printed as ratios.

    make example && .venv/bin/python benchmarks/serving.py [--seconds 5] [--models tiny minilm]

Rules (issue "Dynamic batching ... at close to the hardware's limit"):
* inferd runs with every feature on: validation, metrics, request ids, default JSON logging and
  dynamic batching as configured in the model's config.pbtxt.
* Load comes from C/C++ generators, so the client is never the bottleneck: wrk with a pre-built
  body for HTTP JSON, Triton's perf_analyzer for binary HTTP and gRPC.
* The in-process baseline is ONNX Runtime at default threads, swept over batch sizes 1-32, best
  taken. It is then sampled again at that batch size between served measurements, and each
  served figure is divided by the mean of the samples just before and after it, so the machine's
  drift over the run cancels. A served figure is the best of concurrency 8, 16 and 32.
* inferd's default setup is measured in turns with the floor servers, which run throughout: at
  each concurrency inferd, then the floor, `--rounds` times (2 for tiny), best of all counting
  for each; latency at concurrency 1 likewise, the median of the rounds counting.
* The compute-bound models are served with one instance (inferd's default) and with two
  (`instance_group [{ count: 2 }]`, Triton's default for ONNX Runtime on CPU); both are reported.
* The floor server (benchmarks/baselines/floor_server.py) is the cost of request handling alone
  on this stack: uvicorn + orjson + ONNX Runtime inline, nothing else.
Needs: wrk (apt-get install wrk) and scripts/perf_analyzer (scripts/install_perf_analyzer.sh).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferd.testing.models import mlp_model, write_config
from inferd.testing.server import free_port, run_server

ROOT = Path(__file__).resolve().parents[1]
PERF_ANALYZER = ROOT / "scripts" / "perf_analyzer"
MINILM = ROOT / "examples" / "model_repository" / "minilm" / "1" / "model.onnx"
MINILM_REQUEST = ROOT / "examples" / "requests" / "minilm.json"
FLOOR_SERVER = ROOT / "benchmarks" / "baselines" / "floor_server.py"
GRPC_FLOOR_SERVER = ROOT / "benchmarks" / "baselines" / "grpc_floor_server.py"
# The peers the tiny model is compared with over HTTP JSON, each in its own venv
# (scripts/install_baselines.sh): label, python, launcher.
PEERS = (
    (
        "Seldon MLServer 1.7.1 (adaptive batching)",
        ROOT / ".venv-mlserver" / "bin" / "python",
        ROOT / "benchmarks" / "baselines" / "mlserver_server.py",
    ),
    (
        "FastAPI + uvicorn + ORT",
        ROOT / ".venv-fastapi" / "bin" / "python",
        ROOT / "benchmarks" / "baselines" / "fastapi_server.py",
    ),
)
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
IN_PROCESS_ROUNDS = 3
console = Console()


@dataclass(frozen=True)
class Model:
    name: str
    max_batch_size: int
    inputs: dict[str, np.ndarray]  # one row each, with the batch dimension
    # Instance counts served with batching on. A compute-bound model is also served with two
    # instances (Triton's default for ONNX Runtime on CPU): on few cores it trades batch-1 latency
    # for throughput, and the report shows both sides. A tiny model runs inline, where instances
    # do not matter.
    instance_counts: tuple[int, ...] = (1,)
    # Sweeps of each served path, in turns with its floor. An overhead-bound model's figures move
    # with the machine's noise as much as its floor's do: it takes the best of two.
    rounds: int = 1

    def batch(self, size: int) -> dict[str, np.ndarray]:
        return {name: np.repeat(array, size, axis=0) for name, array in self.inputs.items()}

    def v2_json(self) -> bytes:
        return json.dumps(
            {
                "inputs": [
                    {"name": n, "datatype": _datatype(a), "shape": list(a.shape), "data": a.reshape(-1).tolist()}
                    for n, a in self.inputs.items()
                ]
            }
        ).encode()

    def perf_analyzer_data(self) -> str:
        rows = {n: {"content": a.reshape(-1).tolist(), "shape": list(a.shape[1:])} for n, a in self.inputs.items()}
        return json.dumps({"data": [rows]})


def _datatype(array: np.ndarray) -> str:
    return {"float32": "FP32", "int64": "INT64"}[str(array.dtype)]


@dataclass(frozen=True)
class Measurement:
    throughput: float
    p50_us: float = 0.0
    p99_us: float = 0.0
    p90_us: float = 0.0
    # Answers other than 2xx, and socket errors (paced_wrk counts them; the others raise).
    failures: int = 0
    # The server's CPU (user + system) a request, where measured (`with_server_cpu`).
    cpu_us: float = 0.0


# -- model repositories -------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """One way of serving the model: batching on or off, and how many instances."""

    batching: bool
    instances: int = 1

    @property
    def suffix(self) -> str:
        """What a served row's label adds for this setup."""
        return "" if self.instances == 1 else f", {self.instances} instances"

    @property
    def label(self) -> str:
        return ("batching on" if self.batching else "batching off") + self.suffix

    def config(self, model: Model) -> str:
        return (
            f"max_batch_size: {model.max_batch_size}\n"
            + ("dynamic_batching { }\n" if self.batching else "")
            + (f"instance_group [{{ count: {self.instances} kind: KIND_CPU }}]\n" if self.instances > 1 else "")
        )


def build_repository(root: Path, model: Model, source: Path | None, setup: Setup) -> Path:
    model_dir = root / model.name
    (model_dir / "1").mkdir(parents=True)
    if source is None:
        mlp_model(model_dir / "1" / "model.onnx", sizes=(16, 64, 4), seed=0)
    else:
        (model_dir / "1" / "model.onnx").symlink_to(source)
    write_config(model_dir, setup.config(model))
    return root


def tiny_model() -> Model:
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    return Model("tiny", 32, {"x": x}, rounds=2)


def resnet50_model() -> Model:
    from resnet50 import IMAGE_SHAPE

    image = np.random.default_rng(0).random((1, *IMAGE_SHAPE), dtype=np.float32)
    return Model("resnet50", 32, {"image": image}, instance_counts=(1, 2))


def minilm_model() -> Model:
    document = json.loads(MINILM_REQUEST.read_text())
    return Model(
        "minilm",
        32,
        {i["name"]: np.array(i["data"], dtype=np.int64).reshape(i["shape"]) for i in document["inputs"]},
        instance_counts=(1, 2),
    )


# -- in-process baseline ------------------------------------------------------------------------


def in_process(model: Model, path: Path, seconds: float) -> tuple[int, float]:
    """The batch size with the best rows/s (default ORT threads), and batch-1 latency (us).

    Each size is measured in IN_PROCESS_ROUNDS rounds, interleaved with the other sizes, and
    scored by its median round: the best of single short windows is biased upwards by noise
    (ResNet-50 at batch 8 read 10/s in one window and 8.4-8.8/s in longer ones on the same machine).
    """
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {size: model.batch(size) for size in BATCH_SIZES}
    for size in BATCH_SIZES:
        session.run(None, feeds[size])
    window_s = seconds / (len(BATCH_SIZES) * IN_PROCESS_ROUNDS)
    rounds: dict[int, list[float]] = {size: [] for size in BATCH_SIZES}
    batch1_durations: list[float] = []
    for _ in range(IN_PROCESS_ROUNDS):
        for size in BATCH_SIZES:
            count, started = 0, time.perf_counter()
            while time.perf_counter() - started < window_s or count < 2:
                t = time.perf_counter()
                session.run(None, feeds[size])
                if size == 1:
                    batch1_durations.append(time.perf_counter() - t)
                count += 1
            rounds[size].append(count * size / (time.perf_counter() - started))
    medians = {size: float(np.median(rates)) for size, rates in rounds.items()}
    best_size = max(medians, key=lambda size: medians[size])
    return best_size, float(np.median(batch1_durations)) * 1e6


class Reference:
    """In-process ONNX Runtime at its best batch size, sampled between served measurements.

    The machine's speed drifts by ±10% within minutes (MiniLM at batch 1 read 16.8 and 19.4/s a
    minute apart, same session). A served figure is therefore divided by the mean of the reference
    windows just before and just after it, so that drift cancels instead of landing in the ratio.
    """

    def __init__(self, model: Model, path: Path, batch_size: int, window_s: float) -> None:
        self.batch_size = batch_size
        self._session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self._feeds = model.batch(batch_size)
        self._session.run(None, self._feeds)
        self._window_s = window_s
        self.samples: list[float] = []

    def sample(self) -> float:
        _wait_until_quiet()
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < self._window_s or count < 2:
            self._session.run(None, self._feeds)
            count += 1
        self.samples.append(count * self.batch_size / (time.perf_counter() - started))
        return self.samples[-1]

    def ratio(self, measure: Callable[[], Measurement]) -> tuple[Measurement, float]:
        """A served measurement and its throughput over the reference around it."""
        before = self.samples[-1] if self.samples else self.sample()
        measurement = measure()
        after = self.sample()
        return measurement, measurement.throughput / ((before + after) / 2)


def _wait_until_quiet(busy_below: float = 0.15, timeout_s: float = 60.0) -> None:
    """Until the machine's CPUs are idle: a server may still run requests queued when the load
    generator stopped (32 ResNet-50 requests are ~4 s of compute), and a reference sampled beside
    them would read low. Bounded; Linux only (elsewhere it returns at once)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            first = _cpu_times()
            time.sleep(0.25)
            second = _cpu_times()
        except OSError:
            return
        busy, total = second[0] - first[0], second[1] - first[1]
        if total <= 0 or busy / total < busy_below:
            return


def process_cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system, its threads included), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_server_cpu(pid: int, seconds: float, measure: Callable[[], Measurement]) -> Measurement:
    """`measure()` with the server's CPU a request beside its throughput: on a shared machine the
    CPU a request costs moves far less with the neighbours' load than the requests a second do."""
    before = process_cpu_s(pid)
    measured = measure()
    spent = process_cpu_s(pid) - before
    return replace(measured, cpu_us=spent / max(1.0, measured.throughput * seconds) * 1e6)


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


# -- load generators ----------------------------------------------------------------------------


def wrk(url: str, body: bytes, concurrency: int, seconds: float, scratch: Path) -> Measurement:
    script = scratch / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    return _measured(run_wrk(url, script, concurrency, seconds))


def wrk_cycle(
    base_url: str, paths: list[tuple[str, int]], body: bytes, concurrency: int, seconds: float, scratch: Path
) -> Measurement:
    """wrk POSTing `body` to each of `paths` as often as its weight, in a fixed cycle (90/10: nine
    requests to the first, one to the second). The requests are formatted once per thread and each
    is picked by a Lua `request()`: two paths compared with this function cost wrk the same, which a
    static request (`wrk`) and a scripted one would not."""
    divisor = math.gcd(*(weight for _, weight in paths))
    cycle = [path for path, weight in paths for _ in range(weight // divisor)]
    script = scratch / "cycle.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        "local requests = {}\n"
        "local sent = 0\n"
        "function init(args)\n"
        f"  for _, path in ipairs({{{', '.join(json.dumps(path) for path in cycle)}}}) do\n"
        "    requests[#requests + 1] = wrk.format(nil, path)\n"
        "  end\n"
        "end\n"
        "function request()\n"
        "  sent = sent + 1\n"
        "  return requests[sent % #requests + 1]\n"
        "end\n"
    )
    return _measured(run_wrk(base_url, script, concurrency, seconds))


def _measured(output: str) -> Measurement:
    """wrk's report (run with --latency) read: an error answer is raised, not measured."""
    if "Non-2xx" in output:
        raise RuntimeError(f"wrk saw errors:\n{output}")
    return Measurement(
        throughput=float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        p50_us=_wrk_latency_us(output, "50%"),
        p99_us=_wrk_latency_us(output, "99%"),
        p90_us=_wrk_latency_us(output, "90%"),
    )


def paced_wrk(url: str, body: bytes, rate: float, seconds: float, scratch: Path, connections: int = 16) -> Measurement:
    """wrk at about `rate` requests a second (flat out when 0): each of `connections` pauses before
    each request (Lua `delay()`), so the server runs below saturation and a cost shows as lost
    throughput or a longer tail. Failures are counted, not raised."""
    pause_ms = 0 if rate <= 0 else max(0, round(1000 * connections / rate - 0.3))
    script = scratch / f"paced-{pause_ms}.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        + (f"function delay() return {pause_ms} end\n" if pause_ms else "")
    )
    output = run_wrk(url, script, connections, seconds)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    failures = (int(non_2xx.group(1)) if non_2xx else 0) + (
        sum(int(n) for n in socket_errors.groups()) if socket_errors else 0
    )
    return Measurement(
        throughput=float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        p50_us=_wrk_latency_us(output, "50%"),
        p99_us=_wrk_latency_us(output, "99%"),
        p90_us=_wrk_latency_us(output, "90%"),
        failures=failures,
    )


def run_wrk(url: str, script: Path, concurrency: int, seconds: float, threads: int = 1) -> str:
    """wrk's report (with the latency distribution) of `seconds` of load driven by a Lua `script`."""
    return subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 120,
    ).stdout


def _wrk_latency_us(output: str, percentile: str) -> float:
    match = re.search(rf"{re.escape(percentile)}\s+([\d.]+)(us|ms|s)", output)
    if match is None:
        return 0.0
    value, unit = float(match.group(1)), match.group(2)
    return value * {"us": 1.0, "ms": 1e3, "s": 1e6}[unit]


# Stability thresholds tried in turn: the machine is shared, and slow models give few samples per
# window, so a strict first try may not settle; the looser retry still reports what it measured.
STABILITY_PERCENTAGES = ("50", "200")


def perf_analyzer(
    model: Model, url: str, protocol: str, concurrency: int, seconds: float, scratch: Path
) -> Measurement:
    data = scratch / f"{model.name}-data.json"
    if not data.exists():
        data.write_text(model.perf_analyzer_data())
    report = scratch / "perf.csv"
    command = [
        str(PERF_ANALYZER), "-m", model.name, "-u", url, "-i", protocol,
        "--concurrency-range", str(concurrency), "--input-data", str(data),
        "--measurement-interval", str(int(seconds * 1000)), "--max-trials", "6", "-f", str(report),
    ]  # fmt: skip
    for stability in STABILITY_PERCENTAGES:
        completed = subprocess.run(
            [*command, "--stability-percentage", stability],
            capture_output=True,
            text=True,
            check=False,
            timeout=seconds * 12 + 120,
        )
        if completed.returncode == 0:
            with report.open() as handle:
                row = next(csv.DictReader(handle))
            return Measurement(
                float(row["Inferences/Second"]),
                float(row["p50 latency"]),
                float(row["p99 latency"]),
                float(row["p90 latency"]),
            )
    raise RuntimeError(f"perf_analyzer failed:\n{completed.stdout}\n{completed.stderr}")


@contextlib.contextmanager
def baseline_server(script: Path, arguments: list[str], scratch: Path, python: Path | None = None) -> Iterator[int]:
    """A baseline server subprocess on a free port (its last argument); yields the port."""
    port = free_port()
    process = subprocess.Popen(
        [str(python or sys.executable), str(script), *arguments, str(port)],
        stdout=(scratch / f"{script.stem}.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_listening(port, process)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the baseline server exited")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise TimeoutError("the baseline server did not start")


# -- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Best:
    """The best of a concurrency sweep: its measurement, concurrency, and ratio to the reference."""

    measurement: Measurement
    concurrency: int
    ratio: float


def best_of(
    measures: dict[str, Callable[[int], Measurement]], concurrencies: list[int], reference: Reference, rounds: int = 1
) -> dict[str, Best]:
    """The best of a concurrency sweep for each path. With several paths (a served path and its
    floor) each concurrency measures them in turns, `rounds` times: on a shared machine a window
    can read 20% low, and sweeping one path after the other would land that drift in their ratio."""
    results: dict[str, list[Best]] = {label: [] for label in measures}
    for _ in range(rounds):
        for concurrency in concurrencies:
            for label, measure in measures.items():
                measurement, ratio = reference.ratio(lambda m=measure, c=concurrency: m(c))  # type: ignore[misc]
                results[label].append(Best(measurement, concurrency, ratio))
    return {label: max(bests, key=lambda best: best.ratio) for label, bests in results.items()}


def in_turns(measures: dict[str, Callable[[], Measurement]], rounds: int) -> dict[str, list[Measurement]]:
    """Each path measured `rounds` times, in turns: the order reverses every round, so no path
    always follows the same one (whatever one leaves behind, a warm cache or a GC debt, falls on
    each path alike)."""
    results: dict[str, list[Measurement]] = {label: [] for label in measures}
    order = list(measures)
    for round_index in range(rounds):
        for label in order if round_index % 2 == 0 else reversed(order):
            results[label].append(measures[label]())
    return results


def median_latency(measures: dict[str, Callable[[], Measurement]], rounds: int) -> list[tuple[str, Measurement]]:
    """Each path, in turns, `rounds` times; the median throughput, p50, p90 and p99 of each."""
    results = in_turns(measures, rounds)
    return [
        (
            label,
            Measurement(
                throughput=float(np.median([m.throughput for m in ms])),
                p50_us=float(np.median([m.p50_us for m in ms])),
                p99_us=float(np.median([m.p99_us for m in ms])),
                p90_us=float(np.median([m.p90_us for m in ms])),
            ),
        )
        for label, ms in results.items()
    ]


def benchmark(model: Model, source: Path | None, args: argparse.Namespace, scratch: Path) -> None:
    model_path = source or (scratch / "tiny-src.onnx")
    if source is None:
        mlp_model(model_path, sizes=(16, 64, 4), seed=0)
    with console.status(f"{model.name}: in-process ONNX Runtime, batch sizes {BATCH_SIZES}"):
        baseline_batch, batch1_us = in_process(model, model_path, args.seconds * 2)
    reference = Reference(model, model_path, baseline_batch, args.seconds / 2)
    rows: list[tuple[str, Best]] = []
    latency: list[tuple[str, Measurement]] = []
    gains: list[tuple[str, float, float]] = []
    concurrencies, rounds = args.concurrency, args.rounds or model.rounds
    top = max(concurrencies)
    tail: list[tuple[str, Measurement]] = []
    body = model.v2_json()
    setups = [Setup(batching=True, instances=count) for count in model.instance_counts] + [Setup(batching=False)]
    # The floor servers run throughout, idle but for their turns: the first setup (inferd's
    # defaults) is measured in turns with them.
    with (
        baseline_server(FLOOR_SERVER, [str(model_path)], scratch) as floor_port,
        baseline_server(GRPC_FLOOR_SERVER, [str(model_path), model.name, str(model.max_batch_size)], scratch) as port,
    ):
        floor_url, grpc_floor_url = f"http://127.0.0.1:{floor_port}/", f"127.0.0.1:{port}"
        floor_json: dict[str, Callable[[int], Measurement]] = {
            "floor": lambda c: wrk(floor_url, body, c, args.seconds, scratch)
        }
        floor_grpc: dict[str, Callable[[int], Measurement]] = {
            "floor": lambda c: perf_analyzer(model, grpc_floor_url, "grpc", c, args.seconds, scratch)
        }
        for setup in setups:
            paired = setup is setups[0]
            directory = scratch / f"{model.name}-{'on' if setup.batching else 'off'}-{setup.instances}"
            repository = build_repository(directory, model, source, setup)
            with run_server(repository, scratch / f"{model.name}-{setup.label}.log") as server:
                http_url = f"http://{server.http_url}/v2/models/{model.name}/infer"
                with console.status(f"{model.name}, {setup.label}: HTTP JSON (wrk)" + (", with the floor" * paired)):
                    json_sweep = best_of(
                        {"inferd": lambda c, url=http_url: wrk(url, body, c, args.seconds, scratch)}
                        | (floor_json if paired else {}),
                        concurrencies,
                        reference,
                        rounds,
                    )
                if paired:
                    floor = json_sweep["floor"]
                    with console.status(f"{model.name}: latency tail at concurrency {top}, with the floor"):
                        tail = median_latency(
                            {
                                "inferd HTTP JSON": lambda url=http_url: wrk(url, body, top, args.seconds, scratch),  # type: ignore[misc]
                                "floor server, HTTP JSON": lambda: wrk(floor_url, body, top, args.seconds, scratch),
                            },
                            max(3, rounds),
                        )
                if not setup.batching:
                    gains.append(("HTTP JSON", json_sweep["inferd"].measurement.throughput, 0.0))
                    continue
                with console.status(f"{model.name}, {setup.label}: binary HTTP and gRPC (perf_analyzer)"):
                    binary_best = best_of(
                        {"inferd": lambda c: perf_analyzer(model, server.http_url, "http", c, args.seconds, scratch)},
                        concurrencies,
                        reference,
                        rounds,
                    )["inferd"]
                    grpc_sweep = best_of(
                        {"inferd": lambda c: perf_analyzer(model, server.grpc_url, "grpc", c, args.seconds, scratch)}
                        | (floor_grpc if paired else {}),
                        concurrencies,
                        reference,
                        rounds,
                    )
                if paired:
                    grpc_floor = grpc_sweep["floor"]
                rows += [
                    (f"inferd HTTP JSON{setup.suffix}", json_sweep["inferd"]),
                    (f"inferd HTTP binary{setup.suffix}", binary_best),
                    (f"inferd gRPC{setup.suffix}", grpc_sweep["inferd"]),
                ]
                paths: dict[str, Callable[[], Measurement]] = {
                    f"HTTP JSON{setup.suffix}": lambda url=http_url: wrk(url, body, 1, args.seconds, scratch),  # type: ignore[misc]
                    f"HTTP binary{setup.suffix}": lambda: perf_analyzer(
                        model, server.http_url, "http", 1, args.seconds, scratch
                    ),
                    f"gRPC{setup.suffix}": lambda: perf_analyzer(
                        model, server.grpc_url, "grpc", 1, args.seconds, scratch
                    ),
                }
                if paired:
                    paths["floor server, HTTP JSON"] = lambda: wrk(floor_url, body, 1, args.seconds, scratch)
                    paths["gRPC floor server"] = lambda: perf_analyzer(
                        model, grpc_floor_url, "grpc", 1, args.seconds, scratch
                    )
                with console.status(f"{model.name}, {setup.label}: latency at concurrency 1"):
                    latency += median_latency(paths, rounds)
    gains[0] = ("HTTP JSON", rows[0][1].measurement.throughput, gains[0][1])
    if model.name == "tiny":
        rows += measure_peers(model, model_path, body, concurrencies, args, scratch, reference)
    report(model, reference, batch1_us, rows, floor, grpc_floor, latency, gains)
    report_tail(model, top, tail)


def measure_peers(
    model: Model,
    model_path: Path,
    body: bytes,
    concurrencies: list[int],
    args: argparse.Namespace,
    scratch: Path,
    reference: Reference,
) -> list[tuple[str, Best]]:
    rows = []
    for label, python, script in PEERS:
        if not python.exists():
            console.print(f"{label}: not installed (scripts/install_baselines.sh); skipped")
            continue
        with (
            baseline_server(script, [str(model_path), model.name], scratch, python) as port,
            console.status(f"{model.name}: {label} (wrk)"),
        ):
            url = f"http://127.0.0.1:{port}/v2/models/{model.name}/infer"
            _wait_answering(url, body)
            best = best_of(
                {label: lambda c, url=url: wrk(url, body, c, args.seconds, scratch)},  # type: ignore[misc]
                concurrencies,
                reference,
                args.rounds or model.rounds,
            )[label]
        rows.append((f"{label}, HTTP JSON", best))
    return rows


def _wait_answering(url: str, body: bytes) -> None:
    """Until the server answers an inference (some load their model after they listen); bounded."""
    import urllib.request

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=5) as response:
            if response.status == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} never answered")


def report(
    model: Model,
    reference: Reference,
    batch1_us: float,
    rows: list[tuple[str, Best]],
    floor: Best,
    grpc_floor: Best,
    latency: list[tuple[str, Measurement]],
    gains: list[tuple[str, float, float]],
) -> None:
    table = Table(title=f"{model.name}: throughput, one sample per request (best of concurrency 8/16/32)")
    for column in ("path", "concurrency", "inferences/s", "/ in-process best", "/ its floor"):
        table.add_column(column, justify="right" if column != "path" else "left")
    samples = reference.samples
    table.add_row(
        f"in-process ORT, batch {reference.batch_size} (median of {len(samples)} windows,"
        f" {min(samples):,.1f}-{max(samples):,.1f})",
        "-",
        _rate(float(np.median(samples))),
        "1.000",
        "",
    )
    for label, best in (("floor server, HTTP JSON", floor), ("gRPC floor server", grpc_floor)):
        table.add_row(label, str(best.concurrency), _rate(best.measurement.throughput), f"{best.ratio:.3f}", "1.000")
    for label, best in rows:
        its_floor = floor if "JSON" in label else grpc_floor if "gRPC" in label else None
        table.add_row(
            label,
            str(best.concurrency),
            _rate(best.measurement.throughput),
            f"{best.ratio:.3f}",
            f"{best.measurement.throughput / its_floor.measurement.throughput:.3f}" if its_floor else "",
        )
    console.print(table)
    lat = Table(title=f"{model.name}: latency at concurrency 1, minus in-process batch-1 ({batch1_us:.0f} us)")
    for column in ("path", "p50 us", "p99 us", "p50 overhead us", "p99 overhead us"):
        lat.add_column(column, justify="right" if column != "path" else "left")
    for label, m in latency:
        lat.add_row(
            label, f"{m.p50_us:.0f}", f"{m.p99_us:.0f}", f"{m.p50_us - batch1_us:.0f}", f"{m.p99_us - batch1_us:.0f}"
        )
    console.print(lat)
    for label, on, off in gains:
        console.print(f"{model.name}: batching gain over {label}: {_rate(on)} / {_rate(off)} = {on / off:.2f}x")


def report_tail(model: Model, concurrency: int, tail: list[tuple[str, Measurement]]) -> None:
    """The tail a throughput sweep hides (a stall of a few ms once a second moves p99, not the rate)."""
    table = Table(title=f"{model.name}: latency tail at concurrency {concurrency}, in turns (median of rounds)")
    for column in ("path", "inferences/s", "p50 us", "p90 us", "p99 us", "p99 / floor's p99"):
        table.add_column(column, justify="right" if column != "path" else "left")
    floor_p99 = dict(tail)["floor server, HTTP JSON"].p99_us
    for label, m in tail:
        percentiles = (f"{m.p50_us:.0f}", f"{m.p90_us:.0f}", f"{m.p99_us:.0f}")
        table.add_row(label, _rate(m.throughput), *percentiles, f"{m.p99_us / floor_p99:.2f}")
    console.print(table)


def _rate(per_second: float) -> str:
    """Three significant figures or more: 8.4/s and 5,319/s rather than 8 and 5,319.0."""
    return f"{per_second:,.0f}" if per_second >= 100 else f"{per_second:.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measurement window")
    parser.add_argument(
        "--models", nargs="+", default=["tiny", "minilm", "resnet50"], choices=["tiny", "minilm", "resnet50"]
    )
    parser.add_argument("--concurrency", nargs="+", type=int, default=[8, 16, 32])
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="sweeps of each path, in turns with its floor; the best counts (latency: the median). "
        "Default: 2 for tiny, 1 for the compute-bound models",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None or not PERF_ANALYZER.exists():
        print("needs wrk (apt-get install wrk) and scripts/install_perf_analyzer.sh", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            if name == "tiny":
                benchmark(tiny_model(), None, args, Path(scratch))
            elif name == "resnet50":
                from resnet50 import export

                path = Path(scratch) / "resnet50.onnx"
                with console.status("resnet50: exporting (seeded weights)"):
                    export(path)
                benchmark(resnet50_model(), path, args, Path(scratch))
            elif not MINILM.exists():
                print("minilm: run `make example` first; skipped", file=sys.stderr)
            else:
                benchmark(minilm_model(), MINILM, args, Path(scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`run_analyze`: for each model, its own configuration first (the baseline), then a search
(`search.py`) over variants, batching and instance counts, each configuration served by its own
inferd (`server.py`) and measured with `inferd perf`'s `run_perf` over a sweep of loads, with the
server's memory (RSS) and CPU read meanwhile. The objective scores each configuration; the best
is the winner: its config.pbtxt (and the variant's files when the winner is not the original) go to
`OUTPUT/NAME/`, the measurements to `OUTPUT/results.json` (also the cache a rerun resumes from), the
planner's figures to `OUTPUT/profile.json`, and the curves to `OUTPUT/report.html`."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from inferd.tools import model_config, profiles
from inferd.tools.analyze.search import Point, Space, grid, quick
from inferd.tools.analyze.server import ServerStartError, copy_versions, serve
from inferd.tools.perf.measure import PerfSettings, StepResult, run_perf

ORIGINAL = "original"
Objective = Literal["throughput", "latency"]


class AnalyzeError(ValueError):
    """analyze cannot start: one line says why."""


@dataclass(frozen=True, slots=True)
class AnalyzeSettings:
    models: tuple[Path, ...]
    output: Path
    variants: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)
    """Model name → model folders of its variants (as `inferd optimize` writes them)."""
    max_batch_sizes: tuple[int, ...] = (1, 4, 8, 16, 32)
    queue_delays_us: tuple[int, ...] = (0, 1000, 5000)
    instances: tuple[int, ...] = (1, 2)
    preferred: bool = True
    objective: Objective = "throughput"
    p99_budget_ms: float | None = None
    """throughput: only loads whose p99 is within this count."""
    request_rate: float | None = None
    """latency: the rate (requests a second) at which p99 is minimised."""
    concurrency: tuple[float, ...] = (1, 2, 4, 8, 16)
    search: Literal["quick", "grid"] = "quick"
    budget: int = 12
    """Configurations measured per model, the model's own included."""
    input_data: str = "random"
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    window_s: float = 2.0
    max_trials: int = 5
    stability_percentage: float = 10.0
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Step:
    load: float
    throughput: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_cores: float
    batch_size: float


@dataclass(frozen=True, slots=True)
class Measurement:
    model: str
    point: Point
    baseline: bool
    """The model's own configuration, as its repository has it."""
    steps: list[Step]
    rss_mb: float
    score: float | None
    """Higher is better; None: infeasible (errors, over the budget, not sustained, did not start)."""
    error: str = ""
    config_text: str = ""

    def best_step(self, settings: AnalyzeSettings) -> Step | None:
        usable = [s for s in self.steps if _feasible(s, settings)]
        if not usable:
            return None
        if settings.objective == "latency":
            return min(usable, key=lambda s: s.p99_ms)
        return max(usable, key=lambda s: s.throughput)


@dataclass(frozen=True, slots=True)
class ModelResult:
    name: str
    measurements: list[Measurement]
    winner: Measurement | None
    baseline: Measurement | None
    model_dir: Path | None
    memory_baseline_mb: float

    def gain(self, settings: AnalyzeSettings) -> float | None:
        """The winner's score over the baseline's (throughput ratio, or p99 ratio for latency)."""
        if self.winner is None or self.baseline is None or self.baseline.score is None or self.winner.score is None:
            return None
        if settings.objective == "latency":
            return self.baseline.score / self.winner.score  # scores are -p99
        return self.winner.score / self.baseline.score if self.baseline.score else None


@dataclass(frozen=True, slots=True)
class AnalyzeReport:
    settings: AnalyzeSettings
    models: list[ModelResult]
    profile_path: Path
    results_path: Path


@dataclass
class Events:
    """What the CLI shows while analyze runs."""

    model_started: Callable[[str, int], None] = lambda name, budget: None
    measuring: Callable[[str, Point], None] = lambda name, point: None
    measured: Callable[[Measurement, bool], None] = lambda measurement, cached: None


def run_analyze(settings: AnalyzeSettings, events: Events | None = None) -> AnalyzeReport:
    events = events or Events()
    _check(settings)
    settings.output.mkdir(parents=True, exist_ok=True)
    cache = _Cache(settings.output / "results.json")
    memory_baseline = cache.memory_baseline_mb()
    if memory_baseline is None:
        with serve("", None, None) as server:
            memory_baseline = server.rss_bytes() / 2**20
        cache.set_memory_baseline(memory_baseline)
    results = [_analyze_model(path, settings, cache, memory_baseline, events) for path in settings.models]
    profile_path = settings.output / "profile.json"
    models = {r.name: p for r in results if (p := _profile(r, settings)) is not None}
    profiles.write(profiles.Profile(profiles.Machine.this(), models, server_memory_mb=memory_baseline), profile_path)
    report = AnalyzeReport(settings, results, profile_path, cache.path)
    from inferd.tools.analyze.report import write_html

    write_html(report, settings.output / "report.html")
    return report


def _check(settings: AnalyzeSettings) -> None:
    if settings.objective == "latency" and not settings.request_rate:
        raise AnalyzeError("the latency objective minimises p99 at a rate: give --request-rate")
    if settings.budget < 1:
        raise AnalyzeError("--budget must be at least 1 configuration")
    for path in settings.models:
        if not path.is_dir() or not any(p.is_dir() and p.name.isdigit() for p in path.iterdir()):
            raise AnalyzeError(f"'{path}' is not a model folder (a config.pbtxt and version folders)")
    names = {p.name for p in settings.models}
    for name, folders in settings.variants.items():
        if name not in names:
            raise AnalyzeError(f"variants given for '{name}', which is not one of the models {sorted(names)}")
        for folder in folders:
            if not folder.is_dir() or not any(p.is_dir() and p.name.isdigit() for p in folder.iterdir()):
                raise AnalyzeError(f"variant '{folder}' is not a model folder with version folders")


def _analyze_model(
    model_dir: Path, settings: AnalyzeSettings, cache: _Cache, memory_baseline: float, events: Events
) -> ModelResult:
    name = model_dir.name
    original = model_config.read_message(model_dir)
    folders = {ORIGINAL: model_dir} | {folder.name: folder for folder in settings.variants.get(name, ())}
    events.model_started(name, settings.budget)
    measured: dict[str, Measurement] = {}

    def measure(point: Point, baseline: bool = False) -> float | None:
        message = _configured(original, point, baseline)
        key = _key(name, folders[point.variant], model_config.to_text(message), settings)
        measurement = measured.get(key) or cache.get(key)
        cached = measurement is not None
        if measurement is None:
            events.measuring(name, point)
            measurement = _measure(name, folders[point.variant], message, point, baseline, settings)
            if not measurement.error:  # a server that did not start is tried again on a rerun
                cache.put(key, measurement)
        measured[key] = measurement
        events.measured(measurement, cached)
        return measurement.score

    baseline_point = _served_point(name, model_dir, original)
    measure(baseline_point, baseline=True)
    space = Space(
        variants=tuple(folders),
        max_batch_sizes=settings.max_batch_sizes if baseline_point.max_batch_size > 0 else (),
        queue_delays_us=settings.queue_delays_us,
        instances=settings.instances,
        preferred=settings.preferred,
    )
    remaining = settings.budget - 1
    if remaining > 0:
        if settings.search == "grid":
            grid(space, measure, remaining)
        else:
            quick(space, measure, remaining, baseline_point)
    measurements = list(measured.values())
    feasible = [m for m in measurements if m.score is not None]
    winner = max(feasible, key=lambda m: (m.score or 0.0, m.baseline)) if feasible else None
    baseline = next((m for m in measurements if m.baseline), None)
    target = None
    if winner is not None:
        target = settings.output / name
        message = _configured(original, winner.point, winner.baseline)
        model_config.write(target, message, _winner_comment(winner, baseline, settings))
        if winner.point.variant != ORIGINAL:
            copy_versions(folders[winner.point.variant], target)
    return ModelResult(name, measurements, winner, baseline, target, memory_baseline)


def _served_point(name: str, model_dir: Path, original: Any) -> Point:
    """The model's own configuration as inferd completes it (max_batch_size auto-completed from the
    file when the config leaves it out)."""
    from inferd.client import Client

    try:
        with serve(name, model_dir, original) as server, Client(server.url) as client:
            config = client.model_config(name)
    except ServerStartError as exc:
        raise AnalyzeError(f"model '{name}' with its own configuration: {exc}") from None
    batching = config.get("dynamic_batching") or {}
    groups = config.get("instance_group") or [{}]
    return Point(
        ORIGINAL,
        int(config.get("max_batch_size", 0)),
        tuple(int(b) for b in batching.get("preferred_batch_size", ())),
        int(batching.get("max_queue_delay_microseconds", 0)),
        int(groups[0].get("count", 1) or 1),
    )


def _configured(original: Any, point: Point, baseline: bool) -> Any:
    message = type(original)()
    message.CopyFrom(original)
    if not baseline:
        model_config.set_batching(
            message,
            max_batch_size=point.max_batch_size,
            preferred_batch_sizes=point.preferred_batch_size,
            max_queue_delay_us=point.max_queue_delay_us,
            instances=point.instances,
        )
    return message


def _measure(
    name: str, folder: Path, message: Any, point: Point, baseline: bool, settings: AnalyzeSettings
) -> Measurement:
    text = model_config.to_text(message)
    try:
        with serve(name, folder, message) as server:
            samples: dict[float, list[tuple[float, float]]] = {}
            peak_rss = server.rss_bytes()

            def on_window(load: float, _window: int, _step: StepResult) -> None:
                nonlocal peak_rss
                samples.setdefault(load, []).append((time.monotonic(), server.cpu_seconds()))
                peak_rss = max(peak_rss, server.rss_bytes())

            samples[-1.0] = [(time.monotonic(), server.cpu_seconds())]
            report = run_perf(_perf_settings(server.url, name, settings), on_window)
    except Exception as exc:  # a configuration that breaks the server is infeasible, not fatal
        return Measurement(name, point, baseline, [], 0.0, None, f"{type(exc).__name__}: {exc}"[:500], text)
    steps = [_step(result, samples.get(result.load, [])) for result in report.steps]
    measurement = Measurement(name, point, baseline, steps, peak_rss / 2**20, None, "", text)
    best = measurement.best_step(settings)
    score = None if best is None else (-best.p99_ms if settings.objective == "latency" else best.throughput)
    return Measurement(name, point, baseline, steps, peak_rss / 2**20, score, "", text)


def _step(result: StepResult, samples: list[tuple[float, float]]) -> Step:
    cores = 0.0
    if len(samples) >= 2:  # the last window: between the last two collections of this load
        (t0, c0), (t1, c1) = samples[-2], samples[-1]
        cores = (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0
    return Step(
        load=result.load,
        throughput=result.throughput,
        p50_ms=result.latency_ms.get(50, 0.0),
        p99_ms=result.latency_ms.get(99, 0.0),
        errors=sum(result.errors.values()),
        cpu_cores=cores,
        batch_size=result.server.batch_size if result.server else 0.0,
    )


def _feasible(step: Step, settings: AnalyzeSettings) -> bool:
    if step.errors or step.throughput <= 0:
        return False
    if settings.objective == "latency":
        # Sustained: the server kept up with the rate asked (within 5%).
        return settings.request_rate is not None and step.throughput >= 0.95 * settings.request_rate
    return settings.p99_budget_ms is None or step.p99_ms <= settings.p99_budget_ms


def _perf_settings(url: str, name: str, settings: AnalyzeSettings) -> PerfSettings:
    latency = settings.objective == "latency"
    return PerfSettings(
        url=url,
        model=name,
        mode="rate" if latency else "concurrency",
        loads=(settings.request_rate or 1.0,) if latency else settings.concurrency,
        input_data=settings.input_data,
        shapes=settings.shapes,
        measurement_interval_s=settings.window_s,
        stability_percentage=settings.stability_percentage,
        max_trials=settings.max_trials,
        percentile=99 if settings.p99_budget_ms or latency else None,
        # A sweep stops at the first load over the budget: more concurrency only queues longer.
        latency_limit_ms=settings.p99_budget_ms if not latency else None,
        timeout_s=settings.timeout_s,
    )


def _key(name: str, folder: Path, config_text: str, settings: AnalyzeSettings) -> str:
    """What a measurement depends on: the model files, the configuration and how it is loaded."""
    files = sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in folder.rglob("*") if p.is_file())  # fmt: skip
    load = (settings.objective, settings.p99_budget_ms, settings.request_rate, settings.concurrency,
            settings.input_data, sorted(settings.shapes.items()), settings.window_s, settings.max_trials,
            settings.stability_percentage)  # fmt: skip
    return hashlib.sha256(orjson.dumps([name, str(folder.resolve()), files, config_text, repr(load)])).hexdigest()[:24]


def _winner_comment(winner: Measurement, baseline: Measurement | None, settings: AnalyzeSettings) -> str:
    best = winner.best_step(settings)
    figures = (
        f"{best.throughput:.1f} inferences/s at concurrency {best.load:g}, p99 {best.p99_ms:.1f} ms" if best else ""
    )
    gain = ""
    if baseline is not None and baseline.score and winner.score and settings.objective == "throughput":
        gain = f", {winner.score / baseline.score:.2f}x the model's own configuration"
    return (
        f"Chosen by inferd analyze ({time.strftime('%Y-%m-%d')}, objective {settings.objective}): "
        f"{winner.point.label()}\n{figures}{gain} on the machine that measured it."
    )


def _profile(result: ModelResult, settings: AnalyzeSettings) -> profiles.ModelProfile | None:
    winner = result.winner
    if winner is None:
        return None
    best = winner.best_step(settings)
    if best is None:
        return None
    single = min(winner.steps, key=lambda s: s.load)
    config = winner.point.as_dict()
    return profiles.ModelProfile(
        memory_mb=max(0.0, winner.rss_mb - result.memory_baseline_mb),
        cpu_cores=best.cpu_cores,
        best=profiles.Operating(best.throughput, best.p50_ms, best.p99_ms, best.load, config, best.cpu_cores),
        batch1=profiles.Operating(
            single.throughput, single.p50_ms, single.p99_ms, single.load, config, single.cpu_cores
        ),
    )


class _Cache:
    """results.json: every measurement by the key of what it depends on, written after each, so an
    interrupted analyze resumes where it stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._document: dict[str, Any] = {"memory_baseline_mb": None, "measurements": {}}
        if path.is_file():
            try:
                self._document = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError as exc:
                raise AnalyzeError(f"{path} is not analyze's results file ({exc}); move it away") from None

    def memory_baseline_mb(self) -> float | None:
        value = self._document.get("memory_baseline_mb")
        return float(value) if value is not None else None

    def set_memory_baseline(self, value: float) -> None:
        self._document["memory_baseline_mb"] = value
        self._save()

    def get(self, key: str) -> Measurement | None:
        record = self._document["measurements"].get(key)
        if record is None:
            return None
        point = record["point"]
        return Measurement(
            record["model"],
            Point(
                point["variant"],
                point["max_batch_size"],
                tuple(point["preferred_batch_size"]),
                point["max_queue_delay_us"],
                point["instances"],
            ),
            record["baseline"],
            [Step(**s) for s in record["steps"]],
            record["rss_mb"],
            record["score"],
            record["error"],
            record["config_text"],
        )

    def put(self, key: str, measurement: Measurement) -> None:
        self._document["measurements"][key] = asdict(measurement)
        self._save()

    def _save(self) -> None:
        temporary = self.path.with_suffix(".json.tmp")
        temporary.write_bytes(orjson.dumps(self._document, option=orjson.OPT_INDENT_2))
        temporary.replace(self.path)

"""`inferd analyze`: search model configurations, each served by its own inferd and measured."""

from __future__ import annotations

from pathlib import Path

import click

from inferd.cli.perf import parse_loads


def _integers(text: str, option: str, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.ClickException(f"{option} {text!r} must be a comma-separated list of whole numbers") from None
    if not values or any(v < minimum for v in values):
        raise click.ClickException(f"{option} {text!r} must list whole numbers of at least {minimum}")
    return values


@click.command()
@click.argument("models", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where report.html, results.json (resumable), profile.json and MODEL/config.pbtxt go.")  # fmt: skip
@click.option("--variant", "variants", multiple=True,
              help="A variant model folder (OUTPUT/NAME-fp16 of optimize); MODEL=FOLDER for several.")  # fmt: skip
@click.option("--max-batch-sizes", default="1,4,8,16,32", show_default=True, help="max_batch_size values to try.")
@click.option("--queue-delays", default="0,1000,5000", show_default=True,
              help="max_queue_delay_microseconds values to try.")  # fmt: skip
@click.option("--instances", default="1,2", show_default=True, help="Instance counts to try.")
@click.option("--no-preferred", is_flag=True, help="Do not try preferred_batch_size = max_batch_size.")
@click.option("--objective", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True,
              help="throughput: most inferences/s in --p99-budget; latency: least p99 at --request-rate.")  # fmt: skip
@click.option("--p99-budget", "p99_budget_ms", type=click.FloatRange(min=0, min_open=True), help="Milliseconds.")
@click.option("--request-rate", type=click.FloatRange(min=0, min_open=True), help="Requests a second (latency).")
@click.option(
    "--concurrency", default="1:16:x2", show_default=True, help="The loads each configuration is measured at."
)
@click.option("--search", type=click.Choice(["quick", "grid"]), default="quick", show_default=True)
@click.option("--budget", type=click.IntRange(min=1), default=12, show_default=True,
              help="Configurations measured per model, its own included.")  # fmt: skip
@click.option("--input-data", default="random", show_default=True, help="zero, random, or a .json / .npz file.")
@click.option("--shape", "shapes", multiple=True, help="A variable input's shape without the batch: NAME:128.")
@click.option("-p", "--measurement-interval", "interval_ms", type=click.IntRange(min=50), default=2000,
              show_default=True, help="Window milliseconds.")  # fmt: skip
@click.option("-r", "--max-trials", type=click.IntRange(min=1), default=5, show_default=True, help="Windows at most.")
@click.option("-s", "--stability-percentage", type=click.FloatRange(min=0), default=10.0, show_default=True)
def analyze(
    models: tuple[Path, ...],
    output: Path,
    variants: tuple[str, ...],
    max_batch_sizes: str,
    queue_delays: str,
    instances: str,
    no_preferred: bool,
    objective: str,
    p99_budget_ms: float | None,
    request_rate: float | None,
    concurrency: str,
    search: str,
    budget: int,
    input_data: str,
    shapes: tuple[str, ...],
    interval_ms: int,
    max_trials: int,
    stability_percentage: float,
) -> None:
    """Find the best configuration of each of MODELS (model folders): its own configuration first,
    then max_batch_size, preferred_batch_size, max_queue_delay_microseconds, instance count and
    --variant files, each served by its own inferd and measured over --concurrency loads, with its
    memory and CPU. Writes the winner's config.pbtxt, report.html and profile.json to OUTPUT."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from inferd.tools.analyze import AnalyzeError, AnalyzeSettings, Events, Measurement, Point, run_analyze
    from inferd.tools.analyze.report import table
    from inferd.tools.inputs import InputError, parse_shape

    by_model: dict[str, list[Path]] = {}
    for text in variants:
        name, separator, folder = text.partition("=")
        if not separator:
            if len(models) != 1:
                raise click.ClickException(f"--variant {text!r}: with several models, write MODEL=FOLDER")
            name, folder = models[0].name, text
        by_model.setdefault(name, []).append(Path(folder))
    try:
        settings = AnalyzeSettings(
            models=models,
            output=output,
            variants={name: tuple(folders) for name, folders in by_model.items()},
            max_batch_sizes=_integers(max_batch_sizes, "--max-batch-sizes", 1),
            queue_delays_us=_integers(queue_delays, "--queue-delays", 0),
            instances=_integers(instances, "--instances", 1),
            preferred=not no_preferred,
            objective="latency" if objective == "latency" else "throughput",
            p99_budget_ms=p99_budget_ms,
            request_rate=request_rate,
            concurrency=parse_loads(concurrency, whole=True),
            search="grid" if search == "grid" else "quick",
            budget=budget,
            input_data=input_data,
            shapes=dict(parse_shape(s) for s in shapes),
            window_s=interval_ms / 1000,
            max_trials=max_trials,
            stability_percentage=stability_percentage,
        )
        console = Console(stderr=True)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            tasks: dict[str, TaskID] = {}

            def started(name: str, total: int) -> None:
                tasks[name] = progress.add_task(name, total=total)

            def measuring(name: str, point: Point) -> None:
                progress.update(tasks[name], description=f"{name}: {point.label()}")

            def measured(measurement: Measurement, cached: bool) -> None:
                progress.advance(tasks[measurement.model])
                outcome = f"score {measurement.score:.2f}" if measurement.score is not None else "infeasible"
                why = f" ({measurement.error})" if measurement.error else ""
                console.log(
                    f"{measurement.model}: {measurement.point.label()}: {'cached, ' if cached else ''}{outcome}{why}"
                )

            report = run_analyze(settings, Events(started, measuring, measured))
    except (AnalyzeError, InputError) as exc:
        raise click.ClickException(str(exc)) from None
    out = Console()
    if not out.is_terminal:
        out = Console(width=200)
    for result in report.models:
        out.print(table(result, settings))
        if result.model_dir is not None:
            out.print(f"winning configuration: {result.model_dir / 'config.pbtxt'}")
    out.print(f"report: {output / 'report.html'}; profile: {report.profile_path}")
    if any(result.winner is None for result in report.models):
        raise SystemExit(1)

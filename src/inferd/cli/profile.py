"""`inferd profile`: measure models into a profile file, merge profiles, scale one to another machine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from inferd.cli.perf import parse_loads

if TYPE_CHECKING:
    from inferd.tools.profiles import Profile

_OUTPUT = click.Path(dir_okay=False, path_type=Path)
_INPUT = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group()
def profile() -> None:
    """Profiles: what each model costs (memory, CPU) and gives (throughput, p50/p99) on a machine,
    the figures `inferd plan` packs a fleet with. `inferd analyze` writes the same file."""


@profile.command()
@click.argument("models", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=_OUTPUT, required=True, help="The profile file (.json, .yaml or .yml).")
@click.option("--p99-budget", "p99_budget_ms", type=click.FloatRange(min=0, min_open=True),
              help="The best load is the busiest with p99 within this many milliseconds.")  # fmt: skip
@click.option("--concurrency", default="1:16:x2", show_default=True, help="The loads each model is measured at.")
@click.option("--input-data", default="random", show_default=True, help="zero, random, or a .json / .npz file.")
@click.option("--shape", "shapes", multiple=True, help="A variable input's shape without the batch: NAME:128.")
@click.option("-p", "--measurement-interval", "interval_ms", type=click.IntRange(min=50), default=2000,
              show_default=True, help="Window milliseconds.")  # fmt: skip
@click.option("-r", "--max-trials", type=click.IntRange(min=1), default=5, show_default=True, help="Windows at most.")
def measure(
    models: tuple[Path, ...],
    output: Path,
    p99_budget_ms: float | None,
    concurrency: str,
    input_data: str,
    shapes: tuple[str, ...],
    interval_ms: int,
    max_trials: int,
) -> None:
    """Serve each of MODELS (model folders) as configured, by its own inferd on this machine, and
    measure its memory (RSS over an empty server), CPU, and throughput and p50/p99 at its best load
    and at concurrency 1."""
    from rich.console import Console

    from inferd.tools.analyze import AnalyzeError, Events, Measurement
    from inferd.tools.inputs import InputError, parse_shape
    from inferd.tools.profile import ProfileError, ProfileSettings, measure_profile

    console = Console(stderr=True)

    def measured(measurement: Measurement, cached: bool) -> None:
        outcome = "measured" if measurement.score is not None else f"failed ({measurement.error or 'no usable load'})"
        console.log(f"{measurement.model}: {outcome}")

    try:
        settings = ProfileSettings(
            models=models,
            output=output,
            p99_budget_ms=p99_budget_ms,
            concurrency=parse_loads(concurrency, whole=True),
            input_data=input_data,
            shapes=dict(parse_shape(s) for s in shapes),
            window_s=interval_ms / 1000,
            max_trials=max_trials,
        )
        with console.status("profiling ...") as status:

            def measuring(name: str, _point: object) -> None:
                status.update(f"profiling {name} ...")

            result = measure_profile(settings, Events(measuring=measuring, measured=measured))
    except (ProfileError, AnalyzeError, InputError) as exc:
        raise click.ClickException(str(exc)) from None
    _show(result, output)


@profile.command()
@click.argument("profiles_", metavar="PROFILES", nargs=-1, required=True, type=_INPUT)
@click.option("-o", "--output", type=_OUTPUT, required=True, help="The merged profile file.")
def merge(profiles_: tuple[Path, ...], output: Path) -> None:
    """One profile of the models of all PROFILES (taken on one machine type, or scaled to it; a
    model in several keeps its last measurement)."""
    from inferd.tools import profiles

    try:
        merged = profiles.merge([profiles.read(path) for path in profiles_])
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    profiles.write(merged, output)
    _show(merged, output)


@profile.command()
@click.argument("source", type=_INPUT)
@click.option("--factor", type=click.FloatRange(min=0, min_open=True), required=True,
              help="How much faster the target machine is: throughput times it, latency divided by it.")  # fmt: skip
@click.option("--as-machine-of", "machine_of", type=_INPUT,
              help="A profile taken on the target machine: the result merges with profiles from there.")  # fmt: skip
@click.option("-o", "--output", type=_OUTPUT, required=True, help="The scaled profile file.")
def scale(source: Path, factor: float, machine_of: Path | None, output: Path) -> None:
    """SOURCE's figures as they would be on a machine FACTOR times as fast (a factor measured, e.g.
    by profiling one model on both)."""
    from inferd.tools import profiles

    try:
        target = profiles.read(machine_of).machine if machine_of else None
        scaled = profiles.read(source).scaled(factor, target)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    profiles.write(scaled, output)
    _show(scaled, output)


@profile.command()
@click.argument("source", type=_INPUT)
def show(source: Path) -> None:
    """Print a profile file as a table."""
    from inferd.tools import profiles

    try:
        _show(profiles.read(source), None)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _show(result: Profile, written: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    machine = result.machine
    title = f"{machine.cpu}, {machine.cores} cores" + (f", {machine.accelerator}" if machine.accelerator else "")
    if machine.scale != 1.0:
        title += f", scaled by {machine.scale:g}"
    table = Table(title=title)
    for column in ("model", "memory MB", "CPU cores", "best inf/s", "p50 ms", "p99 ms", "at", "batch-1 inf/s",
                   "p50 ms ", "p99 ms "):  # fmt: skip
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, model in sorted(result.models.items()):
        best, single = model.best, model.batch1
        table.add_row(name, f"{model.memory_mb:.0f}", f"{model.cpu_cores:.2f}", f"{best.throughput:.1f}",
                      f"{best.p50_ms:.1f}", f"{best.p99_ms:.1f}", f"c={best.concurrency:g}",
                      f"{single.throughput:.1f}", f"{single.p50_ms:.1f}", f"{single.p99_ms:.1f}")  # fmt: skip
    console = Console() if Console().is_terminal else Console(width=160)
    console.print(table)
    if written is not None:
        console.print(f"profile: {written}")

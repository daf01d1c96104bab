"""`inferd plan`: the cheapest fleet for profiled models at their expected load."""

from __future__ import annotations

from pathlib import Path

import click


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@click.command()
@click.argument("profiles", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where plan.json and plan.png go.")  # fmt: skip
@click.option("--rates", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Requests a second per model: YAML / JSON `model: rate`, or CSV `model,rate`.")  # fmt: skip
@click.option("--zipf-total", type=click.FloatRange(min=0), help="Or: requests a second over all models, Zipf-shared.")
@click.option("--zipf-exponent", type=click.FloatRange(min=0), default=1.0, show_default=True)
@click.option("--slo-p99", "slo_p99_ms", type=click.FloatRange(min=0, min_open=True),
              help="Latency SLO (ms): a model runs at its best point if within it, else at batch 1.")  # fmt: skip
@click.option("--catalog", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Instance catalog YAML (default: the one inferd ships, AWS on-demand prices).")  # fmt: skip
@click.option("--instance-types", default="", help="Only these catalog types, comma-separated.")
@click.option("--memory-limit", type=click.FloatRange(min=0, max=1, min_open=True), default=0.9, show_default=True,
              help="Share of an instance's memory (and accelerator memory) models may fill.")  # fmt: skip
@click.option("--compute-limit", type=click.FloatRange(min=0, max=1, min_open=True), default=0.8, show_default=True,
              help="Share of an instance's vCPUs (and accelerators) models may keep busy.")  # fmt: skip
@click.option("--reserved-memory", "reserved_memory_mb", type=click.FloatRange(min=0), default=512.0,
              show_default=True, help="MiB per instance for the system, besides inferd's own (profiled).")  # fmt: skip
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Copies of every model, each on its own instance (2 or more for availability).")  # fmt: skip
@click.option("--time-limit", "time_limit_s", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds the solver may take; the plan says how far from optimal it may be.")  # fmt: skip
@click.option("--workers", type=click.IntRange(min=1), help="Solver threads (default: the cores, at most 8).")
@click.option("--max-types", type=click.IntRange(min=1), default=4, show_default=True,
              help="Instance types the solver chooses among (the relaxation's best; the bound: all).")  # fmt: skip
def plan(
    profiles: tuple[Path, ...],
    output: Path,
    rates: Path | None,
    zipf_total: float | None,
    zipf_exponent: float,
    slo_p99_ms: float | None,
    catalog: Path | None,
    instance_types: str,
    memory_limit: float,
    compute_limit: float,
    reserved_memory_mb: float,
    replicas: int,
    time_limit_s: float,
    workers: int | None,
    max_types: int,
) -> None:
    """Place the models of PROFILES (inferd profile / analyze files) on the cheapest set of catalog
    instances that holds them at their request rates within the memory and compute limits:
    multi-dimensional bin packing solved with OR-Tools CP-SAT, started from first-fit decreasing.
    Writes OUTPUT/plan.json (for inferd deploy and inferd fleet) and OUTPUT/plan.png."""
    from rich.console import Console

    from inferd.tools.plan import CatalogError, Limits, PlanError, PlanSettings, plan_file, run_plan
    from inferd.tools.plan.report import instances_table, summary_table, write_png

    settings = PlanSettings(
        profiles=profiles,
        rates=rates,
        zipf_total=zipf_total,
        zipf_exponent=zipf_exponent,
        slo_p99_ms=slo_p99_ms,
        catalog=catalog,
        instance_types=_names(instance_types),
        limits=Limits(memory=memory_limit, compute=compute_limit, reserved_memory_mb=reserved_memory_mb),
        replicas=replicas,
        time_limit_s=time_limit_s,
        workers=workers,
        max_types=max_types,
    )
    console = Console(stderr=True)
    try:
        with console.status(f"solving (at most {time_limit_s:g} s) ..."):
            result = run_plan(settings)
    except (PlanError, CatalogError) as exc:
        raise click.ClickException(str(exc)) from None
    output.mkdir(parents=True, exist_ok=True)
    plan_file.write(result, output / "plan.json")
    write_png(result, output / "plan.png")
    out = Console() if Console().is_terminal else Console(width=160)
    out.print(summary_table(result))
    out.print(instances_table(result))
    out.print(f"plan: {output / 'plan.json'}; picture: {output / 'plan.png'}")

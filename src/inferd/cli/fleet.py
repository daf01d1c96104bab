"""`inferd fleet`: run a plan on this machine behind nginx."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console

from inferd.cli.rollout import step_and_guard_options

_STATE = click.option("--state", type=click.Path(file_okay=False, path_type=Path), default=Path(".inferd-fleet"),
                      show_default=True, help="Where the fleet's record, logs and nginx files live.")  # fmt: skip


@click.group()
def fleet() -> None:
    """A plan's bins as local inferd processes behind nginx, routed as the Ingress would be."""


@fleet.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model-repository", required=True, help="The repository every bin loads its models from.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="nginx's port.")
@click.option("--nginx", "nginx_binary", default="nginx", show_default=True, help="The nginx binary.")
@click.option("--endpoints", "endpoints_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="An endpoints file every bin serves (followed every second): nginx sends each "
              "endpoint to the bins holding all its variants' models; inferd fleet rollout rolls one out.")  # fmt: skip
@_STATE
def up(
    plan_path: Path, model_repository: str, port: int, nginx_binary: str, endpoints_file: Path | None, state: Path
) -> None:
    """Start every bin of PLAN (inferd serve on 127.0.0.1, its models loaded) and nginx on --port."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from inferd.tools import fleet as local
    from inferd.tools.plan import plan_file

    try:
        plan = plan_file.read(plan_path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    endpoint_models = _endpoint_models(endpoints_file) if endpoints_file else {}
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("bins ready", total=len(plan.instances))
            running = local.up(plan, plan_path, model_repository, state, port, nginx_binary,
                               on_ready=lambda _name: progress.advance(task),
                               endpoints=str(endpoints_file.resolve()) if endpoints_file else "",
                               endpoint_models=endpoint_models)  # fmt: skip
    except local.FleetError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{len(running.bins)} bins, {len(plan.models)} models behind nginx at {running.url} (state: {state})")


@fleet.command()
@_STATE
def status(state: Path) -> None:
    """Each bin's process, port, models and readiness, and nginx's."""
    from rich.console import Console
    from rich.table import Table

    from inferd.tools import fleet as local

    try:
        running, ready, nginx = local.status(state)
    except local.FleetError as exc:
        raise click.ClickException(str(exc)) from None
    table = Table(title=f"fleet at {running.url}: nginx {'running' if nginx else 'NOT running'}")
    for column in ("bin", "pid", "HTTP port", "gRPC port", "models", "state"):
        table.add_column(column)
    for fleet_bin in running.bins:
        alive = fleet_bin.process is not None and fleet_bin.process.alive()
        state_text = "ready" if ready[fleet_bin.name] else ("starting or not ready" if alive else "stopped")
        pid = str(fleet_bin.process.pid if fleet_bin.process else "-")
        ports = (str(fleet_bin.http_port), str(fleet_bin.grpc_port))
        table.add_row(fleet_bin.name, pid, *ports, str(len(fleet_bin.models)), state_text)
    console = Console(width=120)
    console.print(table)
    _show_rollouts(console, state / local.ROLLOUTS)
    if not nginx or not all(ready.values()):
        raise SystemExit(1)


@fleet.command("rollout")
@click.argument("endpoint")
@step_and_guard_options
@click.option("--prometheus-url", default=None,
              help="Judge from this Prometheus (scraping the bins) rather than the bins' own /metrics.")  # fmt: skip
@click.option("--scrape-interval", default="15s", show_default=True, help="With --prometheus-url: its interval.")
@_STATE
def rollout_command(endpoint: str, candidate: str, strategy: str, bake: str, min_requests: int,
                    max_error_rate_delta: float, max_p99_ratio: float, min_p99_delta: str, prometheus_url: str | None,
                    scrape_interval: str, state: Path) -> None:  # fmt: skip
    """Roll ENDPOINT out to its variant --to across the fleet's bins: judged on all their traffic
    (their /metrics, summed), its weights written to the endpoints file they serve. Runs until the
    rollout ends; inferd fleet status shows it."""
    from inferd.cli.fleet_rollout import run_controller
    from inferd.tools import fleet as local

    try:
        running = local.load(state)
    except local.FleetError as exc:
        raise click.ClickException(str(exc)) from None
    if not running.endpoints:
        raise click.ClickException("this fleet serves no endpoints file: inferd fleet up ... --endpoints FILE")
    replicas = ",".join(f"127.0.0.1:{fleet_bin.metrics_port}" for fleet_bin in running.bins)
    run_controller(
        endpoint, candidate, strategy, bake, min_requests, max_error_rate_delta, max_p99_ratio, min_p99_delta,
        None, "", running.endpoints, state / local.ROLLOUTS, "prometheus" if prometheus_url else "scrape",
        prometheus_url, scrape_interval, replicas,
    )  # fmt: skip


@fleet.command()
@click.argument("name")
@_STATE
def restart(name: str, state: Path) -> None:
    """Restart bin NAME (it drains first); the others, and nginx's retries, keep its models served."""
    from inferd.tools import fleet as local

    try:
        local.restart(state, name)
    except local.FleetError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{name}: restarted and ready")


@fleet.command()
@_STATE
def down(state: Path) -> None:
    """Stop exactly what inferd fleet up started (nginx first, then the bins)."""
    from inferd.tools import fleet as local

    stopped = local.down(state)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else f"nothing running from {state}")


def _endpoint_models(location: Path) -> dict[str, tuple[str, ...]]:
    """Each endpoint the file declares, with its variants' and shadows' models (the file read as a
    server reads it)."""
    from inferd.server.endpoint_file import EndpointFileError, read_endpoint_file

    try:
        specs = read_endpoint_file(str(location))
    except EndpointFileError as exc:
        raise click.ClickException(str(exc)) from None
    # Its shadows' models too: a bin sets an endpoint only when it serves every one of them.
    return {
        spec.name: tuple(dict.fromkeys([*(v.model for v in spec.variants), *(s.model for s in spec.shadows)]))
        for spec in specs
    }


def _show_rollouts(console: Console, folder: Path) -> None:
    """Each endpoint's running (else last) rollout across the fleet, with its latest decision."""
    from inferd.cli.rollout import kept_rollouts, rollout_headline, show_decision
    from inferd.core.rollout import Rollout

    latest: dict[str, dict[str, Any]] = {}
    for shown in kept_rollouts(folder):
        if shown["endpoint"] not in latest or not Rollout.is_active(latest[shown["endpoint"]]):
            latest[shown["endpoint"]] = shown
    for shown in latest.values():
        rollout_headline(console, shown)
        if shown["decisions"]:
            show_decision(console, shown["decisions"][-1])

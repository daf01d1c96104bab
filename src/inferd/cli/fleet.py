"""`inferd fleet`: run a plan on this machine behind nginx."""

from __future__ import annotations

from pathlib import Path

import click

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
@_STATE
def up(plan_path: Path, model_repository: str, port: int, nginx_binary: str, state: Path) -> None:
    """Start every bin of PLAN (inferd serve on 127.0.0.1, its models loaded) and nginx on --port."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from inferd.tools import fleet as local
    from inferd.tools.plan import plan_file

    try:
        plan = plan_file.read(plan_path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("bins ready", total=len(plan.instances))
            running = local.up(plan, plan_path, model_repository, state, port, nginx_binary,
                               on_ready=lambda _name: progress.advance(task))  # fmt: skip
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
    Console(width=120).print(table)
    if not nginx or not all(ready.values()):
        raise SystemExit(1)


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

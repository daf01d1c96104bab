"""`inferd rollout start --controller`: a fleet's rollout, run by this command until it ends
(`server.fleet_rollout`), each decision printed as it is made. Exits 0 when the candidate was
promoted, 1 when the rollout rolled back or was aborted."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import click
from rich.console import Console

from inferd.cli.rollout import show_decision


def run_controller(
    endpoint: str, candidate: str, strategy: str, bake: str, min_requests: int, max_error_rate_delta: float,
    max_p99_ratio: float, min_p99_delta: str, max_drift: float | None, webhook: str, endpoints_file: str | None,
    state_dir: Path | None, metrics_source: str | None, prometheus_url: str | None, scrape_interval: str,
    replicas: str | None,
) -> None:  # fmt: skip
    from inferd.core.rollout import Guards, parse_duration
    from inferd.core.state_dir import StateDir
    from inferd.errors import InferdError
    from inferd.server import fleet_metrics
    from inferd.server.endpoint_file import EndpointFileError
    from inferd.server.endpoints import decision_json
    from inferd.server.fleet_metrics import MetricsSourceError
    from inferd.server.fleet_rollout import FileWeights, FleetRollout, FleetTarget, StateDirWeights, WeightStore

    if max_drift is not None:
        raise click.UsageError("--max-drift is judged from one server's shadows: a fleet's controller cannot judge it")
    if webhook:
        raise click.UsageError("--webhook names a server's --rollout-webhook: a fleet's controller has none")
    if state_dir is None:
        raise click.UsageError(
            "--controller needs --state-dir (where it keeps the rollout; the replicas' shared one when they follow "
            "it), and --endpoints FILE when they serve a file"
        )
    try:
        if metrics_source == "prometheus":
            if not prometheus_url:
                raise click.UsageError("--metrics-source prometheus needs --prometheus-url")
            source = fleet_metrics.metrics_source(f"prometheus={prometheus_url}", parse_duration(scrape_interval))
        elif metrics_source == "scrape":
            if not replicas:
                raise click.UsageError("--metrics-source scrape needs --replicas URL,URL,...")
            source = fleet_metrics.metrics_source(f"scrape={replicas}")
        else:
            raise click.UsageError("--controller needs --metrics-source prometheus or scrape")
        guards = Guards(min_requests, max_error_rate_delta, max_p99_ratio, parse_duration(min_p99_delta) * 1000)
        bake_s = parse_duration(bake)
    except (InferdError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None

    console = Console()

    async def run() -> str:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        state = StateDir(state_dir)
        weights: WeightStore = FileWeights(endpoints_file) if endpoints_file else StateDirWeights(state)
        fleet = FleetRollout(FleetTarget(weights, source), state, endpoint)
        rollout, resumed = await fleet.begin(candidate, strategy, bake_s, guards)
        verb = "takes up" if resumed else "runs"
        console.print(
            f"[bold]{endpoint}[/bold]: this controller {verb} the rollout from '{rollout.baseline}' to "
            f"'{rollout.candidate}' by {rollout.strategy}, judged from {source.describe()}; weights in "
            f"{weights.describe()} (Ctrl-C rolls back)",
            soft_wrap=True,
            highlight=False,
        )
        ended = await fleet.follow(stop, lambda decision: show_decision(console, decision_json(decision)))
        return ended.state

    try:
        state = asyncio.run(run())
    except (InferdError, EndpointFileError, MetricsSourceError) as exc:
        raise click.ClickException(getattr(exc, "message", str(exc))) from None
    if state != "promoted":
        raise SystemExit(1)

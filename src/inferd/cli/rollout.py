"""`inferd rollout`: start, follow, promote, abort and list an endpoint's guarded rollouts on a
running server (its `/v2/endpoints/{e}/rollout` API), with every decision and the numbers behind it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from inferd.cli.client_options import client_security_options, client_tls

Command = TypeVar("Command", bound=Callable[..., Any])


def _server_options(command: Command) -> Command:
    command = client_security_options(command)
    return click.option("--url", default="http://localhost:8000", show_default=True, help="The server.")(command)


def guard_options(command: Command) -> Command:
    """The guards a rollout is judged by: on a server, across a fleet, in Argo's analysis."""
    options = [
        click.option("--min-requests", type=click.IntRange(min=1), default=100, show_default=True,
                     help="The candidate's requests a step needs before it is judged."),
        click.option("--max-error-rate-delta", type=click.FloatRange(0, 1), default=0.05, show_default=True,
                     help="Roll back when the candidate's error rate is this much above the baseline's."),
        click.option("--max-p99-ratio", type=click.FloatRange(min=1), default=1.5, show_default=True,
                     help="Roll back when the candidate's p99 is this many times the baseline's "
                          "and --min-p99-delta above it."),
        click.option("--min-p99-delta", default="20ms", show_default=True,
                     help="See --max-p99-ratio: so that noise cannot fail an A/A rollout."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def step_and_guard_options(command: Command) -> Command:
    """--to, the steps and the guards: a rollout's options, on a server or across a fleet."""
    command = guard_options(command)
    options = [
        click.option("--to", "candidate", required=True, help="The variant that takes the traffic."),
        click.option("--strategy", default="canary:10", show_default=True,
                     help="all-at-once, canary:P (P% first) or linear:K."),
        click.option("--bake", default="5m", show_default=True, help="Each step's bake time: 90s, 5m, 1h."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


@click.group()
def rollout() -> None:
    """Move an endpoint's traffic to a candidate variant step by step, judged against the baseline
    variant and rolled back by itself when a guard fails."""


@rollout.command()
@click.argument("endpoint")
@step_and_guard_options
@click.option("--max-drift", type=click.FloatRange(0, 1), default=None,
              help="Roll back when the candidate's answers disagree with the baseline's on more than this share "
                   "of shadowed requests (the endpoint needs a shadow running the candidate's model).")  # fmt: skip
@click.option("--webhook", default="", help="An outside alarm to ask at each step: a NAME the server was started "
              "with (--rollout-webhook NAME=URL).")  # fmt: skip
@click.option("--controller", is_flag=True,
              help="Run the rollout here, across a fleet: judged on every replica's traffic "
                   "(--metrics-source), its weights written to the --endpoints file the replicas follow. "
                   "Runs until the rollout ends.")  # fmt: skip
@click.option("--endpoints", "endpoints_file", default=None, metavar="FILE",
              help="With --controller: the endpoints file every replica serves (--endpoints), "
                   "a path or s3://...; without it, the weights are the --state-dir's, shared by the "
                   "replicas.")  # fmt: skip
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --controller: where the rollout is kept (a controller started again takes it up); "
                   "the replicas' own, shared, when they follow it rather than a file.")  # fmt: skip
@click.option("--metrics-source", type=click.Choice(["prometheus", "scrape"]), default=None,
              help="With --controller: judge from Prometheus' PromQL, or from the replicas' own /metrics.")  # fmt: skip
@click.option("--prometheus-url", default=None, help="With --metrics-source prometheus: Prometheus' URL.")
@click.option("--scrape-interval", default="15s", show_default=True,
              help="With --metrics-source prometheus: how often it scrapes the replicas (PromQL ranges are at "
                   "least 4 of them).")  # fmt: skip
@click.option("--replicas", default=None, metavar="URL,URL,...",
              help="With --metrics-source scrape: each replica's metrics address (host:port or URL).")  # fmt: skip
@_server_options
def start(endpoint: str, candidate: str, strategy: str, bake: str, min_requests: int, max_error_rate_delta: float,
          max_p99_ratio: float, min_p99_delta: str, max_drift: float | None, webhook: str, controller: bool,
          endpoints_file: str | None, state_dir: Path | None, metrics_source: str | None,
          prometheus_url: str | None, scrape_interval: str, replicas: str | None,
          **server: Any) -> None:  # fmt: skip
    """Start a rollout of ENDPOINT's traffic to its variant --to: on the server at --url, or (with
    --controller) across a fleet, run by this command until it ends."""
    if controller:
        from inferd.cli.fleet_rollout import run_controller

        run_controller(
            endpoint, candidate, strategy, bake, min_requests, max_error_rate_delta, max_p99_ratio, min_p99_delta,
            max_drift, webhook, endpoints_file, state_dir, metrics_source, prometheus_url, scrape_interval, replicas,
        )  # fmt: skip
        return
    body = {
        "to": candidate, "strategy": strategy, "bake": bake, "min_requests": min_requests,
        "max_error_rate_delta": max_error_rate_delta, "max_p99_ratio": max_p99_ratio, "min_p99_delta": min_p99_delta,
        "webhook": webhook, **({"max_drift": max_drift} if max_drift is not None else {}),
    }  # fmt: skip
    _show(_call(server, "POST", f"/v2/endpoints/{endpoint}/rollout", body))


_CONTROLLER_STATE = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Read the rollout a fleet's controller (--controller) keeps there, not a server's.",
)  # fmt: skip


@rollout.command()
@click.argument("endpoint")
@_CONTROLLER_STATE
@_server_options
def status(endpoint: str, state_dir: Path | None, **server: Any) -> None:
    """The running rollout of ENDPOINT, else its last: its step, state and decisions."""
    if state_dir is not None:
        ended = kept_rollouts(state_dir, endpoint)
        if not ended:
            raise click.ClickException(f"{state_dir} keeps no rollout of endpoint '{endpoint}'")
        from inferd.core.rollout import Rollout

        running = [r for r in ended if Rollout.is_active(r)]
        _show(running[-1] if running else ended[-1])
        return
    _show(_call(server, "GET", f"/v2/endpoints/{endpoint}/rollout"))


@rollout.command()
@click.argument("endpoint")
@_server_options
def promote(endpoint: str, **server: Any) -> None:
    """Give the candidate all the traffic now, ending the rollout."""
    _show(_call(server, "POST", f"/v2/endpoints/{endpoint}/rollout/promote"))


@rollout.command()
@click.argument("endpoint")
@_server_options
def abort(endpoint: str, **server: Any) -> None:
    """Roll back now: the traffic goes back to the weights before the rollout."""
    _show(_call(server, "POST", f"/v2/endpoints/{endpoint}/rollout/abort"))


@rollout.command()
@click.argument("endpoint")
@_CONTROLLER_STATE
@_server_options
def history(endpoint: str, state_dir: Path | None, **server: Any) -> None:
    """ENDPOINT's ended rollouts, each with its decisions."""
    if state_dir is not None:
        from inferd.core.rollout import Rollout

        for ended in kept_rollouts(state_dir, endpoint):
            if not Rollout.is_active(ended):
                _show(ended)
        return
    for ended in _call(server, "GET", f"/v2/endpoints/{endpoint}/rollout/history")["rollouts"]:
        _show(ended)


def kept_rollouts(state_dir: Path, endpoint: str | None = None) -> list[dict[str, Any]]:
    """The rollouts a fleet's controller keeps in `state_dir` (of `endpoint`, or all), as the API
    shows a rollout."""
    from inferd.core.endpoint_control import FLEET_ROLLOUTS_NAME
    from inferd.core.rollout import Rollout
    from inferd.core.state_dir import StateDir
    from inferd.server.endpoints import rollout_json

    if not (state_dir / f"{FLEET_ROLLOUTS_NAME}.json").is_file():
        return []
    documents = (StateDir(state_dir).read(FLEET_ROLLOUTS_NAME) or {}).get("rollouts", [])
    return [rollout_json(Rollout.from_document(d)) for d in documents if endpoint in (None, d.get("endpoint"))]


def _call(server: dict[str, Any], method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    from inferd.client import NO_RETRIES, Client
    from inferd.errors import InferdError

    ca_cert: Path | None = server["ca_cert"]
    tls = client_tls(ca_cert, server["client_cert"], server["client_key"])
    try:
        with Client(server["url"], retry=NO_RETRIES, tls=tls, token=server["token"]) as client:
            return client.call_json(method, path, body)
    except (InferdError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _show(rollout: dict[str, Any]) -> None:
    console = Console()
    # A line a decision, whole: the numbers behind it are the point, and a line is greppable.
    rollout_headline(console, rollout)
    for decision in rollout["decisions"]:
        show_decision(console, decision)


def rollout_headline(console: Console, rollout: dict[str, Any]) -> None:
    share = f", '{rollout['candidate']}' at {rollout['share']:g}%" if rollout["share"] is not None else ""
    console.print(
        f"[bold]{rollout['endpoint']}[/bold]: {rollout['state']} — from '{rollout['baseline']}' to "
        f"'{rollout['candidate']}' by {rollout['strategy']}, step {rollout['step']} of {len(rollout['steps'])}{share}"
    )


def show_decision(console: Console, decision: dict[str, Any]) -> None:
    console.print(
        f"  {decision['at']}  step {decision['step']}  {decision['action']:<11} {decision['message']}",
        soft_wrap=True,
        highlight=False,
    )

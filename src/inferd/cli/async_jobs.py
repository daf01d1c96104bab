"""`inferd async`: submit async inference jobs to a running server and follow them (its
`/v2/models/{m}/infer_async` and `/v2/async` API)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from inferd.cli.client_options import client_security_options, client_tls

Command = TypeVar("Command", bound=Callable[..., Any])


def _server_options(command: Command) -> Command:
    command = client_security_options(command)
    return click.option("--url", default="http://localhost:8000", show_default=True, help="The server.")(command)


@click.group(name="async")
def async_jobs() -> None:
    """Submit inference jobs that the server runs in the background and writes one result for each,
    to where its operator said (--async-output-path); follow, wait for, cancel and list them."""


@async_jobs.command()
@click.argument("model")
@click.argument("body", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--input-location", default="", help="Instead of BODY: an object the server reads (file:// or s3://, "
              "under one of its --async-input-root).")  # fmt: skip
@click.option("--version", default="", help="The model's version (default: as the model's policy says).")
@click.option("--inference-id", default="", help="The job's id: submitting it again is the same job.")
@click.option("--ttl", "ttl_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds after which the job expires if it has not started.")  # fmt: skip
@click.option("--job-timeout", "job_timeout_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds the job may run (default 3600).")  # fmt: skip
@click.option("--priority", type=int, default=0, show_default=True, help="Jobs of a higher priority run first.")
@click.option("--wait", is_flag=True, help="Wait for the job to end, and show it then.")
@_server_options
def submit(
    model: str, body: Path | None, input_location: str, version: str, inference_id: str, ttl_s: float | None,
    job_timeout_s: float | None, priority: int, wait: bool, **server: Any,
) -> None:  # fmt: skip
    """Submit a job of MODEL (or endpoint): BODY is a v2 inference request as JSON (the body of
    POST /v2/models/MODEL/infer), sent as it is."""
    if (body is None) == (not input_location):
        raise click.UsageError("give BODY or --input-location (one of them)")
    payload = json.loads(body.read_bytes()) if body is not None else None

    def call(client: Any) -> Any:
        if payload is not None:
            # The body as written: the server reads it as POST .../infer would (its parameters, outputs).
            from inferd.client.async_jobs import AsyncJob, submit_query

            path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer_async"
            query = submit_query(inference_id, ttl_s, job_timeout_s, priority)
            return AsyncJob.from_json(client.call_json("POST", path + query, payload))
        return client.submit_async(
            model, input_location=input_location, version=version, inference_id=inference_id, ttl_s=ttl_s,
            job_timeout_s=job_timeout_s, priority=priority,
        )  # fmt: skip

    job = _call(server, call)
    if wait:
        job = _call(server, lambda client: client.wait_async(job.inference_id))
    _show(job)


@async_jobs.command()
@click.argument("inference_id")
@_server_options
def status(inference_id: str, **server: Any) -> None:
    """A job's state, timings, locations and error."""
    _show(_call(server, lambda client: client.async_job(inference_id)))


@async_jobs.command()
@click.argument("inference_id")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=3600.0, show_default=True,
              help="Seconds to wait at most.")  # fmt: skip
@_server_options
def wait(inference_id: str, timeout_s: float, **server: Any) -> None:
    """Wait for a job to end (exit 1 unless it succeeded), and show it."""
    job = _call(server, lambda client: client.wait_async(inference_id, timeout_s=timeout_s))
    _show(job)
    if job.state != "succeeded":
        raise SystemExit(1)


@async_jobs.command()
@click.argument("inference_id")
@_server_options
def cancel(inference_id: str, **server: Any) -> None:
    """Cancel a queued job."""
    _show(_call(server, lambda client: client.cancel_async(inference_id)))


@async_jobs.command(name="list")
@click.option("--model", default="", help="Only this model's (or endpoint's) jobs.")
@click.option("--state", type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled", "expired"]),
              default=None, help="Only jobs in this state.")  # fmt: skip
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@_server_options
def list_jobs(model: str, state: str | None, limit: int, **server: Any) -> None:
    """Jobs, newest first (a management call)."""
    jobs = _call(server, lambda client: client.list_async(model=model, state=state or "", limit=limit))
    table = Table("inference id", "model", "state", "submitted", "attempts", "where")
    for job in jobs:
        where = job.output_location if job.state == "succeeded" else job.failure_location if job.error else ""
        table.add_row(job.inference_id, job.model, job.state, job.submitted_at, str(job.attempts), where)
    Console().print(table)


def _call(server: dict[str, Any], call: Callable[[Any], Any]) -> Any:
    from inferd.client import NO_RETRIES, Client
    from inferd.errors import InferdError

    tls = client_tls(server["ca_cert"], server["client_cert"], server["client_key"])
    try:
        with Client(server["url"], retry=NO_RETRIES, tls=tls, token=server["token"]) as client:
            return call(client)
    except (InferdError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _show(job: Any) -> None:
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"[bold]{job.inference_id}[/bold]: {job.state} ({job.model}, {job.attempts} attempt(s))")
    console.print(f"  submitted {job.submitted_at}" + (f", started {job.started_at}" if job.started_at else "")
                  + (f", ended {job.ended_at}" if job.ended_at else ""))  # fmt: skip
    if job.state == "succeeded":
        console.print(f"  result: {job.output_location}")
    elif job.error:
        console.print(f"  error ({job.error_code}): {job.error}")
        if job.state == "failed":
            console.print(f"  failure document: {job.failure_location}")
    else:
        console.print(f"  result (when it ends): {job.output_location}")

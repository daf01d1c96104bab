"""`inferd health`: exit 0 when a server is ready (or live), for container health checks."""

from __future__ import annotations

import os
from pathlib import Path

import click

from inferd.cli.client_options import client_security_options, client_tls


@click.command()
@click.option("--url", default=None, help="The server (default: http://127.0.0.1:$INFERD_HTTP_PORT, port 8000).")
@click.option("--live", is_flag=True, help="Ask whether it is live rather than ready.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True)
@client_security_options
def health(
    url: str | None,
    live: bool,
    timeout_s: float,
    ca_cert: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token: str | None,
) -> None:
    """Exit 0 if the inferd (or any KServe v2 server) at --url is ready (--live: live), else 1.
    The container image's HEALTHCHECK runs it."""
    from inferd.client import NO_RETRIES, Client
    from inferd.errors import InferdError

    url = url or f"http://127.0.0.1:{os.environ.get('INFERD_HTTP_PORT', '8000')}"
    what = "live" if live else "ready"
    try:
        tls = client_tls(ca_cert, client_cert, client_key)
        with Client(url, timeout_s=timeout_s, retry=NO_RETRIES, tls=tls, token=token) as client:
            ok = client.server_live() if live else client.server_ready()
    except (InferdError, OSError) as exc:
        click.echo(f"{url}: not {what} ({exc})", err=True)
        raise SystemExit(1) from None
    click.echo(f"{url}: {what}" if ok else f"{url}: not {what}", err=not ok)
    raise SystemExit(0 if ok else 1)

"""The options every command that calls a server takes to reach one behind TLS or tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # the client (and grpc) load only when a command runs
    from inferd.client import ClientTls

Command = TypeVar("Command", bound=Callable[..., Any])
_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def client_security_options(command: Command) -> Command:
    """Add --ca-cert, --client-cert, --client-key and --token (the command's parameters of those
    names; `client_tls` makes the first three one ClientTls)."""
    options = (
        click.option(
            "--token",
            envvar="INFERD_TOKEN",
            show_envvar=True,
            default=None,
            help="A bearer token to send (a server started with --inference-tokens-file asks for one).",
        ),
        click.option("--client-key", type=_FILE, default=None, help="The key of --client-cert."),
        click.option("--client-cert", type=_FILE, default=None, help="A PEM certificate for mutual TLS."),
        click.option(
            "--ca-cert",
            type=_FILE,
            default=None,
            help="PEM bundle the server's certificate must chain to, for https:// and grpcs:// URLs "
            "(default: the system's trust store).",
        ),
    )
    for option in options:
        command = option(command)
    return command


def client_tls(ca_cert: Path | None, client_cert: Path | None, client_key: Path | None) -> ClientTls | None:
    from inferd.client import ClientTls

    if ca_cert is None and client_cert is None and client_key is None:
        return None
    try:
        return ClientTls(ca=ca_cert, cert=client_cert, key=client_key)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

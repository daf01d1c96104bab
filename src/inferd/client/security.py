"""How a client proves itself and checks the server: TLS (the CA that signed the server's
certificate, and the client's own certificate for mutual TLS) and a bearer token."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ClientTls:
    """`ca`: PEM bundle the server's certificate must chain to (None: the system's trust store);
    `cert` and `key`: the client's certificate and key, for servers that ask for one (mutual TLS)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate needs its key: give both cert and key, or neither")

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca is not None else None)
        if self.cert is not None and self.key is not None:
            context.load_cert_chain(self.cert, self.key)
        return context

    def grpc_credentials(self) -> Any:
        """grpc.ChannelCredentials (grpc is imported only by gRPC clients)."""
        import grpc

        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


def bearer(token: str | None) -> str | None:
    """The Authorization value a token is sent as."""
    return f"Bearer {token}" if token else None

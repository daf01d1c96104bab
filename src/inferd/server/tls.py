"""TLS for every listener: one certificate and key (`--tls-cert`, `--tls-key`) and, for mutual TLS,
the CA whose client certificates are accepted (`--tls-client-ca`; a client without one is refused
in the handshake).

HTTP (every door, the TorchServe management port too) gets an `ssl.SSLContext`; gRPC (KServe v2 and
TF Serving) gets grpc's own server credentials built from the same files; the metrics port is handed
the files (prometheus-client's server wraps its socket itself). TLS 1.2 is the floor, as nginx's and
Envoy's defaults; HTTP offers ALPN "http/1.1" (inferd's HTTP server speaks HTTP/1.1 only).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    # Client certificates must be signed by this CA (mutual TLS) when set.
    client_ca: Path | None = None

    def http_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        context.set_alpn_protocols(["http/1.1"])
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.client_ca)
        return context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.client_ca.read_bytes() if self.client_ca is not None else None,
            require_client_auth=self.client_ca is not None,
        )

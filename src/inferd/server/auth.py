"""Who may call what: bearer tokens for the management surface and, optionally, the data plane.

Every route and gRPC method has an `Access`: PUBLIC (health: probes carry no credentials), DATA
(inference and reading), MANAGEMENT (anything that changes the server's state: repository load and
unload, shared-memory registration) or PLATFORM (SageMaker's routes, which the SageMaker platform
calls without tokens after authenticating its callers with IAM; see the README).

With management tokens configured, MANAGEMENT needs one of them; with inference tokens configured,
DATA needs one of either set (a management token may do everything), and so does MANAGEMENT when
there are no management tokens (nothing is left less protected than the data plane). A request without a token where
one is needed is a 401 (with `WWW-Authenticate: Bearer`); a token the server does not hold is a 401;
an inference token on a management route is a 403. Tokens come as `Authorization: Bearer TOKEN`
(what OpenAI's, TorchServe's and most HTTP clients send) over HTTP and as `authorization` metadata
over gRPC. They are held as SHA-256 digests and compared in constant time against every known one,
so neither the comparison nor which token matched leaks through timing; they are never logged.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from inferd.errors import PermissionDeniedError, UnauthenticatedError

AUTHORIZATION_HEADER = "authorization"
# What a 401 tells the client to send (RFC 6750).
WWW_AUTHENTICATE = 'Bearer realm="inferd"'


class Access(enum.Enum):
    PUBLIC = "public"
    DATA = "data"
    MANAGEMENT = "management"
    PLATFORM = "platform"


@dataclass(frozen=True, slots=True)
class TokenSet:
    """Tokens as digests: what a heap dump or a repr shows is not a usable token."""

    digests: tuple[bytes, ...]

    @classmethod
    def of(cls, tokens: Iterable[str]) -> TokenSet:
        return cls(tuple(_digest(token.encode()) for token in tokens))

    def holds(self, token: bytes) -> bool:
        presented = _digest(token)
        found = False
        for digest in self.digests:  # every one compared, whichever matches
            found |= hmac.compare_digest(presented, digest)
        return found


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    management: TokenSet | None
    data: TokenSet | None

    def needs_token(self, access: Access) -> bool:
        """Whether a call of this access must carry a token (what the OpenAPI document says)."""
        if access is Access.DATA:
            return self.data is not None
        if access is Access.MANAGEMENT:
            return self.management is not None or self.data is not None
        return False

    def check(self, access: Access, authorization: bytes | None) -> None:
        """Return if the credentials (an Authorization value) cover `access`; else raise 401 or 403."""
        if access is Access.PUBLIC or access is Access.PLATFORM:
            return
        if access is Access.DATA and self.data is None:
            return
        if self.management is None and self.data is None:
            return
        token = _bearer_token(authorization)
        if self.management is not None and self.management.holds(token):
            return
        if self.data is not None and self.data.holds(token):
            # Without management tokens, the management API is as protected as the data plane.
            if access is Access.DATA or self.management is None:
                return
            raise PermissionDeniedError("an inference token cannot call the management API; use a management token")
        raise UnauthenticatedError(f"the {access.value} API needs a valid token: the one sent is not known")


def check_local_client(
    policy: AccessPolicy | None,
    peer_is_local: bool,
    authorization: bytes | None,
    what: str = "shared memory is registered",
) -> None:
    """Operations for a client on this host, or one the operator gave a management token: shared
    memory registration (the server maps what the client names), TF Serving's config reload (it
    unloads and loads models whatever the control mode). `what` names it in the refusal."""
    if peer_is_local:
        return
    if policy is not None and policy.management is not None and authorization:
        scheme, _, token = authorization.strip().partition(b" ")
        if scheme.lower() == b"bearer" and policy.management.holds(token.strip()):
            return
    raise PermissionDeniedError(
        f"{what} only by a client on this host (a loopback address) or one holding a "
        "management token (--management-tokens-file)"
    )


def is_loopback_host(host: str) -> bool:
    """Whether an address (a peer's, or one to listen on) is this host's loopback: 127.0.0.0/8, ::1, an
    IPv4-mapped 127.x, or "localhost". A name or anything unparsable is not."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def grpc_authorization(metadata: Sequence[tuple[str, str | bytes]] | None) -> bytes | None:
    """A gRPC call's authorization metadata, as bytes (None when it sent none)."""
    for key, value in metadata or ():
        if key == AUTHORIZATION_HEADER:
            return value.encode() if isinstance(value, str) else value
    return None


def grpc_peer_is_local(peer: str) -> bool:
    """grpc's peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "unix:/path") names a client on
    this host: a loopback address or a Unix socket."""
    kind, _, rest = peer.partition(":")
    if kind == "unix" or kind == "unix-abstract":
        return True
    if kind in ("ipv4", "ipv6"):
        return is_loopback_host(rest.rpartition(":")[0])
    return False


def _bearer_token(authorization: bytes | None) -> bytes:
    if not authorization:
        raise UnauthenticatedError("this API needs a token: send 'Authorization: Bearer TOKEN'")
    scheme, _, token = authorization.strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        raise UnauthenticatedError("send the token as 'Authorization: Bearer TOKEN'")
    return token


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def read_tokens(file: str | None, environment_variable: str) -> TokenSet | None:
    """Tokens from a file (one a line; blank lines and # comments skipped) and from an environment
    variable (comma-separated): several at once let a token be rotated without a gap. None if neither
    names any."""
    tokens: list[str] = []
    if file is not None:
        for line in Path(file).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                tokens.append(line)
    tokens.extend(token.strip() for token in os.environ.get(environment_variable, "").split(",") if token.strip())
    return TokenSet.of(tokens) if tokens else None

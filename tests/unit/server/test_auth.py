"""The access rules of server.auth, by scope and by which tokens are configured."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.errors import PermissionDeniedError, UnauthenticatedError
from inferd.server.auth import (
    Access,
    AccessPolicy,
    TokenSet,
    check_local_client,
    grpc_peer_is_local,
    is_loopback_host,
    read_tokens,
)

ADMIN, USER = b"Bearer admin-token", b"Bearer user-token"


def policy(management: bool, data: bool) -> AccessPolicy:
    return AccessPolicy(
        management=TokenSet.of(["admin-token"]) if management else None,
        data=TokenSet.of(["user-token"]) if data else None,
    )


@pytest.mark.parametrize("access", [Access.PUBLIC, Access.PLATFORM])
def test_public_and_platform_routes_take_no_token(access: Access) -> None:
    policy(True, True).check(access, None)


def test_management_tokens_only_leave_the_data_plane_open() -> None:
    rules = policy(management=True, data=False)
    rules.check(Access.DATA, None)
    rules.check(Access.MANAGEMENT, ADMIN)
    with pytest.raises(UnauthenticatedError, match="needs a token"):
        rules.check(Access.MANAGEMENT, None)
    with pytest.raises(UnauthenticatedError, match="not known"):
        rules.check(Access.MANAGEMENT, USER)


def test_inference_tokens_cannot_manage_when_management_tokens_exist() -> None:
    rules = policy(management=True, data=True)
    rules.check(Access.DATA, USER)
    rules.check(Access.DATA, ADMIN)
    with pytest.raises(PermissionDeniedError):
        rules.check(Access.MANAGEMENT, USER)


def test_without_management_tokens_management_is_as_protected_as_the_data_plane() -> None:
    rules = policy(management=False, data=True)
    rules.check(Access.MANAGEMENT, USER)
    with pytest.raises(UnauthenticatedError):
        rules.check(Access.MANAGEMENT, None)


@pytest.mark.parametrize(
    "header", [b"", b"Bearer", b"Bearer ", b"Basic admin-token", b"admin-token", b"Token admin-token"]
)
def test_only_a_bearer_token_is_read(header: bytes) -> None:
    with pytest.raises(UnauthenticatedError):
        policy(True, False).check(Access.MANAGEMENT, header)


def test_the_scheme_is_case_insensitive_and_the_token_is_not() -> None:
    rules = policy(True, False)
    rules.check(Access.MANAGEMENT, b"bEaReR admin-token")
    with pytest.raises(UnauthenticatedError):
        rules.check(Access.MANAGEMENT, b"Bearer ADMIN-TOKEN")


def test_tokens_are_held_as_digests() -> None:
    held = TokenSet.of(["admin-token"])
    assert b"admin-token" not in b"".join(held.digests) and "admin-token" not in repr(held)


def test_tokens_come_from_a_file_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "tokens"
    file.write_text("# a comment\n\n  one  \ntwo\n", encoding="utf-8")
    monkeypatch.setenv("TOKENS_FOR_TEST", " three , ,four")
    tokens = read_tokens(str(file), "TOKENS_FOR_TEST")
    assert tokens is not None and len(tokens.digests) == 4
    for token in (b"one", b"two", b"three", b"four"):
        assert tokens.holds(token)
    assert not tokens.holds(b"# a comment")
    monkeypatch.delenv("TOKENS_FOR_TEST")
    assert read_tokens(None, "TOKENS_FOR_TEST") is None


# -- who is on this host: shared memory registration -------------------------------------------------


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.0.2.2", False),
        ("fd00::2", False),
        ("::ffff:192.0.2.2", False),
        ("example.org", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, local: bool) -> None:
    assert is_loopback_host(host) is local


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("ipv4:127.0.0.1:50000", True),
        ("ipv6:[::1]:50000", True),
        ("unix:/tmp/socket", True),
        ("ipv4:192.0.2.7:50000", False),
        ("ipv6:[fd00::7]:50000", False),
        ("ipv6:[::ffff:192.0.2.7]:50000", False),
        ("", False),
    ],
)
def test_grpc_peers_on_this_host(peer: str, local: bool) -> None:
    assert grpc_peer_is_local(peer) is local


def test_only_local_clients_or_management_tokens_register_shared_memory() -> None:
    check_local_client(None, True, None)
    check_local_client(policy(True, True), True, None)
    check_local_client(policy(True, True), False, ADMIN)
    for rules, authorization in ((None, None), (None, ADMIN), (policy(True, True), USER), (policy(False, True), USER)):
        with pytest.raises(PermissionDeniedError, match="on this host"):
            check_local_client(rules, False, authorization)

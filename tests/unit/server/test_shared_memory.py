"""server.shared_memory's regions over a folder standing in for /dev/shm, and the KServe door's
register route for a client that is not on this host (a request whose peer is not loopback: the
test's stand-in for another machine, which the tests cannot reach)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import orjson
import pytest

from inferd.core.service import InferenceService
from inferd.errors import InvalidRequestError, PermissionDeniedError
from inferd.limits import RequestLimits
from inferd.server.auth import AccessPolicy, TokenSet
from inferd.server.http import HttpApp
from inferd.server.http11 import HttpRequest
from inferd.server.kserve import KServeDoor
from inferd.server.routes import Router
from inferd.server.shared_memory import SharedMemoryRegions


def make_object(root: Path, name: str, data: bytes) -> None:
    (root / name).write_bytes(data)


def test_regions_on_one_object_share_one_mapping(tmp_path: Path) -> None:
    make_object(tmp_path, "data", bytes(range(64)))
    regions = SharedMemoryRegions(tmp_path, max_regions=8)
    for index in range(8):
        regions.register(f"r{index}", "/data", index * 8, 8)
    assert len(regions._objects) == 1
    assert regions.read("r3", 0, 8, "x") == bytes(range(24, 32))
    with pytest.raises(InvalidRequestError, match="--max-shared-memory-regions"):
        regions.register("r8", "/data", 0, 8)
    regions.unregister("r0")
    regions.register("r8", "/data", 0, 8)
    regions.unregister(None)
    assert not regions._objects


def test_a_failed_registration_keeps_no_mapping(tmp_path: Path) -> None:
    make_object(tmp_path, "small", b"x" * 16)
    regions = SharedMemoryRegions(tmp_path)
    with pytest.raises(InvalidRequestError, match="past the end"):
        regions.register("r", "/small", 8, 16)
    assert not regions._objects


def test_an_object_made_again_under_the_same_name_is_mapped_again(tmp_path: Path) -> None:
    make_object(tmp_path, "data", b"a" * 16)
    regions = SharedMemoryRegions(tmp_path)
    regions.register("old", "/data", 0, 16)
    (tmp_path / "data").unlink()
    make_object(tmp_path, "data", b"b" * 16)
    regions.register("new", "/data", 0, 16)
    assert regions.read("old", 0, 1, "x") == b"a" and regions.read("new", 0, 1, "x") == b"b"


def test_links_and_other_files_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 16)
    root = tmp_path / "shm"
    root.mkdir()
    (root / "link").symlink_to(secret)
    (root / "folder").mkdir()
    regions = SharedMemoryRegions(root)
    for key in ("/link", "/folder", "/../secret", "/a/b"):
        with pytest.raises(InvalidRequestError):
            regions.register("r", key, 0, 16)


def test_the_prefix(tmp_path: Path) -> None:
    make_object(tmp_path, "app_input", b"x" * 8)
    make_object(tmp_path, "other", b"x" * 8)
    regions = SharedMemoryRegions(tmp_path, prefix="/app_")
    regions.register("mine", "/app_input", 0, 8)
    with pytest.raises(PermissionDeniedError, match="--shared-memory-prefix"):
        regions.register("theirs", "/other", 0, 8)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")
def test_an_object_of_another_user_is_refused(tmp_path: Path) -> None:
    make_object(tmp_path, "theirs", b"x" * 8)
    os.chown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(PermissionDeniedError, match="another user"):
        SharedMemoryRegions(tmp_path).register("r", "/theirs", 0, 8)


def register_request(local_peer: bool, headers: dict[bytes, bytes] | None = None) -> HttpRequest:
    body = orjson.dumps({"key": "/data", "offset": 0, "byte_size": 8})
    path = "/v2/systemsharedmemory/region/r/register"
    return HttpRequest("POST", path, b"", headers or {}, body, local_peer=local_peer)


def door(tmp_path: Path, access: AccessPolicy | None) -> tuple[HttpApp, SharedMemoryRegions]:
    make_object(tmp_path, "data", b"x" * 8)
    regions = SharedMemoryRegions(tmp_path)
    group = KServeDoor(
        cast(InferenceService, object()), regions=regions, limits=RequestLimits(), access=access
    ).routes()
    return HttpApp(Router([group], fallback=group), max_request_bytes=1 << 20, access=access), regions


async def test_a_client_off_this_host_cannot_register(tmp_path: Path) -> None:
    app, regions = door(tmp_path, None)
    refused = await app(register_request(local_peer=False))
    assert refused.status == 403 and b"on this host" in refused.body
    assert not regions.status(None)
    assert (await app(register_request(local_peer=True))).status == 200
    assert [region.name for region in regions.status(None)] == ["r"]


async def test_a_management_token_registers_from_anywhere(tmp_path: Path) -> None:
    access = AccessPolicy(management=TokenSet.of(["admin"]), data=None)
    app, regions = door(tmp_path, access)
    assert (await app(register_request(local_peer=False))).status == 401
    accepted = await app(register_request(local_peer=False, headers={b"authorization": b"Bearer admin"}))
    assert accepted.status == 200 and regions.status("r")


async def test_cuda_registration_off_this_host_is_refused_first(tmp_path: Path) -> None:
    app, _ = door(tmp_path, None)
    path = "/v2/cudasharedmemory/region/r/register"
    body = orjson.dumps({"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8})
    refused = await app(HttpRequest("POST", path, b"", {}, body, local_peer=False))
    assert refused.status == 403 and b"on this host" in refused.body
    local = await app(HttpRequest("POST", path, b"", {}, body, local_peer=True))
    assert local.status == 400 and b"GPUs not supported" in local.body
    unregister = HttpRequest("POST", "/v2/cudasharedmemory/unregister", b"", {}, b"", local_peer=False)
    assert (await app(unregister)).status == 403

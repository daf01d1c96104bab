"""Triton's system shared memory extension, server side: regions a client on the same host
registered (a POSIX shared memory object, e.g. made by `tritonclient.utils.shared_memory`, mapped
here), from which inputs are read and into which outputs are written.

Safety: every read copies its bytes out while no other task can run (one memcpy, instead of HTTP's
receive and parse), and every write happens likewise, so a region unregistered while a request is
in flight is never touched after it is gone: the request's output then fails with a 400 naming the
region. Before each access the object's current size is checked (a client that shrinks it must not
crash the server with SIGBUS).

Who may map what: a client names the object, so the server opens only a regular file directly in
/dev/shm (no link followed), owned by the server's own user, and (with `--shared-memory-prefix`)
whose name starts with the prefix: another user's object, or any other file on the host, is never
mapped. Who may register (a client on this host, or one holding a management token) is the door's
check (`server.auth.AccessPolicy.check_local`). Descriptors are bounded: regions on one object share
one mapping, the mapping's own descriptor is the only one held, and regions are capped
(`--max-shared-memory-regions`), so registrations cannot use up the process's file descriptors."""

from __future__ import annotations

import logging
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from inferd.errors import (
    AlreadyExistsError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    with_triton_phrase,
)

logger = logging.getLogger("inferd.shared_memory")
SHM_ROOT = Path("/dev/shm")
DEFAULT_MAX_REGIONS = 256


@dataclass(slots=True)
class _MappedObject:
    """One POSIX shared memory object, mapped whole once for every region on it."""

    # (device, inode): the same file, not merely the same name.
    identity: tuple[int, int]
    map: mmap.mmap
    regions: int = 0

    def size(self) -> int:
        # mmap keeps its own descriptor of the object (a dup); its size() is the object's current size.
        return self.map.size()


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    _object: _MappedObject


class SharedMemoryRegions:
    """The registered regions by name (one table for the HTTP and gRPC doors). `prefix`: names a
    key must start with ("" for any); `max_regions`: how many may be registered at once."""

    def __init__(self, root: Path = SHM_ROOT, *, prefix: str = "", max_regions: int = DEFAULT_MAX_REGIONS) -> None:
        self._root = root
        self._prefix = prefix.removeprefix("/")
        self._max_regions = max_regions
        self._regions: dict[str, Region] = {}
        self._objects: dict[tuple[int, int], _MappedObject] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidRequestError("a shared memory region needs a name")
        if name in self._regions:
            raise AlreadyExistsError(f"shared memory region '{name}' already in manager: unregister it first")
        if offset < 0 or byte_size <= 0:
            raise InvalidRequestError(
                f"shared memory region '{name}': offset {offset} and byte_size {byte_size} must be >= 0 and > 0"
            )
        if len(self._regions) >= self._max_regions:
            raise InvalidRequestError(
                f"shared memory region '{name}': {len(self._regions)} regions are registered, the most this server "
                "holds (--max-shared-memory-regions); unregister one first"
            )
        mapped = self._map(name, key)
        size = min(len(mapped.map), mapped.size())
        if offset + byte_size > size:
            self._release(mapped)
            raise InvalidRequestError(
                f"shared memory region '{name}': offset {offset} + byte_size {byte_size} is past the end of "
                f"'{key}', which holds {size} bytes"
            )
        self._regions[name] = Region(name, key, offset, byte_size, mapped)
        logger.info("shared memory region %s registered: %s, %d bytes at %d", name, key, byte_size, offset)

    def unregister(self, name: str | None) -> None:
        """One region, or every one (`name` None). An unknown name is not an error (as in Triton)."""
        names = [name] if name is not None else list(self._regions)
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                self._release(region._object)
                logger.info("shared memory region %s unregistered", each)

    def status(self, name: str | None) -> list[Region]:
        if name is None:
            return list(self._regions.values())
        region = self._regions.get(name)
        if region is None:
            raise NotFoundError(f"Unable to find system shared memory region: '{name}'")
        return [region]

    def read(self, name: str, offset: int, byte_size: int, tensor: str) -> bytes:
        """A copy of `byte_size` bytes at `offset` within the region."""
        region, start = self._slice(name, offset, byte_size, tensor)
        return region._object.map[start : start + byte_size]

    def write(self, name: str, offset: int, byte_size: int, data: bytes, tensor: str) -> None:
        """`data` at `offset` within the region's slice of `byte_size` bytes (it must fit)."""
        if len(data) > byte_size:
            raise InvalidRequestError(
                f"output '{tensor}' needs {len(data)} bytes but its shared memory region '{name}' was given "
                f"shared_memory_byte_size {byte_size}",
                tensor=tensor,
                expected=f"{len(data)} bytes",
                actual=f"{byte_size} bytes",
            )
        region, start = self._slice(name, offset, byte_size, tensor)
        region._object.map[start : start + len(data)] = data

    def close(self) -> None:
        self.unregister(None)

    def _slice(self, name: str, offset: int, byte_size: int, tensor: str) -> tuple[Region, int]:
        region = self._regions.get(name)
        if region is None:
            raise InvalidRequestError(
                with_triton_phrase(
                    f"Unable to find shared memory region: '{name}'",
                    f"tensor '{tensor}': the region is not registered (or was unregistered while the request ran)",
                ),
                tensor=tensor,
            )
        # Triton's two sentences, which its clients' tests compare: the offset alone, then with the size.
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            triton = "Invalid offset" if offset < 0 or offset >= region.byte_size else "Invalid offset + byte size"
            raise InvalidRequestError(
                with_triton_phrase(
                    f"{triton} for shared memory region: '{name}'",
                    f"tensor '{tensor}': offset {offset} + byte size {byte_size} is past the end of the region "
                    f"({region.byte_size} bytes)",
                ),
                tensor=tensor,
            )
        start = region.offset + offset
        if region._object.size() < start + byte_size:
            raise InvalidRequestError(
                f"tensor '{tensor}': the shared memory object behind region '{name}' ('{region.key}') shrank below "
                "what was registered",
                tensor=tensor,
            )
        return region, start

    def _map(self, name: str, key: str) -> _MappedObject:
        """The mapping of the object `key` names, shared with the regions already on it (the same
        file, not merely the same name: an object removed and made again is mapped again)."""
        path = self._path(name, key)
        try:
            # O_NOFOLLOW: a link in /dev/shm must not lead to another file of the host.
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidRequestError(
                f"Unable to open shared memory region: '{key}' for region '{name}' ({exc.strerror}); create it "
                "on this host first (tritonclient.utils.shared_memory.create_shared_memory_region)"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidRequestError(f"shared memory region '{name}': '{key}' is not a shared memory object")
            if info.st_uid != os.geteuid():
                raise PermissionDeniedError(
                    f"shared memory region '{name}': '{key}' belongs to another user than the server's; only objects "
                    "of the server's own user are mapped"
                )
            identity = (info.st_dev, info.st_ino)
            mapped = self._objects.get(identity)
            if mapped is None:
                if info.st_size == 0:
                    raise InvalidRequestError(f"shared memory region '{name}': '{key}' is empty")
                mapped = _MappedObject(identity, mmap.mmap(fd, info.st_size, mmap.MAP_SHARED))
                self._objects[identity] = mapped
            mapped.regions += 1
            return mapped
        finally:
            os.close(fd)  # the mapping holds a descriptor of its own

    def _release(self, mapped: _MappedObject) -> None:
        mapped.regions -= 1
        if mapped.regions == 0:
            del self._objects[mapped.identity]
            mapped.map.close()

    def _path(self, name: str, key: str) -> Path:
        # POSIX shared memory names are "/name": one component, no other slash.
        bare = key[1:] if key.startswith("/") else key
        if not bare or "/" in bare or "\0" in bare or bare in (".", ".."):
            raise InvalidRequestError(
                f"shared memory region '{name}': key '{key}' is not a POSIX shared memory name (such as '/input0')"
            )
        if not bare.startswith(self._prefix):
            raise PermissionDeniedError(
                f"shared memory region '{name}': key '{key}' does not start with '/{self._prefix}', the prefix this "
                "server maps (--shared-memory-prefix)"
            )
        return self._root / bare

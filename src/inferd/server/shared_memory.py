"""Triton's system shared memory extension, server side: regions a client on the same host
registered (a POSIX shared memory object, e.g. made by `tritonclient.utils.shared_memory`, mapped
here), from which inputs are read and into which outputs are written.

Safety: every read copies its bytes out while no other task can run (one memcpy, instead of HTTP's
receive and parse), and every write happens likewise, so a region unregistered while a request is
in flight is never touched after it is gone: the request's output then fails with a 400 naming the
region. Before each access the object's current size is checked (a client that shrinks it must not
crash the server with SIGBUS)."""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from inferd.errors import AlreadyExistsError, InvalidRequestError, NotFoundError

logger = logging.getLogger("inferd.shared_memory")
SHM_ROOT = Path("/dev/shm")


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    _fd: int
    _map: mmap.mmap

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class SharedMemoryRegions:
    """The registered regions by name (one table for the HTTP and gRPC doors)."""

    def __init__(self, root: Path = SHM_ROOT) -> None:
        self._root = root
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidRequestError("a shared memory region needs a name")
        if name in self._regions:
            raise AlreadyExistsError(f"shared memory region '{name}' already in manager: unregister it first")
        if offset < 0 or byte_size <= 0:
            raise InvalidRequestError(
                f"shared memory region '{name}': offset {offset} and byte_size {byte_size} must be >= 0 and > 0"
            )
        path = self._path(name, key)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidRequestError(
                f"Unable to open shared memory region: '{key}' for region '{name}' ({exc.strerror}); create it "
                "on this host first (tritonclient.utils.shared_memory.create_shared_memory_region)"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidRequestError(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} is past the end of "
                    f"'{key}', which holds {size} bytes"
                )
            mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = Region(name, key, offset, byte_size, fd, mapped)
        logger.info("shared memory region %s registered: %s, %d bytes at %d", name, key, byte_size, offset)

    def unregister(self, name: str | None) -> None:
        """One region, or every one (`name` None). An unknown name is not an error (as in Triton)."""
        names = [name] if name is not None else list(self._regions)
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                region.close()
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
        return region._map[start : start + byte_size]

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
        region._map[start : start + len(data)] = data

    def close(self) -> None:
        self.unregister(None)

    def _slice(self, name: str, offset: int, byte_size: int, tensor: str) -> tuple[Region, int]:
        region = self._regions.get(name)
        if region is None:
            raise InvalidRequestError(
                f"tensor '{tensor}': shared memory region '{name}' is not registered (or was unregistered while "
                "the request ran)",
                tensor=tensor,
            )
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidRequestError(
                f"tensor '{tensor}': offset {offset} + byte size {byte_size} is past the end of shared memory "
                f"region '{name}' ({region.byte_size} bytes)",
                tensor=tensor,
            )
        start = region.offset + offset
        if os.fstat(region._fd).st_size < start + byte_size:
            raise InvalidRequestError(
                f"tensor '{tensor}': the shared memory object behind region '{name}' ('{region.key}') shrank below "
                "what was registered",
                tensor=tensor,
            )
        return region, start

    def _path(self, name: str, key: str) -> Path:
        # POSIX shared memory names are "/name": one component, no other slash.
        bare = key[1:] if key.startswith("/") else key
        if not bare or "/" in bare or "\0" in bare or bare in (".", ".."):
            raise InvalidRequestError(
                f"shared memory region '{name}': key '{key}' is not a POSIX shared memory name (such as '/input0')"
            )
        return self._root / bare

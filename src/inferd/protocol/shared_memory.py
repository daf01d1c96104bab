"""Triton's system shared memory extension on the wire: the tensor parameters that place an input
or output in a registered region (`shared_memory_region`, `shared_memory_byte_size`,
`shared_memory_offset`), the register body and the status documents. The regions themselves are
the server's (`server/shared_memory.py`); codecs reach them through `RegionAccess`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inferd.errors import MalformedRequestError
from inferd.protocol.tensor_bytes import tensor_to_bytes
from inferd.types import Tensor

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"


class RegionAccess(Protocol):
    def read(self, name: str, offset: int, byte_size: int, tensor: str) -> bytes: ...

    def write(self, name: str, offset: int, byte_size: int, data: bytes, tensor: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Placement:
    region: str
    byte_size: int
    offset: int = 0


def placement(parameters: Mapping[str, Any], tensor: str) -> Placement | None:
    """Where a tensor's parameters place it, or None when they do not name a region."""
    region = parameters.get(REGION)
    if region is None:
        return None
    if not isinstance(region, str) or not region:
        raise MalformedRequestError(f"tensor '{tensor}': {REGION} must be a region's name", tensor=tensor)
    byte_size, offset = parameters.get(BYTE_SIZE), parameters.get(OFFSET, 0)
    for key, value in ((BYTE_SIZE, byte_size), (OFFSET, offset)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise MalformedRequestError(
                f"tensor '{tensor}': {key} must be a whole number >= 0 with {REGION} (got {value!r})", tensor=tensor
            )
    return Placement(region, int(byte_size), int(offset))  # type: ignore[arg-type]


def read_input(place: Placement, regions: RegionAccess | None, tensor: str) -> bytes:
    if regions is None:
        raise MalformedRequestError(f"input '{tensor}': shared memory is not served by this door", tensor=tensor)
    return regions.read(place.region, place.offset, place.byte_size, tensor)


def write_outputs(
    outputs: Sequence[Tensor], wishes: Mapping[str, Mapping[str, Any]], regions: RegionAccess | None
) -> dict[str, dict[str, Any]]:
    """Writes each output a request placed in shared memory; returns those outputs by name, with the
    region, the bytes written and the offset (the response entry then carries no data, as Triton's)."""
    placed: dict[str, dict[str, Any]] = {}
    for tensor in outputs:
        place = placement(wishes.get(tensor.name, {}), tensor.name)
        if place is None:
            continue
        if regions is None:
            raise MalformedRequestError(
                f"output '{tensor.name}': shared memory is not served by this door", tensor=tensor.name
            )
        data = tensor_to_bytes(tensor)
        regions.write(place.region, place.offset, place.byte_size, data, tensor.name)
        placed[tensor.name] = {REGION: place.region, BYTE_SIZE: len(data)}
        if place.offset:
            placed[tensor.name][OFFSET] = place.offset
    return placed


def register_body(document: Any) -> tuple[str, int, int]:
    """A register request's `key`, `offset` and `byte_size` (HTTP JSON body)."""
    if not isinstance(document, dict):
        raise MalformedRequestError("a register request is a JSON object with 'key', 'offset' and 'byte_size'")
    key, offset, byte_size = document.get("key"), document.get("offset", 0), document.get("byte_size")
    if not isinstance(key, str) or not key:
        raise MalformedRequestError("register: 'key' must name the shared memory object, such as '/input0'")
    for field, value in (("offset", offset), ("byte_size", byte_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise MalformedRequestError(f"register: '{field}' must be a whole number >= 0 (got {value!r})")
    return key, int(offset), int(byte_size)  # type: ignore[arg-type]


def status_json(regions: Sequence[Any]) -> list[dict[str, Any]]:
    """Triton's HTTP status: one entry a region (each with name, key, offset and byte_size)."""
    return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]


def status_proto(regions: Sequence[Any]) -> Any:
    from tritonclient.grpc import service_pb2 as pb

    message = pb.SystemSharedMemoryStatusResponse()
    for r in regions:
        entry = message.regions[r.name]
        entry.name, entry.key, entry.offset, entry.byte_size = r.name, r.key, r.offset, r.byte_size
    return message

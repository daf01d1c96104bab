"""What the server knows of each model: its records, and the request lookup table built from them.

Everything here is data and queries. A `Snapshot` is immutable: the records and the table of
ready handles by (name, version as asked), made whole from the records on every change and
swapped in one assignment (`Catalogue.publish`), so a request's lookup is one dict read that never
races a loader, and a metrics scrape on another thread reads a consistent one. Only the event
loop's thread publishes (core.lifecycle does); any thread may read.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from inferd.config.model import ModelConfig
from inferd.core.handle import Handle
from inferd.core.repository import FileEntry, ModelFingerprint
from inferd.errors import ModelNotFoundError, ModelNotReadyError, VersionNotFoundError, with_triton_phrase
from inferd.types import LoadTimings

# The reasons of a model that serves nothing because it was asked to (not because it failed):
# such a model may load again on demand, and does not count against readiness.
UNLOADED = "unloaded"
EVICTED = "evicted to make room"
# Unloaded after its idle time (core.idle_unload): its next request loads it again (a cold start).
SCALED_TO_ZERO = "scaled to zero"
AT_REST = (UNLOADED, EVICTED, SCALED_TO_ZERO)


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass(frozen=True, slots=True)
class VersionRecord:
    version: int
    state: ModelState
    reason: str = ""
    handle: Handle | None = None
    timings: LoadTimings | None = None
    # The version's files and the model's config as loaded, to tell a changed model from the same one.
    files: tuple[FileEntry, ...] | None = None
    config: ModelConfig | None = None
    # The runtime's estimate of what the loaded version keeps resident.
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ModelRecord:
    name: str
    state: ModelState
    reason: str = ""
    versions: Mapping[int, VersionRecord] = field(default_factory=lambda: MappingProxyType({}))
    # What the repository held when this record was made (None for files sent with a load request).
    fingerprint: ModelFingerprint | None = None
    # A folder inferd made for the model's files (sent with a load request): removed on unload,
    # kept while the model rests (scaled to zero or evicted: it loads again from there).
    owned_dir: Path | None = None
    # The config a load request gave in place of config.pbtxt: a model at rest loads again with it.
    override: ModelConfig | None = None

    def ready_versions(self) -> list[int]:
        return sorted(v for v, r in self.versions.items() if r.state is ModelState.READY)

    @property
    def memory_bytes(self) -> int:
        return sum(v.memory_bytes for v in self.versions.values() if v.handle is not None)

    @property
    def busy(self) -> bool:
        """Some request is inside one of its handles (queued, waiting or executing)."""
        return any(v.handle is not None and v.handle.in_flight for v in self.versions.values())

    def default_version(self) -> VersionRecord | None:
        """The highest ready version, which serves requests that name no version (as in Triton)."""
        ready = self.ready_versions()
        return self.versions[ready[-1]] if ready else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    models: Mapping[str, ModelRecord]
    # (name, version as asked, "" for the default) -> the ready handle serving it.
    serving: Mapping[tuple[str, str], Handle]
    # Those of `serving` that may refuse a request before its body is decoded (a bounded queue):
    # every request asks, so a model without a bound costs one dictionary miss.
    shedding: Mapping[tuple[str, str], Handle]

    @classmethod
    def of(cls, models: Mapping[str, ModelRecord]) -> Snapshot:
        serving: dict[tuple[str, str], Handle] = {}
        for name, record in models.items():
            for version, version_record in record.versions.items():
                if version_record.state is ModelState.READY and version_record.handle is not None:
                    serving[(name, str(version))] = version_record.handle
            default = record.default_version()
            if default is not None and default.handle is not None:
                serving[(name, "")] = default.handle
        shedding = {key: handle for key, handle in serving.items() if handle.sheds}
        return cls(MappingProxyType(dict(models)), MappingProxyType(serving), MappingProxyType(shedding))


class Catalogue:
    """The current snapshot and the questions asked of it; `publish` and `drop` replace it."""

    def __init__(self) -> None:
        # Replaced whole, never changed in place (see the module's docstring).
        self.snapshot = Snapshot.of({})

    def publish(self, record: ModelRecord) -> None:
        models = dict(self.snapshot.models)
        models[record.name] = record
        self.snapshot = Snapshot.of(models)

    def drop(self, name: str) -> None:
        """Forget `name`'s record (it serves nothing)."""
        models = dict(self.snapshot.models)
        models.pop(name, None)
        self.snapshot = Snapshot.of(models)

    def records(self) -> list[ModelRecord]:
        return list(self.snapshot.models.values())

    def record(self, name: str) -> ModelRecord:
        record = self.snapshot.models.get(name)
        if record is None:
            raise ModelNotFoundError(
                with_triton_phrase(f"Request for unknown model: '{name}' is not found",
                                   f"model '{name}' is not loaded or not in the repository")
            )  # fmt: skip
        return record

    def version_record(self, name: str, version: str) -> VersionRecord:
        """The version asked for ("" = the default one), ready or not."""
        record = self.record(name)
        if not version:
            default = record.default_version()
            if default is None:
                raise ModelNotReadyError(
                    with_triton_phrase(f"Request for unknown model: '{name}' has no available versions",
                                       _not_ready_message(record))
                )  # fmt: skip
            return default
        if not (version.isascii() and version.isdigit()):  # int() refuses "¹", which isdigit() takes
            raise VersionNotFoundError(
                with_triton_phrase(f"failed to get model version from specified version string '{version}'",
                                   f"model '{name}' version '{version}' is not a positive integer")
            )  # fmt: skip
        found = record.versions.get(int(version))
        if found is None:
            raise VersionNotFoundError(
                with_triton_phrase(f"Request for unknown model: '{name}' version {version} is not found",
                                   f"model '{name}' has no version {version}; loaded versions: "
                                   f"{sorted(record.versions)}")
            )  # fmt: skip
        return found

    def ready_handle(self, name: str, version: str) -> Handle:
        """The ready handle serving (name, version), or the error that says why there is none."""
        found = self.snapshot.serving.get((name, version))
        if found is not None:
            return found
        version_record = self.version_record(name, version)
        reason = f": {version_record.reason}" if version_record.reason else ""
        raise ModelNotReadyError(
            with_triton_phrase(
                f"Request for unknown model: '{name}' version {version_record.version} is not at ready state",
                f"model '{name}' version {version_record.version} is not ready ({version_record.state.value}){reason}",
            )
        )

    def serves(self, name: str) -> bool:
        record = self.snapshot.models.get(name)
        return record is not None and bool(record.ready_versions())

    def owned_dir(self, name: str) -> Path | None:
        record = self.snapshot.models.get(name)
        return record.owned_dir if record is not None else None

    def all_ready(self, resting: Collection[str] = ()) -> bool:
        """Every model loaded (or that failed to) is ready; ones at rest (unloaded, evicted or scaled
        to zero: they load again when asked) do not count, nor the `resting` ones (loading on a
        request's demand)."""
        return all(
            r.state is ModelState.READY
            for r in self.snapshot.models.values()
            if r.reason not in AT_REST and r.name not in resting
        )


def _not_ready_message(record: ModelRecord) -> str:
    reason = f": {record.reason}" if record.reason else ""
    return f"model '{record.name}' is not ready ({record.state.value}){reason}"

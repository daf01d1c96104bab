"""The catalogue: the lookup table a snapshot builds from its records (each ready version, the
default as the highest ready one, the shedding ones apart), published whole so that an older
snapshot never changes, and each question's error saying why nothing serves."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import pytest

from inferd.config.model import ModelConfig
from inferd.core.catalogue import UNLOADED, Catalogue, ModelRecord, ModelState, Snapshot, VersionRecord
from inferd.core.handle import Handle
from inferd.errors import ModelNotFoundError, ModelNotReadyError, VersionNotFoundError


@dataclass(slots=True)
class SheddingHandle(Handle):
    @property
    def sheds(self) -> bool:
        return True


def handle(name: str, version: int) -> Handle:
    return Handle(config=ModelConfig(name=name), version=version)


def record(name: str, *versions: VersionRecord, state: ModelState = ModelState.READY, reason: str = "") -> ModelRecord:
    return ModelRecord(name, state, reason, MappingProxyType({v.version: v for v in versions}))


def ready(name: str, version: int, found: Handle | None = None) -> VersionRecord:
    return VersionRecord(version, ModelState.READY, handle=found or handle(name, version))


def test_every_ready_version_serves_and_the_highest_ready_one_is_the_default() -> None:
    one, three = ready("m", 1), ready("m", 3)
    loading = VersionRecord(5, ModelState.LOADING)
    snapshot = Snapshot.of({"m": record("m", one, three, loading)})
    assert snapshot.serving == {("m", "1"): one.handle, ("m", "3"): three.handle, ("m", ""): three.handle}
    assert snapshot.shedding == {}


def test_only_handles_that_may_refuse_are_asked_before_decoding() -> None:
    bounded = SheddingHandle(config=ModelConfig(name="b"), version=1)
    snapshot = Snapshot.of({"a": record("a", ready("a", 1)), "b": record("b", ready("b", 1, bounded))})
    assert snapshot.shedding == {("b", "1"): bounded, ("b", ""): bounded}


def test_publishing_replaces_the_snapshot_and_leaves_the_old_one_as_it_was() -> None:
    catalogue = Catalogue()
    catalogue.publish(record("m", ready("m", 1)))
    before = catalogue.snapshot
    catalogue.publish(record("n", ready("n", 1)))
    catalogue.drop("m")
    assert set(before.models) == {"m"} and ("m", "") in before.serving
    assert set(catalogue.snapshot.models) == {"n"} and ("m", "") not in catalogue.snapshot.serving


def test_each_question_says_why_nothing_serves() -> None:
    catalogue = Catalogue()
    catalogue.publish(record("m", ready("m", 1), VersionRecord(2, ModelState.FAILED, reason="bad file")))
    catalogue.publish(record("gone", state=ModelState.FAILED, reason=UNLOADED))
    assert catalogue.ready_handle("m", "1") is catalogue.ready_handle("m", "")
    with pytest.raises(ModelNotFoundError, match="'nothing' is not found"):
        catalogue.ready_handle("nothing", "")
    with pytest.raises(ModelNotReadyError, match=r"version 2 is not ready \(UNAVAILABLE\): bad file"):
        catalogue.ready_handle("m", "2")
    with pytest.raises(VersionNotFoundError, match="has no version 7; loaded versions: \\[1, 2\\]"):
        catalogue.ready_handle("m", "7")
    with pytest.raises(VersionNotFoundError, match="is not a positive integer"):
        catalogue.ready_handle("m", "¹")
    with pytest.raises(ModelNotReadyError, match=r"'gone' is not ready \(UNAVAILABLE\): unloaded"):
        catalogue.ready_handle("gone", "")


def test_readiness_ignores_models_unloaded_on_purpose_but_not_failed_ones() -> None:
    catalogue = Catalogue()
    catalogue.publish(record("m", ready("m", 1)))
    catalogue.publish(record("gone", state=ModelState.FAILED, reason=UNLOADED))
    assert catalogue.all_ready() and catalogue.serves("m") and not catalogue.serves("gone")
    catalogue.publish(record("broken", state=ModelState.FAILED, reason="no model file"))
    assert not catalogue.all_ready()

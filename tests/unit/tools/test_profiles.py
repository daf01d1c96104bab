"""The profile file: written and read back unchanged, merged across models, scaled to another machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.tools import profiles


def profile(model: str, throughput: float, cpu: str = "cpu A") -> profiles.Profile:
    best = profiles.Operating(throughput, 2.0, 8.0, 4, {"max_batch_size": 8})
    single = profiles.Operating(throughput / 4, 1.0, 2.0, 1, {"max_batch_size": 8})
    return profiles.Profile(profiles.Machine(cpu, 2, 24.0), {model: profiles.ModelProfile(100.0, 1.5, best, single)})


def test_a_profile_round_trips(tmp_path: Path) -> None:
    original = profile("minilm", 400.0)
    profiles.write(original, tmp_path / "profile.json")
    assert profiles.read(tmp_path / "profile.json") == original


def test_profiles_merge_and_scale() -> None:
    merged = profiles.merge([profile("a", 100.0), profile("b", 200.0)])
    assert sorted(merged.models) == ["a", "b"]
    faster = merged.scaled(2.0)
    assert faster.models["a"].best.throughput == 200.0 and faster.models["a"].best.p99_ms == 4.0
    assert faster.machine.scale == 2.0 and faster.models["a"].memory_mb == 100.0
    with pytest.raises(ValueError, match="different machines"):
        profiles.merge([profile("a", 1.0), profile("b", 1.0, cpu="cpu B")])


def test_a_file_that_is_not_a_profile_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text('{"schema": "something/1"}')
    with pytest.raises(ValueError, match="not an inferd profile"):
        profiles.read(tmp_path / "other.json")

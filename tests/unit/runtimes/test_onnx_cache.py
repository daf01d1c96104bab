"""The optimized-model cache, through real ONNX Runtime sessions of models built by code."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from inferd.config.model import InstanceGroup, ModelConfig
from inferd.runtimes import onnx_cache
from inferd.runtimes.base import RuntimeOptions
from inferd.runtimes.onnx import OnnxRuntime, optimized_engine
from inferd.runtimes.onnx_cache import GRAPH_FILE, WEIGHTS_FILE, OptimizedModelCache, open_cache
from inferd.testing.models import mlp_model

pytestmark = pytest.mark.timeout(60)

# 16 x 512 + 512 x 512 weights: 1.1 MB, over the size worth an entry.
LARGE = (16, 512, 512, 4)
ENGINE = "onnxruntime test"


def large_model(folder: Path, seed: int = 0) -> Path:
    path = folder / "1" / "model.onnx"
    mlp_model(path, LARGE, seed=seed)
    return path


def runtime(path: Path, cache: OptimizedModelCache | None) -> OnnxRuntime:
    options = RuntimeOptions(InstanceGroup(), intra_op_threads=None, onnx_cache=cache)
    return OnnxRuntime(ModelConfig(name="mlp"), path.parent, options)


def mapped_files() -> set[str]:
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return {line.split()[-1] for line in maps if line.rstrip().endswith(WEIGHTS_FILE)}


def entries(cache: OptimizedModelCache) -> list[Path]:
    return sorted(p for p in cache.folder.iterdir() if p.is_dir() and len(p.name) == 64)


@pytest.fixture
def cache(tmp_path: Path) -> OptimizedModelCache:
    made = open_cache(tmp_path / "cache", 1 << 30)
    assert made is not None
    return made


def run(model: OnnxRuntime) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    return model.execute({"x": x}, ["y"])["y"]


def test_the_first_session_writes_the_entry_and_the_next_maps_its_weights(
    tmp_path: Path, cache: OptimizedModelCache
) -> None:
    path = large_model(tmp_path / "mlp")
    first = runtime(path, cache)
    (entry,) = entries(cache)
    assert (entry / GRAPH_FILE).is_file() and (entry / WEIGHTS_FILE).stat().st_size > 1 << 20
    weights = str(entry / WEIGHTS_FILE)
    assert weights not in mapped_files()  # the first session read the model's own file
    second = runtime(path, cache)
    assert weights in mapped_files()
    assert np.array_equal(run(first), run(second))
    assert np.array_equal(run(second), run(runtime(path, None)))
    assert entries(cache) == [entry]


def test_a_small_model_gets_no_entry(tmp_path: Path, cache: OptimizedModelCache) -> None:
    path = tmp_path / "mlp" / "1" / "model.onnx"
    mlp_model(path)
    run(runtime(path, cache))
    assert entries(cache) == []


def test_the_entry_follows_the_contents_the_engine_and_the_file_name(
    tmp_path: Path, cache: OptimizedModelCache
) -> None:
    path = large_model(tmp_path / "a")
    entry = cache.entry_for(path, ENGINE)
    assert entry is not None
    assert cache.entry_for(large_model(tmp_path / "b"), ENGINE) == entry  # same bytes elsewhere: same entry
    assert cache.entry_for(path, "onnxruntime other") != entry
    other = large_model(tmp_path / "c", seed=5)  # same size, other weights
    assert other.stat().st_size == path.stat().st_size
    assert cache.entry_for(other, ENGINE) != entry
    path.rename(path.with_name("other.onnx"))
    assert cache.entry_for(path.with_name("other.onnx"), ENGINE) != entry


def test_a_file_changed_in_place_is_read_again(
    tmp_path: Path, cache: OptimizedModelCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = large_model(tmp_path / "a")
    monkeypatch.setattr(onnx_cache, "RECENT_CHANGE_S", 0.0)  # its digest is remembered at once
    before = cache.entry_for(path, ENGINE)
    time.sleep(0.05)  # past the kernel's timestamp tick, so the change time moves
    old = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    with path.open("r+b") as file:  # the same inode, the same size
        file.write(data)
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))  # and its modification time put back
    assert path.stat().st_mtime_ns == old.st_mtime_ns
    assert cache.entry_for(path, ENGINE) != before


def test_a_settled_file_is_hashed_once_per_machine(
    tmp_path: Path, cache: OptimizedModelCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = large_model(tmp_path / "a")
    monkeypatch.setattr(onnx_cache, "RECENT_CHANGE_S", 3600.0)
    cache.entry_for(path, ENGINE)
    assert list((cache.folder / "digests").iterdir()) == []  # just written: not remembered yet
    monkeypatch.setattr(onnx_cache, "RECENT_CHANGE_S", 0.0)
    entry = cache.entry_for(path, ENGINE)
    assert len(list((cache.folder / "digests").iterdir())) == 1
    hashed: list[object] = []
    real = onnx_cache.hashlib.file_digest

    def counting(file: object, digest: str) -> object:
        hashed.append(file)
        return real(file, digest)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx_cache.hashlib, "file_digest", counting)
    restarted = open_cache(cache.folder, cache.max_bytes)  # a new server: its memory is empty
    assert restarted is not None
    assert restarted.entry_for(path, ENGINE) == entry
    assert hashed == []


def test_a_damaged_entry_is_written_again_and_the_model_still_loads(
    tmp_path: Path, cache: OptimizedModelCache, caplog: pytest.LogCaptureFixture
) -> None:
    path = large_model(tmp_path / "mlp")
    expected = run(runtime(path, cache))
    (entry,) = entries(cache)
    (entry / GRAPH_FILE).write_bytes(b"not a model")
    with caplog.at_level(logging.WARNING, logger="inferd.onnx"):
        assert np.array_equal(run(runtime(path, cache)), expected)
    assert "not loaded" in caplog.text
    assert entries(cache) == [entry] and (entry / GRAPH_FILE).stat().st_size > 100
    again = runtime(path, cache)
    assert str(entry / WEIGHTS_FILE) in mapped_files()
    assert np.array_equal(run(again), expected)


def test_a_failed_write_leaves_no_entry_and_the_model_loads(
    tmp_path: Path, cache: OptimizedModelCache, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = large_model(tmp_path / "mlp")
    monkeypatch.setattr(cache, "writing_folder", lambda: tmp_path / "gone" / "folder")  # ORT cannot write there
    with caplog.at_level(logging.WARNING, logger="inferd.onnx"):
        assert np.array_equal(run(runtime(path, cache)), run(runtime(path, None)))
    assert "not cached" in caplog.text
    assert entries(cache) == []


def test_a_corrupt_model_fails_with_its_own_error(tmp_path: Path, cache: OptimizedModelCache) -> None:
    path = tmp_path / "bad" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x08" * (2 << 20))
    with pytest.raises(Exception, match="onnxruntime cannot load"):
        runtime(path, cache)
    assert entries(cache) == []
    assert not [p for p in cache.folder.iterdir() if p.name.startswith(".")]


def test_the_least_recently_used_entries_go_past_the_size(tmp_path: Path) -> None:
    size = (large_model(tmp_path / "probe")).stat().st_size
    cache = open_cache(tmp_path / "cache", int(size * 2.5))  # room for two
    assert cache is not None
    paths = [large_model(tmp_path / name, seed=seed) for seed, name in enumerate("abc")]
    runtime(paths[0], cache)
    runtime(paths[1], cache)
    first, second = (cache.entry_for(p, _engine()) for p in paths[:2])
    assert first is not None and second is not None
    old = time.time() - 100
    os.utime(second.folder, (old, old))
    runtime(paths[0], cache)  # a hit: the first is now the more recently used
    abandoned = cache.folder / f".writing-{'0' * 32}"  # a writer that died an hour ago and more
    abandoned.mkdir()
    os.utime(abandoned, (old - 4000, old - 4000))
    runtime(paths[2], cache)
    third = cache.entry_for(paths[2], _engine())
    assert third is not None
    assert set(entries(cache)) == {first.folder, third.folder}
    assert not abandoned.exists()


def _engine() -> str:
    import onnxruntime as ort

    return optimized_engine(ort.SessionOptions())


def test_a_folder_others_may_write_or_a_size_of_zero_is_no_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert open_cache(tmp_path / "off", 0) is None
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="inferd.onnx_cache"):
        assert open_cache(shared, 1 << 30) is None
    assert "not this user's alone" in caplog.text
    made = open_cache(tmp_path / "new" / "cache", 1 << 30)
    assert made is not None
    assert stat.S_IMODE(made.folder.stat().st_mode) == 0o700


def test_a_cache_folder_removed_under_the_server_costs_no_load(
    tmp_path: Path, cache: OptimizedModelCache, caplog: pytest.LogCaptureFixture
) -> None:
    path = large_model(tmp_path / "mlp")
    shutil.rmtree(cache.folder)
    with caplog.at_level(logging.WARNING, logger="inferd.onnx"):
        assert np.array_equal(run(runtime(path, cache)), run(runtime(path, None)))
    assert "not cached" in caplog.text


def test_a_model_replaced_while_its_entry_is_written_leaves_no_entry(
    tmp_path: Path, cache: OptimizedModelCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository updated in place during a load: the entry named by the old bytes must not hold
    the new graph, or putting the old model back would serve the new one."""
    path = large_model(tmp_path / "mlp", seed=1)
    old_bytes = path.read_bytes()
    old_answer = run(runtime(path, None))
    real_writing_folder = cache.writing_folder

    def replaced_meanwhile() -> Path:
        large_model(tmp_path / "new", seed=2).replace(path)
        return real_writing_folder()

    monkeypatch.setattr(cache, "writing_folder", replaced_meanwhile)
    runtime(path, cache)
    assert entries(cache) == []
    monkeypatch.undo()
    path.write_bytes(old_bytes)
    assert np.array_equal(run(runtime(path, cache)), old_answer)
    assert np.array_equal(run(runtime(path, cache)), old_answer)  # from the entry, now written


def test_half_an_entry_is_replaced_by_the_next_write(tmp_path: Path, cache: OptimizedModelCache) -> None:
    path = large_model(tmp_path / "mlp")
    runtime(path, cache)
    (entry,) = entries(cache)
    (entry / GRAPH_FILE).unlink()  # a removal cut short: the weights are left
    runtime(path, cache)
    assert (entry / GRAPH_FILE).is_file()
    loaded = runtime(path, cache)
    assert str(entry / WEIGHTS_FILE) in mapped_files()
    loaded.close()


def test_eviction_removes_only_what_the_cache_made(tmp_path: Path) -> None:
    """--onnx-cache-dir may name a folder that holds other things (~/.cache): they stay."""
    folder = tmp_path / "shared"
    (folder / "pip").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    (folder / ".writing-mine").mkdir()
    old = time.time() - 10_000
    for child in folder.iterdir():
        os.utime(child, (old, old))
    folder.chmod(0o700)
    cache = open_cache(folder, 1)  # room for nothing
    assert cache is not None
    cache.evict()
    assert {p.name for p in folder.iterdir()} == {"pip", "notes.txt", ".writing-mine", "digests"}

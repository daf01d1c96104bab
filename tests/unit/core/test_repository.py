"""Repository sources: listing, fingerprints, a remote repository's cache (on fsspec's in-memory
filesystem, a real fsspec filesystem), and names that must not escape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from inferd.core.repository import FsspecRepository, LinkedModels, LocalRepository, Repositories, is_plain_name
from inferd.errors import InvalidRequestError, ModelLoadError, ModelNotFoundError, TooManyModelsError


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[tuple[FsspecRepository, fsspec.AbstractFileSystem]]:
    fs = fsspec.filesystem("memory")
    root = f"/repo-{tmp_path.name}"
    fs.pipe(f"{root}/m/config.pbtxt", b"max_batch_size: 8")
    fs.pipe(f"{root}/m/1/model.onnx", b"one")
    fs.pipe(f"{root}/m/2/model.onnx", b"two")
    fs.pipe(f"{root}/m/warmup/x.bin", b"\x00")
    yield FsspecRepository(f"memory://{root}", tmp_path / "cache"), fs
    fs.rm(root, recursive=True)


def test_remote_models_are_listed_and_fingerprinted(remote: tuple[FsspecRepository, fsspec.AbstractFileSystem]) -> None:
    repository, _ = remote
    assert repository.model_names() == ["m"]
    fingerprint = repository.fingerprint("m")
    assert fingerprint.version_numbers == [1, 2]
    assert [entry[0] for entry in fingerprint.shared] == ["config.pbtxt", "warmup/x.bin"]


def test_localize_fetches_the_chosen_versions_once_and_release_drops_them(
    remote: tuple[FsspecRepository, fsspec.AbstractFileSystem],
) -> None:
    repository, fs = remote
    local = repository.localize("m", [2])
    assert (local / "config.pbtxt").read_bytes() == b"max_batch_size: 8"
    assert (local / "2" / "model.onnx").read_bytes() == b"two"
    assert (local / "warmup" / "x.bin").exists() and not (local / "1").exists()
    fetched = (local / "2" / "model.onnx").stat().st_ino
    assert repository.localize("m", [2]) == local
    assert (local / "2" / "model.onnx").stat().st_ino == fetched  # unchanged: not fetched again
    fs.pipe(repository.describe().removeprefix("memory://") + "/m/2/model.onnx", b"two, changed")
    repository.localize("m", [2])
    assert (local / "2" / "model.onnx").read_bytes() == b"two, changed"
    repository.release("m")
    assert not local.exists()


def test_unknown_and_hostile_names_are_not_found(
    remote: tuple[FsspecRepository, fsspec.AbstractFileSystem], tmp_path: Path
) -> None:
    repository, _ = remote
    for name in ("nope", "..", "../m", "m/1", ".hidden", ""):
        assert not is_plain_name(name) or name == "nope"
        with pytest.raises(ModelNotFoundError):
            repository.fingerprint(name)
    local = LocalRepository(tmp_path)
    (tmp_path / "outside").mkdir()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "link").symlink_to(tmp_path / "outside")
    assert LocalRepository(tmp_path / "repo").model_names() == []
    with pytest.raises(ModelNotFoundError):
        local.fingerprint("..")


def test_a_name_in_two_repositories_is_refused(tmp_path: Path) -> None:
    for model_dir in (tmp_path / "a" / "same", tmp_path / "b" / "same", tmp_path / "a" / "only_a"):
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / "model.onnx").write_bytes(b"x")
    both = Repositories([LocalRepository(tmp_path / "a"), LocalRepository(tmp_path / "b")])
    assert both.model_names() == ["only_a", "same"]
    assert both.fingerprint("only_a").version_numbers == [1]
    with pytest.raises(ModelLoadError, match="several model repositories"):
        both.fingerprint("same")


def test_a_plain_name_is_one_folder_name_a_file_system_takes(tmp_path: Path) -> None:
    for name in ("a\nb", "a\0b", "a\rb", "tab\there", "del\x7f", "x" * 256, "é" * 128, "a\\b"):
        assert not is_plain_name(name), name
        # Never an OSError (ENAMETOOLONG, an embedded NUL) from looking it up: simply not there.
        assert not LocalRepository(tmp_path).has_model(name)
    for name in ("x" * 255, "é" * 127, "model-1.onnx_v2", "modèle"):
        assert is_plain_name(name), name


def test_linked_folders_take_plain_names_and_at_most_max_models(tmp_path: Path) -> None:
    linked = LinkedModels(max_models=2)
    for name in ("..", "a/b", "a\nb", "x" * 5000):
        with pytest.raises(InvalidRequestError, match="is not one folder name"):
            linked.link(name, tmp_path)
    linked.link("one", tmp_path)
    linked.link("two", tmp_path)
    linked.link("two", tmp_path / "again")  # relinking a name takes no room
    with pytest.raises(TooManyModelsError, match="2 models loaded from folders"):
        linked.link("three", tmp_path)
    linked.unlink("one")
    linked.link("three", tmp_path)
    assert linked.model_names() == ["three", "two"]

"""`JobStorage.write_all_once` on local folders: each object written once, whole, whatever becomes
of the others written with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.core.job_storage import JobStorage, StoredObject
from inferd.errors import InvalidRequestError

pytestmark = pytest.mark.timeout(30)


def test_objects_written_together_are_each_written_once_and_one_failure_stops_only_its_own(tmp_path: Path) -> None:
    storage = JobStorage(str(tmp_path / "payloads"), str(tmp_path / "out"), str(tmp_path / "failed"), ())
    (tmp_path / "out" / "there.out").write_bytes(b"first")
    objects = [
        StoredObject(storage.output_location("a"), b"A"),
        StoredObject(storage.output_location("there"), b"second"),
        StoredObject((tmp_path / "gone" / "x.out").as_uri(), b"X"),  # its folder does not exist
        StoredObject(storage.failure_location("b"), b'{"error": "no"}', "application/json"),
    ]
    written = storage.write_all_once(objects)
    assert written[:2] == [True, False] and isinstance(written[2], FileNotFoundError) and written[3] is True
    assert (tmp_path / "out" / "a.out").read_bytes() == b"A"
    assert (tmp_path / "out" / "there.out").read_bytes() == b"first"  # the one there is kept
    assert (tmp_path / "failed" / "b-error.out").read_bytes() == b'{"error": "no"}'
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.endswith(".partial")]
    assert leftovers == []
    assert storage.write_all_once(objects[:1]) == [False]  # a retry writes nothing
    (tmp_path / "out" / "squatted.out").mkdir()  # not an object: writing there fails, never "written"
    (squatted,) = storage.write_all_once([StoredObject(storage.output_location("squatted"), b"S")])
    assert isinstance(squatted, FileExistsError)
    with pytest.raises(FileNotFoundError):
        storage.write_once(objects[2].location, b"X")


def test_an_output_path_extension_is_folders_of_plain_names_under_the_operators_paths(tmp_path: Path) -> None:
    storage = JobStorage(str(tmp_path / "payloads"), str(tmp_path / "out"), str(tmp_path / "failed"), ())
    extension = storage.output_extension("/team-a//2026/")
    assert extension == "team-a/2026/"
    assert storage.output_location("j", extension) == (tmp_path / "out" / "team-a" / "2026" / "j.out").as_uri()
    assert (tmp_path / "out" / "team-a" / "2026").is_dir() and (tmp_path / "failed" / "team-a" / "2026").is_dir()
    assert storage.output_extension("") == ""
    (tmp_path / "out" / "plain").write_bytes(b"not a folder")
    wrong_ones = ("../models", "a/../../b", "a/.hidden", "a b", "/".join("x" * 9), "victim.out", "plain/x")
    for wrong in wrong_ones:
        with pytest.raises(InvalidRequestError):
            storage.output_extension(wrong)

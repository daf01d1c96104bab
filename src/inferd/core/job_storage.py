"""`JobStorage`: where asynchronous jobs' bodies are read from and their results written to: local
folders (`file://` URLs) or any fsspec URL (`s3://bucket/prefix`, with the standard AWS credential
chain and AWS_ENDPOINT_URL as boto reads them).

The operator chooses every place the server writes (the payload, output and failure paths) and
every root a caller's input location may lie under; a caller chooses only which object under an
input root a job reads. An object's name is made by the server from the job's id, which is
checked to be a plain name, so no caller can write outside those paths (into a model repository,
say) or read outside the roots.

Results are written once per key: a local file is written beside its name and hard-linked into
place (the link fails when the name exists), an S3 object is PUT with `If-None-Match: *`. A second
writer (a job run again after its worker died) finds the object there and writes nothing, so a
bucket with versioning shows one version per job. The results of jobs that end together are
written together (`write_all_once`): local files are all written, then all flushed, linked and
their folder flushed once, which costs the disk far less than a flush of each in turn; remote
objects are PUT at once, each on a thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from inferd.errors import InvalidRequestError, PermissionDeniedError

# Folders an output path extension may name, one in another.
_MAX_EXTENSION_DEPTH = 8
# How the names of jobs' objects end: no folder of an extension may be named so.
_OBJECT_SUFFIXES = (".out", ".in", ".partial")
# A job id a caller may give (SageMaker's InferenceId is at most 64 printable characters): a plain
# name, so that `{id}.out` stays inside its folder.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id) or ".." in job_id:
        raise InvalidRequestError(
            f"inference id {job_id[:140]!r} must be 1 to 128 letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or digit"
        )
    return job_id


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object to write: where, its bytes, and (for an object store) its content type."""

    location: str
    data: bytes
    content_type: str = "application/octet-stream"


# What writing an object came to: True (written now), False (one was there), or what stopped it.
Written = bool | Exception

# Remote objects PUT at once.
_REMOTE_WRITERS = 8


def new_job_id() -> str:
    return str(uuid.uuid4())


def location_url(place: str) -> str:
    """A folder or URL as a URL: local paths become absolute `file://` URLs."""
    if "://" in place:
        return place.rstrip("/")
    return Path(place).resolve().as_uri()


class JobStorage:
    def __init__(self, payload_path: str, output_path: str, failure_path: str, input_roots: tuple[str, ...]) -> None:
        """`payload_path`: where inline bodies are kept; `output_path`, `failure_path`: where results
        and failure documents go; `input_roots`: what a caller's input location may lie under."""
        self.payload_path = location_url(payload_path)
        self.output_path = location_url(output_path)
        self.failure_path = location_url(failure_path)
        self._input_roots = tuple(location_url(root) for root in input_roots)
        self._remote_writers: ThreadPoolExecutor | None = None
        for place in (self.payload_path, self.output_path, self.failure_path):
            if place.startswith("file://"):
                _local(place).mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        if self._remote_writers is not None:
            self._remote_writers.shutdown(wait=True)

    def payload_location(self, job_id: str) -> str:
        return f"{self.payload_path}/{job_id}.in"

    def output_location(self, job_id: str, extension: str = "") -> str:
        return f"{self.output_path}/{extension}{job_id}.out"

    def failure_location(self, job_id: str, extension: str = "") -> str:
        return f"{self.failure_path}/{extension}{job_id}-error.out"

    def output_extension(self, extension: str) -> str:
        """A caller's extension of the output and failure paths (SageMaker's S3OutputPathExtension),
        as the prefix `output_location` takes: a relative path of plain names (each as a job id
        is, so none can climb out), at most 8 deep; its local folders are made."""
        parts = [part for part in extension.strip("/").split("/") if part]
        if not parts:
            return ""
        if len(parts) > _MAX_EXTENSION_DEPTH:
            raise InvalidRequestError(f"output path extension {extension[:140]!r} is more than 8 folders deep")
        for part in parts:
            check_job_id(part)
            if part.endswith(_OBJECT_SUFFIXES):  # a folder where a job's object goes would squat it
                raise InvalidRequestError(f"output path extension {extension[:140]!r}: {part!r} names an object")
        prefix = "/".join(parts) + "/"
        for place in {self.output_path, self.failure_path}:
            if place.startswith("file://"):
                try:
                    (_local(place) / prefix).mkdir(parents=True, exist_ok=True)
                except (FileExistsError, NotADirectoryError):
                    raise InvalidRequestError(
                        f"output path extension {extension[:140]!r} names an object, not a folder"
                    ) from None
        return prefix

    def check_input(self, location: str) -> str:
        """`location` when it lies under an input root (a local one after links are followed);
        else PermissionDeniedError (403), saying which roots there are."""
        parsed = urlparse(location)
        if parsed.scheme == "file":
            path = _local(location)
            resolved = path.resolve()
            for root in self._input_roots:
                if root.startswith("file://") and resolved.is_relative_to(_local(root).resolve()):
                    if not resolved.is_file():
                        raise InvalidRequestError(f"input location {location!r} is not a file")
                    return resolved.as_uri()
        elif parsed.scheme and parsed.netloc and "/../" not in f"{parsed.path}/":
            for root in self._input_roots:
                if location.startswith(root + "/"):
                    return location
        roots = ", ".join(self._input_roots) or "none: the server takes inline bodies only"
        raise PermissionDeniedError(
            f"input location {location!r} is not under an input root the server reads (--async-input-root: {roots})"
        )

    # -- blocking I/O (the server calls these on a thread) ------------------------------------

    def read(self, location: str) -> bytes:
        if location.startswith("file://"):
            return _local(location).read_bytes()
        import fsspec

        with fsspec.open(location, "rb") as file:
            data: bytes = file.read()
        return data

    def adopt(self, location: str, path: Path) -> None:
        """Keep the file at `path` (a body written to disk as it arrived) as the object at
        `location`, unless one is there; the file is gone after. Local: linked into place (on one
        filesystem, no copy); elsewhere: uploaded from the file in parts, never read whole."""
        try:
            if location.startswith("file://"):
                with contextlib.suppress(FileExistsError):
                    os.link(path, _local(location))
            else:
                filesystem, remote = _filesystem(location)
                if not filesystem.exists(remote):
                    filesystem.put_file(str(path), remote)
        finally:
            path.unlink(missing_ok=True)

    def discard_payload(self, location: str) -> None:
        """Remove an inline body the server kept (a caller's own input is never touched)."""
        if not location.startswith(self.payload_path + "/"):
            return
        if location.startswith("file://"):
            _local(location).unlink(missing_ok=True)
            return
        filesystem, path = _filesystem(location)
        with contextlib.suppress(FileNotFoundError):
            filesystem.rm_file(path)

    def exists(self, location: str) -> bool:
        if location.startswith("file://"):
            return _local(location).exists()
        filesystem, path = _filesystem(location)
        return bool(filesystem.exists(path))

    def write_once(self, location: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        """Write `data` at `location` unless an object is there already: True when written now."""
        (written,) = self.write_all_once([StoredObject(location, data, content_type)])
        if isinstance(written, Exception):
            raise written
        return written

    def write_all_once(self, objects: Sequence[StoredObject]) -> list[Written]:
        """Write each object unless one is there already; for each, True when written now, False
        when it was there, or the exception that stopped it (the others are written still)."""
        written: list[Written] = [False] * len(objects)
        local = [i for i, stored in enumerate(objects) if stored.location.startswith("file://")]
        remote = [i for i, stored in enumerate(objects) if not stored.location.startswith("file://")]
        for i, outcome in zip(local, _write_local_all_once([objects[i] for i in local]), strict=True):
            written[i] = outcome
        if len(remote) == 1:
            written[remote[0]] = _outcome(_put_once, objects[remote[0]])
        elif remote:
            if self._remote_writers is None:
                self._remote_writers = ThreadPoolExecutor(_REMOTE_WRITERS, thread_name_prefix="inferd-put")
            outcomes = self._remote_writers.map(lambda i: _outcome(_put_once, objects[i]), remote)
            for i, outcome in zip(remote, outcomes, strict=True):
                written[i] = outcome
        return written


def _outcome(write: Callable[[StoredObject], bool], stored: StoredObject) -> Written:
    try:
        return write(stored)
    except Exception as exc:
        return exc


def _put_once(stored: StoredObject) -> bool:
    filesystem, path = _filesystem(stored.location)
    extra: dict[str, Any] = {"ContentType": stored.content_type} if stored.location.startswith("s3://") else {}
    try:
        filesystem.pipe_file(path, stored.data, mode="create", **extra)
    except FileExistsError:
        return False
    except OSError as exc:  # s3fs reports S3's 412 Precondition Failed as an OSError of its own
        if "PreconditionFailed" in str(exc) or "412" in str(exc):
            return False
        raise
    return True


def _local(url: str) -> Path:
    return Path(unquote(urlparse(url).path))


def _filesystem(location: str) -> tuple[Any, str]:
    import fsspec

    filesystem, path = fsspec.core.url_to_fs(location)
    return filesystem, path


def _write_local_all_once(objects: Sequence[StoredObject]) -> list[Written]:
    """Local files, each written once: all written beside their names, then all flushed, then each
    linked into place (a link fails where the name exists), then each folder flushed once, so
    that a name on disk always has its whole content behind it."""
    written: list[Written] = [False] * len(objects)
    partials: dict[int, Path] = {}
    try:
        for i, stored in enumerate(objects):
            path = _local(stored.location)
            partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
            try:
                partials[i] = partial
                partial.write_bytes(stored.data)
            except OSError as exc:
                written[i] = exc
        for i, partial in partials.items():
            if not isinstance(written[i], Exception):
                try:
                    _flush(partial)
                except OSError as exc:
                    written[i] = exc
        folders = set()
        for i, partial in partials.items():
            if isinstance(written[i], Exception):
                continue
            path = _local(objects[i].location)
            try:
                os.link(partial, path)
            except FileExistsError:
                if not path.is_file():  # something else holds the name: not this object
                    written[i] = FileExistsError(f"{path} exists and is not a file")
                continue
            except OSError as exc:
                written[i] = exc
                continue
            written[i] = True
            folders.add(path.parent)
        for folder in folders:
            with contextlib.suppress(OSError):  # the names' folder entries on disk too
                _flush(folder)
    finally:
        for partial in partials.values():
            partial.unlink(missing_ok=True)
    return written


def _flush(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

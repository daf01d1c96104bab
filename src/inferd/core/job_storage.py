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
bucket with versioning shows one version per job.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from inferd.errors import InvalidRequestError, PermissionDeniedError

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
        for place in (self.payload_path, self.output_path, self.failure_path):
            if place.startswith("file://"):
                _local(place).mkdir(parents=True, exist_ok=True)

    def payload_location(self, job_id: str) -> str:
        return f"{self.payload_path}/{job_id}.in"

    def output_location(self, job_id: str) -> str:
        return f"{self.output_path}/{job_id}.out"

    def failure_location(self, job_id: str) -> str:
        return f"{self.failure_path}/{job_id}-error.out"

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
        if location.startswith("file://"):
            return _write_local_once(_local(location), data)
        filesystem, path = _filesystem(location)
        extra: dict[str, Any] = {"ContentType": content_type} if location.startswith("s3://") else {}
        try:
            filesystem.pipe_file(path, data, mode="create", **extra)
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


def _write_local_once(path: Path, data: bytes) -> bool:
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    with partial.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    try:
        os.link(partial, path)
    except FileExistsError:
        return False
    finally:
        partial.unlink()
    with contextlib.suppress(OSError):  # the name's folder entry on disk too
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return True

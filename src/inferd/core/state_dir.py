"""`StateDir`: where the server keeps what users set through its API (`--state-dir DIR`), so that it
survives a restart or a `kill -9`: endpoints now; rollouts and queues as they come.

Each kind of state is one JSON document, replaced whole and atomically: written beside its name
(under a name of the writer's own), flushed to disk, renamed over the old one, and the folder
flushed, so a crash at any moment leaves the old document or the new one, never half of either.

Several processes may share the directory (replicas on shared storage, a fleet's rollout
controller): `update` changes a document under an advisory lock (flock on a file beside it), so
one writer's change is never written over by another's read before it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, IO[bytes]] = {}

    def hold(self, owner: str) -> None:
        """Mark `owner` (this process) alive for as long as it runs: an exclusive flock on a file of
        the owner's name, which the operating system releases when the process ends, however it
        ends. Another process holding it now is an error."""
        if owner in self._held:
            return
        file = open(self._owner_file(owner), "a+b")  # noqa: SIM115 (held open: the lock is the file's)
        for _ in range(50):  # another process asking `alive` holds it for an instant
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._held[owner] = file
                return
            except BlockingIOError:
                time.sleep(0.02)
        file.close()
        raise RuntimeError(f"another process runs as '{owner}' on {self.path}")

    def close(self) -> None:
        """Let go of the owners this process holds (its end does too)."""
        for file in self._held.values():
            file.close()
        self._held.clear()

    def alive(self, owner: str) -> bool:
        """Whether a process holds `owner` now (`hold`)."""
        if owner in self._held:
            return True
        path = self._owner_file(owner)
        if not path.exists():
            return False
        with open(path, "a+b") as file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(file, fcntl.LOCK_UN)
            return False

    def _owner_file(self, owner: str) -> Path:
        return self.path / f".owner-{re.sub(r'[^A-Za-z0-9_.-]', '_', owner)}.lock"

    def folder(self, name: str) -> Path:
        """A folder of the state directory's for files of one kind (shadows' logs), made if missing."""
        path = self.path / name
        path.mkdir(exist_ok=True)
        return path

    def read(self, name: str) -> Any | None:
        """The document kept as `name`, or None when none is."""
        try:
            text = (self.path / f"{name}.json").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        return json.loads(text)

    def stamp(self, name: str) -> tuple[int, int] | None:
        """When the document kept as `name` was last replaced, and its size (None when none is):
        what a reader compares to know, without reading it, whether it changed."""
        try:
            found = (self.path / f"{name}.json").stat()
        except FileNotFoundError:
            return None
        return found.st_mtime_ns, found.st_size

    def update(self, name: str, change: Callable[[Any | None], Any]) -> tuple[int, int] | None:
        """Replace the document kept as `name` by `change(it)` (None when there is none), with no
        other process's `update` in between; the stamp of what was written."""
        with open(self.path / f".{name}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self.write(name, change(self.read(name)))
                return self.stamp(name)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def write(self, name: str, document: Any) -> None:
        final = self.path / f"{name}.json"
        # A name of this writer's own: two processes writing at once never share a half-written file.
        partial = self.path / f".{name}.json.{os.getpid()}.{secrets.token_hex(4)}.partial"
        with partial.open("w", encoding="utf-8") as file:
            json.dump(document, file, indent=2, sort_keys=True)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        partial.replace(final)
        with contextlib.suppress(OSError):  # a folder cannot be opened on every platform
            folder = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)

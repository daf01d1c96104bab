"""`StateDir`: where the server keeps what users set through its API (`--state-dir DIR`), so that it
survives a restart or a `kill -9`: endpoints now; rollouts and queues as they come.

Each kind of state is one JSON document, replaced whole and atomically: written beside its name,
flushed to disk, renamed over the old one, and the folder flushed, so a crash at any moment leaves
the old document or the new one, never half of either.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

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

    def write(self, name: str, document: Any) -> None:
        final = self.path / f"{name}.json"
        partial = self.path / f".{name}.json.partial"
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

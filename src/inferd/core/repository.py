"""The model repository on storage, in Triton's layout: `<root>/<model>/config.pbtxt` and
`<root>/<model>/<version>/<model file>`, version folders named by positive integers.

`ModelRepository` is what the registry needs of any storage: list the models, fingerprint one
(so that polling sees what changed without reading model files), and localize a version to a
local folder a runtime can open. A local folder localizes to itself.

Names come from clients (a load request) and from listings, so every name is checked to be one
plain folder name before it touches a path: no separators, no `..`, nothing hidden; and a model
folder that is a symbolic link pointing outside the root is not served.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inferd.errors import InferdError, ModelNotFoundError


class RepositoryError(InferdError):
    """The repository root itself is unusable (missing, not a folder)."""


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What a model's files look like now, cheaply: sizes and modification times, no contents."""

    # config.pbtxt's (size, mtime_ns), or None when there is none.
    config: tuple[int, int] | None
    # version -> sorted (relative path, size, mtime_ns) of every file in its folder.
    versions: tuple[tuple[int, tuple[tuple[str, int, int], ...]], ...]

    def version(self, version: int) -> tuple[tuple[str, int, int], ...] | None:
        return dict(self.versions).get(version)


def is_plain_name(name: str) -> bool:
    """A single folder name: not empty, no separator, not `.`/`..`, not hidden."""
    return bool(name) and "/" not in name and "\\" not in name and "\x00" not in name and not name.startswith(".")


@dataclass(frozen=True, slots=True)
class ModelRepository:
    root: Path

    def check(self) -> None:
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.root} is not a folder")

    def model_names(self) -> list[str]:
        """Every model folder directly under the root, hidden ones excepted, sorted."""
        return sorted(p.name for p in self.root.iterdir() if is_plain_name(p.name) and self._is_model_dir(p))

    def has_model(self, name: str) -> bool:
        return is_plain_name(name) and self._is_model_dir(self.root / name)

    def model_dir(self, name: str) -> Path:
        """The model's folder; ModelNotFoundError for a name that is not one of the repository's models."""
        if not self.has_model(name):
            raise ModelNotFoundError(f"model '{name}' is not in the model repository {self.root}")
        return self.root / name

    def versions(self, name: str) -> list[int]:
        """Version folders of a model: positive integer names only, ascending."""
        model_dir = self.model_dir(name)
        found = []
        for child in model_dir.iterdir():
            if child.is_dir() and child.name.isdigit() and int(child.name) > 0:
                found.append(int(child.name))
        return sorted(found)

    def version_dir(self, name: str, version: int) -> Path:
        """A local folder holding the version's files (for a local repository, the folder itself)."""
        return self.model_dir(name) / str(version)

    def fingerprint(self, name: str) -> ModelFingerprint:
        model_dir = self.model_dir(name)
        config = model_dir / "config.pbtxt"
        config_stat = config.stat() if config.is_file() else None
        versions = []
        for version in self.versions(name):
            version_dir = model_dir / str(version)
            files = []
            for folder, _, filenames in os.walk(version_dir):
                for filename in filenames:
                    path = Path(folder) / filename
                    stat = path.stat()
                    files.append((str(path.relative_to(version_dir)), stat.st_size, stat.st_mtime_ns))
            versions.append((version, tuple(sorted(files))))
        return ModelFingerprint(
            config=(config_stat.st_size, config_stat.st_mtime_ns) if config_stat else None, versions=tuple(versions)
        )

    def _is_model_dir(self, path: Path) -> bool:
        if not path.is_dir():
            return False
        # A link may point anywhere: serve it only when it stays inside the repository.
        return not path.is_symlink() or path.resolve().is_relative_to(self.root.resolve())

"""The model repository on storage, in Triton's layout: `<root>/<model>/config.pbtxt` and
`<root>/<model>/<version>/<model file>`, version folders named by positive integers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferd.errors import InferdError


class RepositoryError(InferdError):
    """The repository root itself is unusable (missing, not a folder)."""


@dataclass(frozen=True, slots=True)
class ModelRepository:
    root: Path

    def check(self) -> None:
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.root} is not a folder")

    def model_names(self) -> list[str]:
        """Every folder directly under the root, hidden ones excepted, sorted."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def model_dir(self, name: str) -> Path:
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
        return self.model_dir(name) / str(version)

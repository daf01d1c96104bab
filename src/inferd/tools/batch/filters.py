"""SageMaker's data processing: --input-filter, --join-source and --output-filter (JSONPath).

The order is SageMaker's: the input filter picks what of each record the model gets; the join
puts the model's output beside the whole (unfiltered) record; the output filter picks what of the
joined record is written. CSV rows are JSON arrays here, so index paths (`$[1:]`, `$[0,-1]`) pick
their columns. Paths are RFC 9535 JSONPath (python-jsonpath), a superset of the operators
SageMaker documents (slices end before their end index, as the RFC and SageMaker's operator
table say): names with underscores, several ranges in one union, filters, all work.

What a path selects becomes: the value itself for a path that names one node (`$`, `$.features`,
`$[0]`); an object of the names for a union of names (`$['id','SageMakerOutput']`); otherwise a
list of what it matched, in order (`$[1:]`, `$[0,5:]`, `$.a.*`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonpath

from inferd.tools.batch.options import BatchUsageError

# SageMaker's reserved keys of a joined JSON record.
OUTPUT_KEY = "SageMakerOutput"
INPUT_KEY = "SageMakerInput"


class FilterError(ValueError):
    """A path found nothing to select in a record (that record's error)."""


@dataclass(frozen=True)
class JsonFilter:
    text: str
    _path: Any
    _singular: bool
    _everything: bool = False

    @classmethod
    def compile(cls, text: str, option: str) -> JsonFilter:
        try:
            path = jsonpath.compile(text)
        except jsonpath.JSONPathError as exc:
            raise BatchUsageError(f"{option} {text!r} is not a JSONPath: {exc}") from None
        singular = bool(getattr(path, "singular_query", lambda: False)())
        return cls(text, path, singular)

    @property
    def selects_all(self) -> bool:
        return self._everything

    def __post_init__(self) -> None:
        object.__setattr__(self, "_everything", self.text.strip() == "$")

    def apply(self, value: Any) -> Any:
        """What this path selects of `value` (see the module's docstring); FilterError when a path
        that names one node finds none."""
        if self.selects_all:
            return value
        matches = list(self._path.finditer(value))
        if self._singular:
            if not matches:
                raise FilterError(f"JSONPath {self.text!r} selects nothing in the record")
            return matches[0].obj
        if matches and all(isinstance(match.parts[-1], str) for match in matches) and _is_name_union(self.text):
            return {match.parts[-1]: match.obj for match in matches}
        return [match.obj for match in matches]


def _is_name_union(text: str) -> bool:
    """A path ending in a bracket of quoted names: `$['id','SageMakerOutput']`."""
    stripped = text.rstrip()
    if not stripped.endswith("]"):
        return False
    inside = stripped[stripped.rfind("[") + 1 : -1].strip()
    return bool(inside) and inside[0] in "'\""


def join(record: Any, output: Any) -> Any:
    """A JSON record and its output as SageMaker joins them: the output under `SageMakerOutput`
    of the record when it is an object, else both in a new object."""
    if isinstance(record, dict):
        return {**record, OUTPUT_KEY: output}
    return {INPUT_KEY: record, OUTPUT_KEY: output}

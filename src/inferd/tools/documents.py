"""The tools' files (profiles, plans): JSON, or YAML when the name ends in .yaml / .yml, each with a
`schema` field naming what it is, read with one-line errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import yaml


def is_yaml(path: Path) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")


def write_document(document: dict[str, Any], path: Path) -> None:
    if is_yaml(path):
        path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    else:
        path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


def read_document(path: Path, schema: str, what: str) -> dict[str, Any]:
    """The document at `path`; ValueError unless it is readable and says it is `schema` (`what`,
    such as "profile", names it in the message)."""
    try:
        document = yaml.safe_load(path.read_text("utf-8")) if is_yaml(path) else orjson.loads(path.read_bytes())
    except (OSError, yaml.YAMLError, orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a {what} ({exc})") from None
    if not isinstance(document, dict) or document.get("schema") != schema:
        found = document.get("schema") if isinstance(document, dict) else None
        raise ValueError(f"{path}: not an inferd {what} (schema {found!r}, expected {schema})")
    return document

"""config.parameters is the one table of the config.pbtxt parameters inferd reads: no module reads
a key of a model's `parameters` by a literal of its own, and every entry is read somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from inferd.config import parameters
from inferd.config.parameters import MODEL_PARAMETERS, ModelParameter

SOURCE = Path(parameters.__file__).resolve().parents[1]
# A key of a model config's parameters read as a literal (a request's parameters are read apart).
_LITERAL_READS = re.compile(
    r"config\.parameters\.get\(\s*\"|config\.parameters\[\s*\"|_parameter\(\s*config,\s*\"|\"\w+\"\s+in\s+config\.parameters"
)
# ... and through a local name for them, where a module makes one.
_ALIASED_READS = re.compile(r"\bparameters\.get\(\s*\"|\bparameters\[\s*\"")


def _sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in SOURCE.rglob("*.py") if path.name != "parameters.py"}


def test_no_module_reads_a_model_parameter_by_a_literal_of_its_own() -> None:
    found = []
    for path, text in _sources().items():
        aliased = "parameters = config.parameters" in text
        for line in text.splitlines():
            if _LITERAL_READS.search(line) or (aliased and _ALIASED_READS.search(line)):
                found.append(f"{path.relative_to(SOURCE)}: {line.strip()}")
    assert found == []


def test_a_literal_read_is_found() -> None:
    assert _LITERAL_READS.search('spinning = config.parameters.get("allow_spinning", "false")')
    assert _LITERAL_READS.search('if "padding" in config.parameters:')
    assert _ALIASED_READS.search('url = parameters.get("url", "")')


def test_every_entry_is_read_somewhere() -> None:
    names = {name for name, value in vars(parameters).items() if isinstance(value, ModelParameter)}
    assert {value.name for name, value in vars(parameters).items() if name in names} == {
        parameter.name for parameter in MODEL_PARAMETERS
    }
    text = "\n".join(_sources().values())
    unread = [name for name in names if not re.search(rf"\b{name}\b", text)]
    assert unread == []


def test_names_are_unique() -> None:
    assert len({parameter.name for parameter in MODEL_PARAMETERS}) == len(MODEL_PARAMETERS)

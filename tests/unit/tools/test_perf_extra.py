"""`pip install 'inferd[perf]'` brings what the Locust file (`inferd perf --locustfile`) needs
beyond inferd itself: the file runs inside locust and imports inferd's client, so locust has to be
installed in inferd's own environment, and the docs' `inferd perf` page says how."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from inferd.tools.perf import locustfile_path

ROOT = Path(__file__).resolve().parents[3]


def _imported_packages(path: str) -> set[str]:
    """The top-level packages a module imports, less the standard library and inferd."""
    found = set()
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.partition(".")[0])
    return found - set(sys.stdlib_module_names) - {"inferd", "__future__"}


def test_the_perf_extra_installs_what_the_locust_file_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    installed = {Requirement(text).name for text in project["dependencies"]}
    perf = {Requirement(text).name for text in project["optional-dependencies"].get("perf", [])}
    needed = _imported_packages(locustfile_path())  # each a distribution of the same name
    assert "locust" in needed
    assert needed <= installed | perf, needed - installed - perf


def test_the_docs_say_how_to_install_it() -> None:
    section = (ROOT / "docs" / "tools" / "perf.md").read_text(encoding="utf-8")
    assert "pip install 'inferd[perf]'" in section
    assert section.index("pip install 'inferd[perf]'") < section.index('locust -f "$(inferd perf --locustfile)"')

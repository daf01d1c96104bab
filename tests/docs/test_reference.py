"""The reference pages under docs/reference/ are generated from the code (scripts/docs_reference.py):
a change to a command, an error code, a metric or a route that does not regenerate them fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_reference_pages_are_current() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_reference.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr


def test_a_stale_page_is_found(tmp_path: Path) -> None:
    # The check compares what the code generates now with what is written: here, one page edited.
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for name, generate in docs_reference.PAGES.items():
        (tmp_path / name).write_text(generate(), encoding="utf-8")
    assert docs_reference.stale_pages(tmp_path) == []
    metrics = tmp_path / "metrics.md"
    metrics.write_text(metrics.read_text(encoding="utf-8").replace("inferd_queue_depth", "inferd_queue_length"))
    assert docs_reference.stale_pages(tmp_path) == ["metrics.md"]

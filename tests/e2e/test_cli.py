"""`inferd serve` as a user meets it: --help, and mistakes in its arguments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def inferd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferd", *args], capture_output=True, text=True, timeout=60)


def test_serve_help_explains_every_flag() -> None:
    completed = inferd("serve", "--help")
    assert completed.returncode == 0
    for flag in ("--model-repository", "--http-port", "--grpc-port", "--metrics-port", "--host", "--log-format"):
        assert flag in completed.stdout
    assert "[default: 8000" in completed.stdout


def test_missing_repository_is_a_usage_error(tmp_path: Path) -> None:
    completed = inferd("serve", "--model-repository", str(tmp_path / "nowhere"))
    assert completed.returncode == 2
    assert "does not exist" in completed.stderr


def test_bad_port_is_a_usage_error(tmp_path: Path) -> None:
    completed = inferd("serve", "--model-repository", str(tmp_path), "--http-port", "70000")
    assert completed.returncode == 2
    assert "--http-port" in completed.stderr

"""The state directory shared by processes: changes under its lock add up, and an owner is alive
exactly while its process runs (the system releases its lock however it ends)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferd.core.state_dir import StateDir

pytestmark = pytest.mark.timeout(60)

COUNT = """
import sys
from pathlib import Path
from inferd.core.state_dir import StateDir
state = StateDir(Path(sys.argv[1]))
for _ in range(50):
    state.update("counter", lambda kept: {"count": (kept or {"count": 0})["count"] + 1})
"""

HOLD = """
import sys, time
from pathlib import Path
from inferd.core.state_dir import StateDir
state = StateDir(Path(sys.argv[1]))  # held as long as the object (a server's lives as long as it)
state.hold("host-a:8000")
print("held", flush=True)
time.sleep(60)
"""


def test_updates_from_several_processes_add_up(tmp_path: Path) -> None:
    writers = [subprocess.Popen([sys.executable, "-c", COUNT, str(tmp_path)]) for _ in range(3)]
    assert [writer.wait(timeout=50) for writer in writers] == [0, 0, 0]
    assert StateDir(tmp_path).read("counter") == {"count": 150}
    assert not list(tmp_path.glob(".*partial"))


def test_an_owner_is_alive_while_its_process_runs_even_after_kill_9(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    assert not state.alive("host-a:8000")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert state.alive("host-a:8000")
        with pytest.raises(RuntimeError, match="another process runs as 'host-a:8000'"):
            state.hold("host-a:8000")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while state.alive("host-a:8000"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    state.hold("host-a:8000")  # a server restarted under the name takes it
    assert state.alive("host-a:8000")
    state.close()
    assert not state.alive("host-a:8000")

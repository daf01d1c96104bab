"""A throwaway Prometheus (Debian's, which `make test` installs) on 127.0.0.1 scraping given
targets every second, for the tests of a fleet's rollout judged by PromQL: its own port, its data
in the test's folder, stopped after."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from inferd.tools.ports import free_ports

SCRAPE_INTERVAL_S = 1.0


@contextlib.contextmanager
def run_prometheus(
    folder: Path, targets: Sequence[str], labels: Mapping[str, Mapping[str, str]] | None = None
) -> Iterator[str]:
    """A running Prometheus scraping `targets` (host:port of /metrics pages) every second, each
    target's series with its `labels` added (as Kubernetes' service discovery adds a pod's); yields
    its URL once it is ready."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    (port,) = free_ports(1)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    # JSON is YAML: the file is written by the library that cannot get YAML's quoting wrong.
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S:g}s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "inferd",
                        "static_configs": [
                            {"targets": [target], "labels": dict((labels or {}).get(target, {}))} for target in targets
                        ],
                    }
                ],
            }
        )
    )
    command = [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
    with (folder / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/-/ready", timeout=1) as ready:
                if ready.status == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {(folder / 'prometheus.log').read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def query(url: str, expression: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query's result (a vector's series, each with `metric` and `value`), evaluated now
    or `at` (seconds since the epoch: several queries at one instant see the same samples)."""
    parameters = {"query": expression, **({"time": f"{at:.3f}"} if at is not None else {})}
    address = f"{url}/api/v1/query?" + urllib.parse.urlencode(parameters)
    with urllib.request.urlopen(address, timeout=10) as response:
        document = json.loads(response.read())
    assert document["status"] == "success", document
    result: list[dict[str, Any]] = document["data"]["result"]
    return result


def wait_for_targets(url: str, count: int, timeout_s: float = 60.0) -> None:
    """Until Prometheus has scraped `count` targets successfully (`up` is 1 for each)."""
    deadline = time.monotonic() + timeout_s
    while len(query(url, "up == 1")) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Prometheus at {url} does not see {count} targets up")
        time.sleep(0.2)

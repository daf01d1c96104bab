"""Every page of the built docs site opens in headless Chromium (Debian's; `make test` installs it)
without a console message, served over HTTP as a user's browser would get it; the front page's
navigation is there, and its screenshot is taken."""

from __future__ import annotations

import functools
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium is missing: `make test` installs it (scripts/install_chromium.sh)"
    return found


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(built_site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def open_page(url: str, profile: Path, *extra: str) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and the console messages it logged."""
    run = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", "--window-size=1280,900", *extra, "--dump-dom", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


def test_every_page_opens_without_a_console_message(built_site: Path, site_url: str, tmp_path: Path) -> None:
    pages = sorted(path.parent.relative_to(built_site).as_posix() for path in built_site.rglob("index.html"))
    assert len(pages) > 30  # every page of the navigation, not a handful
    urls = [f"{site_url}/{page}/" if page != "." else f"{site_url}/" for page in pages]
    # One browser opens them all, each in a frame of one page (a browser started per page took a
    # minute): the page's load waits for every frame's, and a frame's console messages are logged
    # with its own address.
    (built_site / "every-page.html").write_text(
        "<!doctype html><html><body>"
        + "".join(f'<iframe src="{url}" width="1280" height="900"></iframe>' for url in urls)
        + "</body></html>",
        encoding="utf-8",
    )
    dom, console = open_page(f"{site_url}/every-page.html", tmp_path / "profile")
    assert dom.count("<iframe") == len(urls)
    assert not console, console


def test_the_front_page_shows_its_navigation(site_url: str, tmp_path: Path) -> None:
    screenshot = tmp_path / "front.png"
    dom, console = open_page(f"{site_url}/", tmp_path / "profile", f"--screenshot={screenshot}")
    assert not console, console
    for tab in ("Get started", "Serve models", "Call it", "Operate", "Tools", "Deploy", "Reference"):
        assert f">{tab}</a>" in dom.replace("\n", "").replace("  ", "") or tab in dom, tab
    assert 'class="md-tabs' in dom
    assert screenshot.stat().st_size > 20_000  # a rendered page, not a blank one

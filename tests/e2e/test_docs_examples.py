"""Every example the docs mark runnable runs against a real `inferd serve` of the example repository,
and prints what the page shows where the page shows it.

A page marks an example with an HTML comment on the line before its fence (invisible on GitHub
and on the site), and the output it prints the same way:

    <!-- run -->
    ```bash
    curl -s localhost:8000/v2/health/ready -o /dev/null -w '%{http_code}\\n'
    ```
    <!-- output -->
    ```text
    200
    ```

`bash` examples run with `set -eo pipefail`, `python` ones with this test's interpreter, in a
folder of their page's own that holds the checkout's `examples/` (the example repository built,
the one served) and `scripts/` (so `@examples/requests/minilm.json` is found, and what an example
writes stays there): a page's examples run in order there, each finding what the ones before it
wrote. The server's ports replace the ones the docs name (8000 HTTP, 8001 gRPC, 8002 metrics,
8500 TF Serving gRPC, 8081 TorchServe management; 8080, a second server of the repository in
`--sagemaker` mode, as a SageMaker container). An output is compared with runs of white space
made one, and `...` standing for any text (a float's last digits, an id).

A page that shows how to start a server marks that block `<!-- serve -->` (one `inferd serve`
command): the test starts it as written, in the page's folder, on ports of its own that stand for
8000, 8001 and 8002 in the page's later examples, and stops it at the page's next `serve` or the
end of the run. A page's examples therefore run in order. A block that shows a file the reader
writes (a model.py, a config.pbtxt) is marked `<!-- file models/counter/1/model.py -->`: the test
writes it there, in the page's folder.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from inferd.testing.server import ServerProcess, run_server
from inferd.tools.ports import free_ports
from tests.e2e.conftest import PIPELINE_MODELS, REPO_ROOT

pytestmark = pytest.mark.e2e

RUN, OUTPUT, SERVE = "<!-- run -->", "<!-- output -->", "<!-- serve -->"
# A python example that needs another ecosystem's client runs in that client's own venv, which
# `make test` installs: `<!-- run with .venv-tfserving -->` (TF Serving's client, with tensorflow).
RUN_IN_VENV = re.compile(r"<!-- run with (\.venv[\w-]*) -->")
WRITES_FILE = re.compile(r"<!-- file ([\w.-]+(?:/[\w.-]+)*) -->")
LANGUAGES = ("bash", "python")


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    language: str
    code: str
    output: str | None
    venv: str | None = None  # run by this venv's python (python examples)
    serves: bool = False  # an `inferd serve` command the page's later examples call
    writes: str | None = None  # a file's text, to write at this path of the page's folder

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def collect(path: Path) -> list[Example]:
    """The examples `path` marks runnable, each with the output it shows (None: none shown)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = path.relative_to(REPO_ROOT).as_posix()
    examples = []
    for index in _markers(lines):
        in_venv = RUN_IN_VENV.fullmatch(lines[index].strip())
        serves = lines[index].strip() == SERVE
        writes = WRITES_FILE.fullmatch(lines[index].strip())
        start, language, code, end = _fence_after(lines, index, page)
        if writes:
            if ".." in writes.group(1).split("/"):
                raise ValueError(f"{page}:{start + 1}: a file is written inside the page's folder")
            examples.append(Example(page, start + 1, language, code + "\n", None, writes=writes.group(1)))
            continue
        if language not in (("bash",) if serves else LANGUAGES):
            raise ValueError(f"{page}:{start + 1}: a runnable example is {LANGUAGES}, not {language!r}")
        output = None
        after = _next_text(lines, end + 1)
        if after < len(lines) and lines[after].strip() == OUTPUT:
            _, _, output, _ = _fence_after(lines, after, page)
        examples.append(Example(page, start + 1, language, code, output, in_venv.group(1) if in_venv else None, serves))
    return examples


def _markers(lines: list[str]) -> list[int]:
    """The lines that mark an example runnable, outside fenced blocks (a page may show the
    markers themselves, inside a longer fence)."""
    found, fence = [], ""
    for index, line in enumerate(lines):
        text = line.strip()
        ticks = len(text) - len(text.lstrip("`"))
        if fence:
            if ticks >= len(fence) and not text.strip("`"):
                fence = ""
        elif ticks >= 3:
            fence = "`" * ticks
        elif text in (RUN, SERVE) or RUN_IN_VENV.fullmatch(text) or WRITES_FILE.fullmatch(text):
            found.append(index)
    return found


def _next_text(lines: list[str], index: int) -> int:
    while index < len(lines) and not lines[index].strip():
        index += 1
    return index


def _fence_after(lines: list[str], marker: int, page: str) -> tuple[int, str, str, int]:
    """The fence that follows the marker line (indented as the marker is, in a list item): its
    first line, language, text (the indentation removed) and closing line."""
    start = _next_text(lines, marker + 1)
    if start >= len(lines) or not lines[start].lstrip().startswith("```"):
        raise ValueError(f"{page}:{marker + 1}: {lines[marker].strip()} is not followed by a fenced block")
    indent = len(lines[start]) - len(lines[start].lstrip())
    language = lines[start].strip()[3:].strip().split(" ")[0]
    for end in range(start + 1, len(lines)):
        if lines[end].strip().startswith("```"):
            return start, language, "\n".join(line[indent:] for line in lines[start + 1 : end]), end
    raise ValueError(f"{page}:{start + 1}: the fence is never closed")


EXAMPLES = [example for path in pages() for example in collect(path)]


def matches(expected: str, printed: str) -> bool:
    """`printed` is `expected`, white space aside, `...` standing for any text."""

    def squeezed(text: str) -> str:
        return " ".join(text.split())

    # White space beside a `...` is part of what it stands for (it may be none).
    pattern = ".*?".join(re.escape(part.strip()) for part in squeezed(expected).split("..."))
    return re.fullmatch(pattern, squeezed(printed), re.DOTALL) is not None


@dataclass(frozen=True)
class DocsServer:
    server: ServerProcess
    ports: dict[int, int]  # the port the docs name: this server's
    repository: Path  # the example repository it serves

    def own_ports(self, text: str, started: dict[int, int]) -> str:
        """`text` with the ports the docs name replaced by this server's (an address it prints too),
        or by those of a server the page `started` itself."""
        for named, actual in (self.ports | started).items():
            text = re.sub(rf"(localhost|127\.0\.0\.1):{named}\b", f"127.0.0.1:{actual}", text)
        return text


@pytest.fixture(scope="module")
def docs_server(pipeline_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsServer]:
    """The example repository, as `make serve` serves it, with TF Serving's gRPC port and
    TorchServe's management port on. Its MiniLM and pipeline come from the session's one export."""
    root = tmp_path_factory.mktemp("docs-examples") / "model_repository"
    root.mkdir()
    for name in PIPELINE_MODELS:
        shutil.copytree(pipeline_repository / name, root / name, copy_function=os.link)
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "build_example_repository.py"), "--output", str(root),
         "--requests-output", str(root.parent / "requests")],
        check=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    tfserving_grpc, management = free_ports(2)
    extra = ("--tfserving-grpc-port", str(tfserving_grpc), "--torchserve-management-port", str(management))
    with (
        run_server(root, root.parent / "server.log", *extra) as server,
        # The SageMaker page's examples call a container's port, 8080: the same repository so.
        run_server(root, root.parent / "sagemaker.log", "--sagemaker") as sagemaker,
    ):
        yield DocsServer(
            server,
            {8000: server.http_port, 8001: server.grpc_port, 8002: server.metrics_port, 8500: tfserving_grpc,
             8081: management, 8080: sagemaker.http_port},
            root,
        )  # fmt: skip


def test_the_docs_mark_examples_to_run() -> None:
    # The pages users start from are proven: a marker lost in an edit shows here.
    marked = {example.page for example in EXAMPLES}
    assert {
        "README.md", "docs/get-started.md", "docs/serve/repository.md", "docs/call/kserve.md", "docs/call/openai.md",
        "docs/call/sagemaker.md", "docs/deploy/index.md",
    } <= marked, marked  # fmt: skip


class PageFolders:
    """Each page's folder, made at its first example: a checkout's root as a user has it after
    `make serve`, its `scripts/` and `examples/` (the example repository built: the one served)."""

    def __init__(self, root: Path, repository: Path) -> None:
        self._root = root
        self._repository = repository
        self._made: dict[str, Path] = {}

    def of(self, page: str) -> Path:
        if page not in self._made:
            folder = self._root / page.replace("/", "-")
            (folder / "examples").mkdir(parents=True)
            (folder / "scripts").symlink_to(REPO_ROOT / "scripts")
            for example in (REPO_ROOT / "examples").iterdir():
                if example.name != "model_repository":  # built by `make example`, not in a checkout
                    (folder / "examples" / example.name).symlink_to(example)
            (folder / "examples" / "model_repository").symlink_to(self._repository)
            self._made[page] = folder
        return self._made[page]


class PageServers:
    """The servers pages start themselves (`<!-- serve -->`): at most one a page at a time."""

    # The runner chooses the ports; the rest of the command is the page's.
    PORT_OPTIONS = ("--http-port", "--grpc-port", "--metrics-port")

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._running: dict[str, tuple[ExitStack, dict[int, int]]] = {}

    def start(self, example: Example, folder: Path) -> None:
        self.stop(example.page)
        words = shlex.split(example.code.replace("\\\n", " "), comments=True)
        if words[:2] != ["inferd", "serve"] or "&" in words or ";" in words:
            raise ValueError(f"{example}: a `serve` block is one `inferd serve` command")
        if any(word.split("=")[0] in self.PORT_OPTIONS for word in words):
            raise ValueError(f"{example}: the test chooses the ports; the page's are 8000, 8001, 8002")
        if "--tls-client-ca" in words:
            raise ValueError(f"{example}: the readiness probe presents no client certificate")
        # The probe only asks whether it is up; the page's own examples check the certificate.
        probe = None
        if "--tls-cert" in words:
            probe = ssl.create_default_context()
            probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
        repository: str | None = None
        others = words[2:]
        if "--model-repository" in words:  # else the page names its models otherwise (--model-config-file)
            index = words.index("--model-repository")
            repository, others = words[index + 1], words[2:index] + words[index + 2 :]
        stack = ExitStack()
        log = self._logs / f"{example.page.replace('/', '-')}-{example.line}.log"
        try:
            server = stack.enter_context(run_server(repository, log, *others, tls=probe, cwd=folder))
        except (RuntimeError, TimeoutError) as error:
            raise AssertionError(f"{example}: {error}\n{log.read_text(errors='replace')}") from error
        ports = {8000: server.http_port, 8001: server.grpc_port, 8002: server.metrics_port}
        self._running[example.page] = (stack, ports)

    def ports(self, page: str) -> dict[int, int]:
        return self._running[page][1] if page in self._running else {}

    def stop(self, page: str) -> None:
        if page in self._running:
            self._running.pop(page)[0].close()

    def stop_all(self) -> None:
        for page in list(self._running):
            self.stop(page)


@pytest.fixture(scope="module")
def page_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageServers]:
    servers = PageServers(tmp_path_factory.mktemp("page-servers"))
    yield servers
    servers.stop_all()


@pytest.fixture(scope="module")
def page_folders(docs_server: DocsServer, tmp_path_factory: pytest.TempPathFactory) -> PageFolders:
    return PageFolders(tmp_path_factory.mktemp("pages"), docs_server.repository)


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_a_runnable_example_runs_and_prints_what_the_page_shows(
    example: Example,
    docs_server: DocsServer,
    page_folders: PageFolders,
    page_servers: PageServers,
    tmp_path: Path,
) -> None:
    if example.writes:
        path = page_folders.of(example.page) / example.writes
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(example.code, encoding="utf-8")
        return
    if example.serves:
        page_servers.start(example, page_folders.of(example.page))
        return
    started = page_servers.ports(example.page)
    code, output = docs_server.own_ports(example.code, started), example.output
    if example.language == "bash":
        command = ["bash", "-c", "set -eo pipefail\n" + code]
    else:
        python = REPO_ROOT / example.venv / "bin" / "python" if example.venv else Path(sys.executable)
        assert python.is_file(), f"{example} runs in {example.venv}: `make test` installs it"
        command = [str(python), "-c", code]
    # `inferd` from this environment; nothing of the machine's own client settings (HOME), so an
    # example that works here works on a machine that never configured a client.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # No AWS settings of the machine either: boto3's examples pass dummy keys, as the page says to.
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    environment |= {"PATH": path, "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"}
    run = subprocess.run(
        command,
        cwd=page_folders.of(example.page),
        env=environment,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, f"{example} failed:\n{run.stdout}\n{run.stderr}"
    if output is not None:
        shown = f"{example} printed:\n{run.stdout}\nthe page shows:\n{output}"
        assert matches(docs_server.own_ports(output, started), run.stdout), shown

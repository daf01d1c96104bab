"""ONNX Runtime's optimized models, kept on disk so that a model's next session skips graph
optimization and maps its weights from a file instead of reading them into memory.

A session made from a model's own file parses it, copies every weight into the heap and optimizes
the graph: MiniLM (90 MB) takes 110-160 ms in the server. Made from the graph that session saved
(`optimized_model_filepath`), with the weights in a file of their own beside it
(`session.optimized_model_external_initializers_file_name`) and optimization off, it takes 25-40 ms:
ONNX Runtime maps the weights file (private, copy on write) instead of copying it, and has no graph
to optimize. Saving the graph with its weights inline saves only the optimization (~4 ms of 70).

An entry is named by what made it: the contents of the model's files (SHA-256), the engine (ONNX
Runtime's version and build) and the machine, because a graph optimized at ORT_ENABLE_ALL holds
kernels laid out for this CPU's instruction set (NCHWc blocks of 8 or 16), which ONNX Runtime says
to load only where they were made. A file's digest is remembered under its identity (device, inode,
size, modification and change times), so an unchanged local file is read once per machine, not
once per load; a file changed within the last seconds is read again each time (its times may not
have moved yet). This trusts the file system to move a file's change time when its contents change,
as local file systems do (some FUSE mounts of object stores do not: turn the cache off there).

Entries are written by the load that missed, into a hidden folder renamed into place: a reader
never sees half an entry, and servers sharing the folder that miss at once each write their own and
keep the first. A file of the model changed while its entry was written (a repository updated in
place) makes the entry be dropped, not kept under the old contents' name. An entry is never changed;
eviction (least recently used, past the size) removes it whole, which a session that mapped its
weights survives (the kernel keeps a removed file's pages while they are mapped). Only names the
cache makes are ever removed (64 hex digits, its hidden writing folders), so a folder shared with
other files loses none of them. Files are not synced before the rename: after a power cut an entry
may be cut short, which ONNX Runtime's checks of the graph and of the weights' offsets refuse, and
the entry is then written again. The folder must be the server's own and not writable by others:
whoever can write an entry chooses the graph a model runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import re
import shutil
import stat
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from inferd.runtimes.base import cpu_description

logger = logging.getLogger("inferd.onnx_cache")

# Bumped when an entry's layout changes, so old entries are simply never found.
LAYOUT = "1"
GRAPH_FILE = "model.onnx"
WEIGHTS_FILE = "weights.bin"
# A model whose files are smaller loads in a few milliseconds; an entry would save nothing.
MIN_MODEL_BYTES = 1 << 20
# Initializers of this size or more go to the weights file (ONNX Runtime's own default).
MIN_EXTERNAL_INITIALIZER_BYTES = 1024
# A file modified more recently than this is hashed again at each load (see the docstring).
RECENT_CHANGE_S = 2.0
# Remembered digests kept on disk; the oldest half goes past this (fetched copies of remote
# models are new files at every fetch, each remembered once).
MAX_REMEMBERED_DIGESTS = 4096
# A hidden folder left by a writer that died is removed once it is this old.
ABANDONED_WRITE_S = 3600.0
_DIGESTS = "digests"
_WRITING_PREFIX = ".writing-"
# The names the cache makes, and the only ones it ever removes.
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")
_WRITING_NAME = re.compile(re.escape(_WRITING_PREFIX) + r"[0-9a-f]{32}")

# What tells a file changed: device, inode, size, modification and change times.
Identity = tuple[int, int, int, int, int]


def _identity(info: os.stat_result) -> Identity:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One model's place in the cache: `folder` holds GRAPH_FILE and WEIGHTS_FILE once written;
    `sources` are the model's files as they were hashed."""

    folder: Path
    sources: tuple[tuple[Path, Identity], ...] = field(default=(), compare=False)

    @property
    def graph(self) -> Path:
        return self.folder / GRAPH_FILE

    def is_written(self) -> bool:
        return self.graph.is_file()

    def sources_unchanged(self) -> bool:
        """Whether the model's files are still those hashed into the entry's name."""
        try:
            return all(_identity(path.stat()) == identity for path, identity in self.sources)
        except OSError:
            return False


class OptimizedModelCache:
    """A folder of optimized ONNX models, at most `max_bytes` on disk. Made by `open_cache`."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self._digests: dict[tuple[object, ...], str] = {}
        self._lock = threading.Lock()  # eviction: instances of one load commit at once

    def entry_for(self, model_file: Path, engine: str) -> CacheEntry | None:
        """Where the optimized form of `model_file` (with every file of its folder: external
        weights live there) made by `engine` (its version and the session options that shape the
        graph) is or will be; None when it is not worth an entry (under MIN_MODEL_BYTES) or
        would not fit the cache alone."""
        version_dir = model_file.parent
        files = _regular_files(version_dir)
        total = sum(size for _, _, size in files)
        if total < MIN_MODEL_BYTES or total > self.max_bytes:
            return None
        key = hashlib.sha256()
        for part in (LAYOUT, engine, machine_fingerprint(), model_file.name):
            key.update(part.encode() + b"\0")
        sources = []
        for relative, path, _ in files:
            identity, digest = self._digest(path)
            key.update(f"{relative}\0{identity[2]}\0{digest}\0".encode())
            sources.append((path, identity))
        return CacheEntry(self.folder / key.hexdigest(), tuple(sources))

    def writing_folder(self) -> Path:
        """A new hidden folder for one entry's files, to be given to `commit` or `abandon`."""
        folder = self.folder / f"{_WRITING_PREFIX}{uuid.uuid4().hex}"
        folder.mkdir(mode=0o700)
        return folder

    def commit(self, written: Path, entry: CacheEntry) -> bool:
        """Move a written folder into place, then evict past the size. False, and the folder
        dropped, when the model's files changed while it was written, or another writer was first."""
        if not entry.sources_unchanged():
            self.abandon(written)
            return False
        for _ in range(2):
            try:
                written.rename(entry.folder)
                break
            except OSError:
                if entry.is_written():  # an instance or a server beside this one wrote it first
                    self.abandon(written)
                    return False
                # Half an entry (a removal cut short): it would block every later write.
                shutil.rmtree(entry.folder, ignore_errors=True)
        else:
            self.abandon(written)
            return False
        if _folder_bytes(entry.folder) > self.max_bytes:  # larger optimized than its model: no room
            self.discard(entry)
            return False
        self.evict()
        return True

    def abandon(self, written: Path) -> None:
        shutil.rmtree(written, ignore_errors=True)

    def used(self, entry: CacheEntry) -> None:
        """Mark an entry as just used (its folder's modification time orders eviction)."""
        with contextlib.suppress(OSError):  # evicted meanwhile by a server beside this one: no matter
            os.utime(entry.folder)

    def discard(self, entry: CacheEntry) -> None:
        """Remove an entry, so the next load writes it again."""
        shutil.rmtree(entry.folder, ignore_errors=True)

    def discard_if_same(self, entry: CacheEntry, failed: os.stat_result) -> None:
        """Remove an entry whose graph `failed` to load, unless a writer beside this one has
        replaced it meanwhile (its graph is then another file)."""
        try:
            current = entry.graph.stat()
        except OSError:
            return
        if (current.st_dev, current.st_ino) == (failed.st_dev, failed.st_ino):
            self.discard(entry)

    def evict(self) -> None:
        """Remove the least recently used entries until the rest fit `max_bytes`, and what
        writers that died left behind."""
        try:
            self._evict()
        except OSError as exc:  # the folder removed meanwhile: nothing to keep within the size
            logger.warning("optimized-model cache: eviction failed: %s", exc)

    def _evict(self) -> None:
        with self._lock:
            entries: list[tuple[float, int, Path]] = []
            now = time.time()
            for child in self.folder.iterdir():
                try:
                    modified = child.stat().st_mtime
                except OSError:
                    continue
                if _WRITING_NAME.fullmatch(child.name):
                    if now - modified > ABANDONED_WRITE_S:
                        shutil.rmtree(child, ignore_errors=True)
                elif _ENTRY_NAME.fullmatch(child.name) and child.is_dir():
                    entries.append((modified, _folder_bytes(child), child))
            total = sum(size for _, size, _ in entries)
            for _, size, folder in sorted(entries):
                if total <= self.max_bytes:
                    break
                shutil.rmtree(folder, ignore_errors=True)
                total -= size
                logger.info("optimized-model cache: evicted %s (%d MiB)", folder.name[:12], size >> 20)

    def _digest(self, path: Path) -> tuple[Identity, str]:
        """A file's identity and the SHA-256 of its contents, remembered under the identity."""
        with path.open("rb") as file:
            info = os.fstat(file.fileno())  # the file read, not whatever the path names later
            identity = _identity(info)
            settled = time.time() - max(info.st_mtime, info.st_ctime) > RECENT_CHANGE_S
            if settled and identity in self._digests:
                return identity, self._digests[identity]
            remembered = self.folder / _DIGESTS / hashlib.sha256(repr(identity).encode()).hexdigest()
            if settled:
                try:
                    digest = remembered.read_text().strip()
                except OSError:
                    digest = ""
                if _ENTRY_NAME.fullmatch(digest):
                    self._digests[identity] = digest
                    return identity, digest
            digest = hashlib.file_digest(file, "sha256").hexdigest()
        if settled:
            self._digests[identity] = digest
            _remember(remembered, digest)
        return identity, digest


def open_cache(folder: Path, max_bytes: int) -> OptimizedModelCache | None:
    """The cache in `folder` (made if missing, private to this user), or None, said in the log,
    when it is off (`max_bytes` 0) or unusable: not writable, or writable by others."""
    if max_bytes <= 0:
        return None
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        (folder / _DIGESTS).mkdir(mode=0o700, exist_ok=True)
        info = folder.stat()
    except OSError as exc:
        logger.warning("optimized-model cache off: cannot make %s (%s)", folder, exc.strerror or exc)
        return None
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        logger.warning(
            "optimized-model cache off: %s is not this user's alone (owner uid %d, mode %o), and whoever "
            "may write there chooses the graphs models run",
            folder,
            info.st_uid,
            stat.S_IMODE(info.st_mode),
        )
        return None
    if not os.access(folder, os.W_OK | os.X_OK):
        logger.warning("optimized-model cache off: %s is not writable", folder)
        return None
    return OptimizedModelCache(folder, max_bytes)


def default_folder() -> Path:
    """Where the cache lives unless told: the user's cache folder (XDG_CACHE_HOME, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferd" / "onnx"


_fingerprint: str | None = None


def machine_fingerprint() -> str:
    """The architecture and what names the CPU's instruction set: its flags (x86, arm64, s390x),
    else its model lines (Linux); elsewhere the platform's own description."""
    global _fingerprint
    if _fingerprint is None:
        kind, names = cpu_description()
        described = " ".join(names) if kind else platform.platform()
        _fingerprint = f"{platform.machine()} {hashlib.sha256(described.encode()).hexdigest()[:16]}"
    return _fingerprint


def _regular_files(folder: Path) -> list[tuple[str, Path, int]]:
    """(path relative to `folder`, path, size) of the regular files under it, sorted. Links to
    files count as their targets; anything else (a device, a FIFO) is never read."""
    found: list[tuple[str, Path, int]] = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            try:
                info = path.stat()
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((path.relative_to(folder).as_posix(), path, info.st_size))
    return sorted(found)


def _folder_bytes(folder: Path) -> int:
    total = 0
    for child in folder.iterdir():
        with contextlib.suppress(OSError):  # removed meanwhile
            total += child.stat().st_size
    return total


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile
        return 0.0


def _remember(path: Path, digest: str) -> None:
    folder = path.parent
    try:
        temporary = folder / f"{_WRITING_PREFIX}{uuid.uuid4().hex}"
        temporary.write_text(digest)  # a name a reader never takes for a digest's
        temporary.rename(path)
        remembered = [p for p in folder.iterdir() if _ENTRY_NAME.fullmatch(p.name)]
        if len(remembered) > MAX_REMEMBERED_DIGESTS:
            by_age = sorted(remembered, key=_modified)
            for old in by_age[: len(by_age) // 2]:
                old.unlink(missing_ok=True)
    except OSError as exc:  # a full disk costs the next load a hash, nothing more
        logger.debug("optimized-model cache: digest not remembered: %s", exc)

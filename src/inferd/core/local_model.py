"""`read_local_model()`: a model of the repository (or files sent with a load) brought to a local
folder, its config read and completed by the server's settings, the versions its policy selects
and each one's memory estimate: everything a load needs before it creates anything.

Blocking (the repository may fetch from remote storage): run it on a worker thread. A config that
cannot be read, or a path it names that leaves the model's folder, raises the InferdError that
says why, named relative to the model's folder; a folder made here for sent files is removed then.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from inferd.config.batching import BatchingDefaults
from inferd.config.loader import read_model_config
from inferd.config.model import ModelConfig
from inferd.core.model_files import check_config_paths, check_override
from inferd.core.repository import ModelFingerprint, ModelRepository
from inferd.errors import InferdError, ModelLoadError, relative_to_model_folder
from inferd.runtimes import estimate_memory_bytes, needs_files

logger = logging.getLogger("inferd.registry")


@dataclass(frozen=True, slots=True)
class LocalModel:
    """A model's files as a load sees them: its folder, its config and what to load of it."""

    model_dir: Path
    config: ModelConfig
    versions: list[int]
    fingerprint: ModelFingerprint | None
    owned_dir: Path | None = None
    # The config a load request gave in place of config.pbtxt (None: the folder's own was read).
    override: ModelConfig | None = None
    # Seconds spent bringing the files to `model_dir` (a remote repository's fetch).
    fetch_s: float = 0.0
    # version -> the runtime's estimate of its resident memory once loaded.
    memory_bytes: Mapping[int, int] = field(default_factory=dict)


def read_local_model(
    repository: ModelRepository,
    name: str,
    config: ModelConfig | None,
    files: Mapping[str, bytes],
    fingerprint: ModelFingerprint | None,
    *,
    code_may_change: bool = True,
    batching_defaults: BatchingDefaults | None = None,
    kept_dir: Path | None = None,
) -> LocalModel:
    """`config` replaces the folder's config.pbtxt; `files` (relative path -> bytes) replace the
    repository's folder; `code_may_change`: False refuses a `config` that changes what code runs;
    `batching_defaults`: what every batching model takes (--tfserving-batching-parameters);
    `kept_dir`: the folder inferd made for files an earlier load was sent, kept while the model
    rested (scaled to zero or evicted), loaded again in place of the repository's."""
    owned_dir = None
    fetch_s = 0.0
    override = config
    if files:
        owned_dir = model_dir = write_model_files(name, files)
    elif kept_dir is not None:
        owned_dir = model_dir = kept_dir
    else:
        fetch_started = time.perf_counter()
        model_dir = repository.localize(name, ())  # the config and shared files first
        fetch_s = time.perf_counter() - fetch_started
    overridden = config is not None
    try:
        if config is None:
            config = read_model_config(model_dir)
        config = repository.configured(name, replace(config, name=name))
        if batching_defaults is not None:
            config = batching_defaults.apply(config)
        if config.ignored_fields:
            logger.warning(
                "model %s: config fields not supported and ignored: %s",
                name,
                ", ".join(config.ignored_fields),
                extra={"model": name},
            )
        if fingerprint is not None:
            available = fingerprint.version_numbers
        else:
            numbered = (p.name for p in model_dir.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit())
            available = sorted(int(name) for name in numbered if int(name) > 0)
        if not available and (config.ensemble is not None or not needs_files(config)):
            available = [1]  # an ensemble or a remote model has no files: its empty `1/` may be left out
        selected = config.version_policy.select(available)
        if not selected:
            raise ModelLoadError(
                f"no version of model '{name}' to load: found versions {available}, "
                f"version_policy {config.version_policy.kind.value} selects none"
            )
        if owned_dir is None:
            fetch_started = time.perf_counter()
            model_dir = repository.localize(name, selected)
            fetch_s += time.perf_counter() - fetch_started
            if overridden and not code_may_change:
                check_override(config, model_dir, selected)
        check_config_paths(config, model_dir, selected)
    except BaseException as exc:
        if owned_dir is not None and owned_dir != kept_dir:
            shutil.rmtree(owned_dir, ignore_errors=True)
        if isinstance(exc, InferdError):  # config.pbtxt's errors name its path
            raise relative_to_model_folder(exc, str(model_dir)) from exc
        raise
    memory = {version: estimated_memory_bytes(config, model_dir, version, fingerprint) for version in selected}
    return LocalModel(model_dir, config, selected, fingerprint, owned_dir, override, fetch_s, memory)


def estimated_memory_bytes(
    config: ModelConfig, model_dir: Path, version: int, fingerprint: ModelFingerprint | None
) -> int:
    """The runtime's estimate of the version's resident memory, from its files' sizes."""
    if config.ensemble is not None:
        return 0  # its steps' models hold the memory, and count it themselves
    listed = fingerprint.version(version) if fingerprint is not None else None
    if listed is not None:
        model_bytes = sum(size for _, size, _ in listed)
    else:
        model_bytes = sum(p.stat().st_size for p in (model_dir / str(version)).rglob("*") if p.is_file())
    return estimate_memory_bytes(config, model_dir / str(version), model_bytes)


def write_model_files(name: str, files: Mapping[str, bytes]) -> Path:
    """A fresh folder holding `files` (relative path -> bytes) for model `name`; paths that would
    leave it are refused."""
    root = Path(tempfile.mkdtemp(prefix=f"inferd-{name}-"))
    try:
        for relative, content in files.items():
            path = (root / relative).resolve()
            if not path.is_relative_to(root.resolve()) or relative.startswith("/") or ".." in Path(relative).parts:
                raise ModelLoadError(f"model '{name}': file path '{relative}' leaves the model's folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root

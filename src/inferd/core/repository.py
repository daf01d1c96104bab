"""Model repositories on storage, in Triton's layout: `<root>/<model>/config.pbtxt` and
`<root>/<model>/<version>/<model file>`, version folders named by positive integers.

`ModelRepository` is what the registry needs of any storage: list the models, fingerprint one
(so that polling sees what changed without reading model files), localize a model's config and
chosen versions to a local folder a runtime can open, and release that folder on unload.

* `LocalRepository`: a folder; it localizes to itself.
* `FsspecRepository`: any fsspec URL (`s3://bucket/prefix` with the standard AWS credential chain
  and `AWS_ENDPOINT_URL`, `gs://`, `memory://`, ...). Files are fetched into a local cache folder,
  each once: a cached file whose size and tag (ETag, or modification time) match the listing is
  not fetched again. A model's cache is removed when it is released.
* `Repositories`: several at once (repeated `--model-repository`, as Triton allows); a model name
  found in two of them is refused rather than guessed.

Names come from clients (a load request) and from listings, so every name is checked to be one
plain folder name before it touches a path (no separators, no `..`, nothing hidden), files of a
listing must stay inside their model's folder, and a local model folder that is a link pointing
outside the root is not served.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from inferd.config.model import ModelConfig
from inferd.config.parameters import VERSION_LABELS
from inferd.config.served_models import ServedModel
from inferd.errors import (
    InferdError,
    InvalidRequestError,
    ModelConfigError,
    ModelLoadError,
    ModelNotFoundError,
    TooManyModelsError,
)

CONFIG_FILE = "config.pbtxt"
# (path relative to the model folder, size, tag): the tag is an ETag or a modification time.
FileEntry = tuple[str, int, str]


class RepositoryError(InferdError):
    """A repository itself is unusable (missing, not a folder, unreachable)."""


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What a model's files look like now, from a listing alone: sizes and tags, no contents."""

    # Files outside version folders: config.pbtxt, warmup/ data, labels.
    shared: tuple[FileEntry, ...]
    # version -> the files in its folder.
    versions: tuple[tuple[int, tuple[FileEntry, ...]], ...]

    def version(self, version: int) -> tuple[FileEntry, ...] | None:
        return dict(self.versions).get(version)

    @property
    def version_numbers(self) -> list[int]:
        return [version for version, _ in self.versions]


# The longest file name Linux and macOS file systems take (NAME_MAX), in bytes of UTF-8.
MAX_NAME_BYTES = 255
PLAIN_NAME_RULE = (
    f"one folder name: not empty, at most {MAX_NAME_BYTES} bytes of UTF-8, without '/', '\\' or control "
    "characters, not starting with '.'"
)


def is_plain_name(name: str) -> bool:
    """A single folder name (PLAIN_NAME_RULE): no separator, not `.`/`..`, not hidden, nothing a file
    system refuses (NUL, a name too long) or a log line would be split by (a newline)."""
    return (
        bool(name)
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)
        and len(name.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES
    )


def _not_in_repository(name: str, location: str) -> ModelNotFoundError:
    """Where the repository is stays in the server's log: clients are not told the server's paths."""
    message = f"model '{name}' is not in the model repository"
    return ModelNotFoundError(message, server_message=f"{message} {location}")


def fingerprint_of(files: Iterable[FileEntry]) -> ModelFingerprint:
    """Files of one model folder (relative paths) sorted into shared ones and version folders."""
    shared: list[FileEntry] = []
    versions: dict[int, list[FileEntry]] = {}
    for entry in files:
        top = PurePosixPath(entry[0]).parts[0]
        if top.isascii() and top.isdigit() and int(top) > 0 and len(PurePosixPath(entry[0]).parts) > 1:
            versions.setdefault(int(top), []).append(entry)
        else:
            shared.append(entry)
    return ModelFingerprint(
        shared=tuple(sorted(shared)), versions=tuple((v, tuple(sorted(versions[v]))) for v in sorted(versions))
    )


class ModelRepository(Protocol):
    def describe(self) -> str:
        """Where it is, for messages."""
        ...

    def check(self) -> None:
        """RepositoryError when the repository itself cannot be used."""
        ...

    def model_names(self) -> list[str]: ...

    def has_model(self, name: str) -> bool: ...

    def fingerprint(self, name: str) -> ModelFingerprint:
        """ModelNotFoundError for a name that is not one of the repository's models."""
        ...

    def localize(self, name: str, versions: Iterable[int]) -> Path:
        """A local folder holding the model's shared files and the given versions' folders."""
        ...

    def release(self, name: str) -> None:
        """The model is unloaded: drop what localize fetched for it."""
        ...

    def configured(self, name: str, config: ModelConfig) -> ModelConfig:
        """The model's config as this repository serves it (TF Serving's model config sets the
        versions and labels of its models; other repositories serve the config as it is)."""
        ...


@dataclass(frozen=True, slots=True)
class LocalRepository:
    root: Path

    def describe(self) -> str:
        return str(self.root)

    def check(self) -> None:
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.root} is not a folder")

    def model_names(self) -> list[str]:
        """Every model folder directly under the root, hidden ones excepted, sorted."""
        return sorted(p.name for p in self.root.iterdir() if is_plain_name(p.name) and self._is_model_dir(p))

    def has_model(self, name: str) -> bool:
        return is_plain_name(name) and self._is_model_dir(self.root / name)

    def fingerprint(self, name: str) -> ModelFingerprint:
        model_dir = self._model_dir(name)
        files = []
        for folder, _, filenames in os.walk(model_dir):
            for filename in filenames:
                path = Path(folder) / filename
                stat = path.stat()
                files.append((path.relative_to(model_dir).as_posix(), stat.st_size, str(stat.st_mtime_ns)))
        return fingerprint_of(files)

    def localize(self, name: str, versions: Iterable[int]) -> Path:
        return self._model_dir(name)

    def release(self, name: str) -> None:
        return None

    def configured(self, name: str, config: ModelConfig) -> ModelConfig:
        return config

    def _model_dir(self, name: str) -> Path:
        if not self.has_model(name):
            raise _not_in_repository(name, self.describe())
        return self.root / name

    def _is_model_dir(self, path: Path) -> bool:
        if not path.is_dir():
            return False
        # A link may point anywhere: serve it only when it stays inside the repository.
        return not path.is_symlink() or path.resolve().is_relative_to(self.root.resolve())


class FsspecRepository:
    """A repository at an fsspec URL, fetched into `cache_dir/<model>/`."""

    def __init__(self, url: str, cache_dir: Path) -> None:
        import fsspec

        self._url = url
        self._fs, root = fsspec.core.url_to_fs(url)
        self._root = root.rstrip("/")
        self._cache_dir = cache_dir

    def describe(self) -> str:
        return self._url

    def check(self) -> None:
        try:
            if not self._fs.isdir(self._root):
                raise RepositoryError(f"model repository {self._url} is not a folder (or not readable)")
        except (OSError, ValueError) as exc:
            raise RepositoryError(f"model repository {self._url} cannot be read: {exc}") from exc

    def model_names(self) -> list[str]:
        self._fs.invalidate_cache()  # listings are cached by some filesystems (s3fs): polling wants news
        names = []
        for info in self._fs.ls(self._root, detail=True):
            name = PurePosixPath(info["name"]).name
            if info.get("type") == "directory" and is_plain_name(name):
                names.append(name)
        return sorted(names)

    def has_model(self, name: str) -> bool:
        return is_plain_name(name) and name in self.model_names()

    def fingerprint(self, name: str) -> ModelFingerprint:
        return fingerprint_of(entry for entry, _ in self._listing(name))

    def localize(self, name: str, versions: Iterable[int]) -> Path:
        wanted = set(versions)
        target = self._cache_dir / name
        manifest_path = target / ".inferd-manifest.json"
        manifest: dict[str, list[Any]] = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        for (relative, size, tag), remote in self._listing(name):
            top = PurePosixPath(relative).parts[0]
            if top.isascii() and top.isdigit() and len(PurePosixPath(relative).parts) > 1 and int(top) not in wanted:
                continue
            local = target / relative
            if manifest.get(relative) == [size, tag] and local.is_file() and local.stat().st_size == size:
                continue  # fetched before, unchanged since
            local.parent.mkdir(parents=True, exist_ok=True)
            partial = local.with_name(local.name + ".partial")
            self._fs.get_file(remote, str(partial))
            partial.replace(local)
            manifest[relative] = [size, tag]
            manifest_path.write_text(json.dumps(manifest))
        target.mkdir(parents=True, exist_ok=True)
        return target

    def release(self, name: str) -> None:
        if is_plain_name(name):
            shutil.rmtree(self._cache_dir / name, ignore_errors=True)

    def configured(self, name: str, config: ModelConfig) -> ModelConfig:
        return config

    def _listing(self, name: str) -> list[tuple[FileEntry, str]]:
        """(relative path, size, tag) and the remote path of every file of the model."""
        if not is_plain_name(name):
            raise _not_in_repository(name, self._url)
        prefix = f"{self._root}/{name}"
        self._fs.invalidate_cache(prefix)
        found = self._fs.find(prefix, detail=True)
        if not found:
            raise _not_in_repository(name, self._url)
        entries = []
        for remote, info in found.items():
            relative = PurePosixPath(remote).relative_to(prefix).as_posix()
            if ".." in PurePosixPath(relative).parts or relative.startswith("/"):
                raise ModelLoadError(f"model '{name}': the listing names a file outside it: {remote}")
            tag = info.get("ETag") or info.get("etag") or str(info.get("mtime") or info.get("LastModified") or "")
            entries.append(((relative, int(info.get("size") or 0), str(tag)), remote))
        return entries


class LinkedModels:
    """Model folders added while serving, each under a name of its own: SageMaker's multi-model
    endpoints load a folder the platform chose, under the name it gives. A repository of links,
    at most `max_models` of them."""

    def __init__(self, *, max_models: int) -> None:
        self._folders: dict[str, Path] = {}
        self._max_models = max_models

    def link(self, name: str, folder: Path) -> None:
        """Serve `folder` as model `name`: a name that is not plain is the caller's mistake, and a
        link past `max_models` is refused (the caller may unload one and retry)."""
        if not is_plain_name(name):
            shown = name if len(name) <= 80 else f"{name[:80]}..."
            raise InvalidRequestError(f"model name {shown!r} is not {PLAIN_NAME_RULE}")
        if name not in self._folders and len(self._folders) >= self._max_models:
            raise TooManyModelsError(
                f"cannot load model '{name}': {len(self._folders)} models loaded from folders, the most this "
                f"server holds (--sagemaker-max-models {self._max_models}); unload one first"
            )
        self._folders[name] = folder

    def unlink(self, name: str) -> None:
        self._folders.pop(name, None)

    def folder(self, name: str) -> Path | None:
        return self._folders.get(name)

    def describe(self) -> str:
        return "model folders loaded by path"

    def check(self) -> None:
        return None

    def model_names(self) -> list[str]:
        return sorted(self._folders)

    def has_model(self, name: str) -> bool:
        return name in self._folders

    def fingerprint(self, name: str) -> ModelFingerprint:
        folder = self._folder(name)
        return LocalRepository(folder.parent).fingerprint(folder.name)

    def localize(self, name: str, versions: Iterable[int]) -> Path:
        return self._folder(name)

    def release(self, name: str) -> None:
        return None

    def configured(self, name: str, config: ModelConfig) -> ModelConfig:
        return config

    def _folder(self, name: str) -> Path:
        folder = self._folders.get(name)
        if folder is None:
            raise ModelNotFoundError(f"model '{name}' is not loaded from any folder")
        return folder


class Repositories:
    """Several repositories served as one."""

    def __init__(self, sources: Sequence[ModelRepository]) -> None:
        self._sources = list(sources)

    def describe(self) -> str:
        return ", ".join(source.describe() for source in self._sources)

    def check(self) -> None:
        for source in self._sources:
            source.check()

    def model_names(self) -> list[str]:
        return sorted({name for source in self._sources for name in source.model_names()})

    def has_model(self, name: str) -> bool:
        return any(source.has_model(name) for source in self._sources)

    def fingerprint(self, name: str) -> ModelFingerprint:
        return self._source(name).fingerprint(name)

    def localize(self, name: str, versions: Iterable[int]) -> Path:
        return self._source(name).localize(name, versions)

    def release(self, name: str) -> None:
        for source in self._sources:
            source.release(name)

    def configured(self, name: str, config: ModelConfig) -> ModelConfig:
        holding = [source for source in self._sources if source.has_model(name)]
        return holding[0].configured(name, config) if len(holding) == 1 else config

    def _source(self, name: str) -> ModelRepository:
        holding = [source for source in self._sources if source.has_model(name)]
        if not holding:
            raise ModelNotFoundError(
                f"model '{name}' is in none of the model repositories",
                server_message=f"model '{name}' is in none of the model repositories ({self.describe()})",
            )
        if len(holding) > 1:
            unique = "a model name must be unique across them"
            raise ModelLoadError(
                f"model '{name}' is in several model repositories ({len(holding)} of them); {unique}",
                server_message=f"model '{name}' is in several model repositories "
                f"({', '.join(s.describe() for s in holding)}); {unique}",
            )
        return holding[0]


class ServedModels:
    """The models TF Serving's model config names (config.served_models): each under its name,
    from its base path (a local folder or an fsspec URL, whose subfolders are its versions), with
    the config's version policy and labels over the model's own config. `replace` takes a new list
    (the file read again, or a HandleReloadConfigRequest); the registry's poll then follows it."""

    def __init__(self, models: Sequence[ServedModel], cache_dir: Path) -> None:
        self._cache_dir = cache_dir
        self._models: dict[str, tuple[ServedModel, ModelRepository, str]] = {}
        self._localized: dict[str, tuple[ModelRepository, str]] = {}
        self.replace(models)

    def replace(self, models: Sequence[ServedModel]) -> None:
        """Serve these models from now on (checked whole before any is taken)."""
        served: dict[str, tuple[ServedModel, ModelRepository, str]] = {}
        for model in models:
            if not is_plain_name(model.name):
                raise ModelConfigError(f"model name {model.name!r} is not {PLAIN_NAME_RULE}")
            served[model.name] = (model, *self._source(model))
        self._models = served

    def _source(self, model: ServedModel) -> tuple[ModelRepository, str]:
        """The one-model repository a base path is, and its folder's name there. A local path is
        taken as the operator gave it: relative to the server's folder, through any link (a
        version swapped by a link is TF Serving's way too). Each name fetches into a cache of its
        own, so two names on one base path never share (or remove) each other's files."""
        location = model.base_path.rstrip("/")
        if not location:
            raise ModelConfigError(f"model '{model.name}': base_path {model.base_path!r} names no model folder")
        if "://" not in location or location.startswith("file://"):
            path = Path(location.removeprefix("file://")).expanduser().resolve()
            if not is_plain_name(path.name):
                raise ModelConfigError(f"model '{model.name}': base_path {model.base_path!r} names no model folder")
            return LocalRepository(path.parent), path.name
        scheme, _, rest = location.partition("://")
        bucket, _, prefix = rest.partition("/")
        folder = PurePosixPath(prefix).name if prefix else ""
        if not bucket or not is_plain_name(folder):
            raise ModelConfigError(
                f"model '{model.name}': base_path {model.base_path!r} must name a folder inside its bucket "
                f"({scheme}://bucket/models/{model.name})"
            )
        digest = hashlib.sha256(f"{model.name}\0{location}".encode()).hexdigest()[:12]
        try:
            return FsspecRepository(location[: -len(folder) - 1], self._cache_dir / f"served-{digest}"), folder
        except (ValueError, ImportError, OSError) as exc:  # a protocol fsspec does not know, or lacks
            said = f"model '{model.name}': base_path {model.base_path!r} cannot be read: {exc}"
            raise ModelConfigError(said) from None

    def names(self) -> frozenset[str]:
        """The names the config gives (whether or not their base paths hold versions yet)."""
        return frozenset(self._models)

    def new_base_paths(self, models: Sequence[ServedModel]) -> list[str]:
        """The base paths of `models` that none of the models served now has."""
        known = {entry[0].base_path.rstrip("/") for entry in self._models.values()}
        return sorted({m.base_path for m in models if m.base_path.rstrip("/") not in known})

    def describe(self) -> str:
        return "the models of the TF Serving model config"

    def check(self) -> None:
        return None  # a base path without versions yet is waited for, as TF Serving does

    def model_names(self) -> list[str]:
        return sorted(name for name, (_, source, folder) in self._models.items() if source.has_model(folder))

    def has_model(self, name: str) -> bool:
        entry = self._models.get(name)
        return entry is not None and entry[1].has_model(entry[2])

    def fingerprint(self, name: str) -> ModelFingerprint:
        model, source, folder = self._entry(name)
        files = source.fingerprint(folder)
        # The config's say in it, as a file of its own: a changed policy or label reloads the model.
        said = (_SERVED_ENTRY, 0, repr((model.version_policy, model.labels)))
        return ModelFingerprint(shared=tuple(sorted((*files.shared, said))), versions=files.versions)

    def localize(self, name: str, versions: Iterable[int]) -> Path:
        _, source, folder = self._entry(name)
        self._localized[name] = (source, folder)
        return source.localize(folder, versions)

    def release(self, name: str) -> None:
        # What the model was fetched from, though the config may have dropped or moved it since.
        localized = self._localized.pop(name, None)
        if localized is not None:
            localized[0].release(localized[1])

    def configured(self, name: str, config: ModelConfig) -> ModelConfig:
        entry = self._models.get(name)
        if entry is None:  # not one of the config's (a model sent with its load)
            return config
        model = entry[0]
        if model.version_policy is not None:
            config = replace(config, version_policy=model.version_policy)
        if model.labels:
            config = replace(config, parameters={**config.parameters, VERSION_LABELS.name: model.labels_parameter()})
        return config

    def _entry(self, name: str) -> tuple[ServedModel, ModelRepository, str]:
        entry = self._models.get(name)
        if entry is None:
            raise _not_in_repository(name, self.describe())
        return entry


# The name of the model config's entry among a served model's files (never a file's: not plain).
_SERVED_ENTRY = ".model-config-entry"


def open_repositories(
    locations: Sequence[str],
    cache_dir: Path,
    linked: LinkedModels | None = None,
    served: ServedModels | None = None,
) -> ModelRepository:
    """Local folders (a path, or file://) and fsspec URLs, as one repository; with `linked`, the
    folders loaded by path while serving too; with `served`, TF Serving's model config's models."""
    sources: list[ModelRepository] = [linked] if linked is not None else []
    if served is not None:
        sources.append(served)
    for index, location in enumerate(locations):
        if "://" not in location or location.startswith("file://"):
            sources.append(LocalRepository(Path(location.removeprefix("file://"))))
        else:
            # Each URL caches into its own folder, so equal model names in two URLs cannot collide.
            digest = hashlib.sha256(location.encode()).hexdigest()[:12]
            sources.append(FsspecRepository(location, cache_dir / f"{index}-{digest}"))
    return sources[0] if len(sources) == 1 else Repositories(sources)

"""What a model's config may reach on disk, and what a config override sent with a load may change.

A config names files (`default_model_filename`, an output's `label_filename`, a warm-up sample's
`input_data_file`) and a runtime then opens, imports or unpickles them: a Python model's file is
imported, a TorchScript archive unpickled. So every such path must resolve, links followed, inside
the folder it belongs to (the version folder, the model's folder, its `warmup/` folder); an
absolute path or a `..` would otherwise make the server run any file of the host. This holds for
configs of the repository and for overrides alike, whatever the model control mode. The files a
runtime finds by their default names are the repository's layout, the operator's: a link there
(shared weights, as Triton repositories often have) is followed.

An override sent through the repository API may tune a model (batching, instances, parameters) but
not change what code runs: a backend or platform other than the repository's (an ONNX model's
folder turned into a Python model that imports a file beside it), or the URL a remote model calls.
Those need the operator's opt-in, as uploaded files do (`--allow-model-upload`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from inferd.config.loader import read_model_config
from inferd.config.model import ENSEMBLE_PLATFORM, ModelConfig
from inferd.config.parameters import REMOTE_URL
from inferd.core.warmup import WARMUP_FOLDER
from inferd.errors import InferdError, ModelConfigError, PermissionDeniedError
from inferd.runtimes import REMOTE, runtime_kind

UPLOAD_FLAG = "--allow-model-upload (INFERD_ALLOW_MODEL_UPLOAD)"


def confined_path(folder: Path, relative: str, what: str, model: str) -> Path:
    """`folder / relative`, links resolved, when it stays inside `folder`; else a ModelConfigError."""
    path = (folder / relative).resolve()
    if Path(relative).is_absolute() or not path.is_relative_to(folder.resolve()):
        raise ModelConfigError(
            f"model '{model}': {what} '{relative}' is outside the model's folder; a config may name only files "
            "inside it"
        )
    return path


def check_config_paths(config: ModelConfig, model_dir: Path, versions: Iterable[int]) -> None:
    """Every file `config` names stays inside the folder it belongs to (see the module docstring)."""
    if filename := config.default_model_filename:
        for version in versions:
            confined_path(model_dir / str(version), filename, "default_model_filename", config.name)
    for output in config.outputs:
        if output.label_filename:
            confined_path(model_dir, output.label_filename, f"label_filename of output '{output.name}'", config.name)
    for sample in config.warmup:
        for item in sample.inputs.values():
            if item.file_name:
                what = f"input_data_file of model_warmup '{sample.name}'"
                confined_path(model_dir / WARMUP_FOLDER, item.file_name, what, config.name)


def check_override(override: ModelConfig, model_dir: Path, versions: Iterable[int]) -> None:
    """Raise PermissionDeniedError when `override` would change what code the model runs against
    the repository's config in `model_dir` (its backend or platform, or a remote model's URL)."""
    try:
        repository_config: ModelConfig | None = read_model_config(model_dir)
    except InferdError:
        repository_config = None
    for version in versions:
        version_dir = model_dir / str(version)
        wanted = _code_kind(override, version_dir)
        current = _code_kind(repository_config, version_dir) if repository_config is not None else None
        if wanted != current:
            raise PermissionDeniedError(
                f"model '{override.name}': a config override that changes the backend or platform "
                f"({current or 'unknown'} to {wanted or 'unknown'}) makes the server run other code; this server "
                f"does not allow it (start it with {UPLOAD_FLAG} and management tokens)"
            )
        if wanted == REMOTE.backend and repository_config is not None:
            url = override.parameters.get(REMOTE_URL.name, "")
            if url != repository_config.parameters.get(REMOTE_URL.name, ""):
                raise PermissionDeniedError(
                    f"model '{override.name}': a config override that sets a remote model's url makes the server "
                    f"connect where the caller says; this server does not allow it (start it with {UPLOAD_FLAG} "
                    "and management tokens)"
                )


def _code_kind(config: ModelConfig, version_dir: Path) -> str:
    """What runs a version under `config`: an ensemble, a runtime's backend, or "" when unknown."""
    if config.ensemble is not None:
        return ENSEMBLE_PLATFORM
    try:
        return runtime_kind(config, version_dir).backend
    except InferdError:
        return ""

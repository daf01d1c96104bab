"""TF Serving's model config (`--model_config_file`: a `ModelServerConfig` in protobuf's text
format, its `model_config_list`) → `config.served_models.ServedModel`s. Read from a local path or
an fsspec URL; every entry checked as TF Serving checks it (a name, a base path, names unique,
a platform TF Serving knows), with the entry named in the error."""

from __future__ import annotations

import logging
from typing import Any

from inferd.config.model import VersionPolicy, VersionPolicyKind
from inferd.config.served_models import TF_SERVING_PLATFORM, ServedModel
from inferd.errors import ModelConfigError
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.protocol.tfserving_text import read_text_message

logger = logging.getLogger("inferd.tfserving")


def read_model_config_file(location: str) -> list[ServedModel]:
    """The models of the file at `location` (a path, or an fsspec URL such as s3://...)."""
    message = read_text_message(location, serving_pb.ModelServerConfig(), "TF Serving model config (ModelServerConfig)")
    return served_models(message, location)


def served_models(message: Any, where: str) -> list[ServedModel]:
    """A ModelServerConfig message's models (from a file, or a HandleReloadConfigRequest)."""
    if message.WhichOneof("config") == "custom_model_config":
        raise ModelConfigError(f"{where}: custom_model_config is not supported; give a model_config_list")
    models: list[ServedModel] = []
    for index, entry in enumerate(message.model_config_list.config):
        label = f"{where}: config {index + 1}" + (f" ({entry.name!r})" if entry.name else "")
        if not entry.name:
            raise ModelConfigError(f"{label}: 'name' is missing")
        if not entry.base_path:
            raise ModelConfigError(f"{label}: 'base_path' is missing")
        if entry.model_platform not in ("", TF_SERVING_PLATFORM):
            raise ModelConfigError(
                f"{label}: model_platform {entry.model_platform!r} is not one TF Serving serves "
                f"({TF_SERVING_PLATFORM!r}); the files in base_path decide the runtime"
            )
        if any(model.name == entry.name for model in models):
            raise ModelConfigError(f"{label}: the name {entry.name!r} is given twice")
        if entry.HasField("logging_config"):
            logger.warning("%s: logging_config (TF Serving's request logging) is not supported and ignored", label)
        labels = tuple(sorted((name, int(version)) for name, version in entry.version_labels.items()))
        if any(not name or "," in name or ":" in name for name, _ in labels):
            raise ModelConfigError(f"{label}: a version label must be a name without ',' or ':'")
        if any(version < 1 for _, version in labels):
            raise ModelConfigError(f"{label}: version_labels must name positive versions")
        models.append(ServedModel(entry.name, entry.base_path, _policy(entry, label), labels))
    return models


def _policy(entry: Any, label: str) -> VersionPolicy | None:
    if not entry.HasField("model_version_policy"):
        return None
    policy = entry.model_version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy(VersionPolicyKind.ALL)
    if choice == "specific":
        if not policy.specific.versions:
            raise ModelConfigError(f"{label}: model_version_policy specific names no version")
        return VersionPolicy(VersionPolicyKind.SPECIFIC, versions=tuple(sorted(set(policy.specific.versions))))
    latest = policy.latest.num_versions if choice == "latest" else 0
    return VersionPolicy(VersionPolicyKind.LATEST, latest_n=latest or 1)  # TF Serving's default: 1

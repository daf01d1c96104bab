"""The models TF Serving's model config names (`--model-config-file`, or `--model-name` with
`--model-base-path`): each a name, the folder its versions are in, which of them serve, and its
version labels. The file's format is read in `protocol.tfserving_model_config`; the repository
that serves these models is `core.repository.ServedModels`."""

from __future__ import annotations

from dataclasses import dataclass

from inferd.config.model import VersionPolicy

# What TF Serving's model_platform may say: it serves SavedModels only ("tensorflow"). The files
# in a base path decide the runtime, as in a repository (a SavedModel, an ONNX file, ...).
TF_SERVING_PLATFORM = "tensorflow"
# TF Serving's --model_name when only --model_base_path is given.
DEFAULT_MODEL_NAME = "default"


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    base_path: str
    """A local folder or an fsspec URL (s3://bucket/models/resnet) whose subfolders are versions."""
    version_policy: VersionPolicy | None = None
    """None: the model's own (its config.pbtxt's, else the latest version)."""
    labels: tuple[tuple[str, int], ...] = ()
    """(label, version) pairs: TF Serving's version_labels."""

    def labels_parameter(self) -> str:
        """The labels as the version_labels parameter writes them ("stable:1,canary:2")."""
        return ",".join(f"{label}:{version}" for label, version in self.labels)

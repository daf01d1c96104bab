"""Where a version's SavedModel is, without importing TensorFlow: in Triton's layout (a
`model.savedmodel/` folder in the version folder, or the folder `default_model_filename` names) or
TF Serving's (`saved_model.pb` and `variables/` in the version folder itself). Read by the runtime
and by the tools that take a SavedModel (`inferd optimize`)."""

from __future__ import annotations

from pathlib import Path

from inferd.errors import ModelLoadError

DEFAULT_MODEL_FOLDER = "model.savedmodel"
SAVED_MODEL_FILE = "saved_model.pb"
# What is served unless TF_SIGNATURE_DEF and TF_GRAPH_TAG say otherwise (Triton's defaults, TF Serving's).
DEFAULT_SIGNATURE = "serving_default"
DEFAULT_TAG = "serve"


def saved_model_folder(version_dir: Path, model_filename: str = "") -> Path:
    """The folder holding the version's SavedModel; ModelLoadError when there is none."""
    named = version_dir / (model_filename or DEFAULT_MODEL_FOLDER)
    if (named / SAVED_MODEL_FILE).is_file():
        return named
    if not model_filename and (version_dir / SAVED_MODEL_FILE).is_file():
        return version_dir
    raise ModelLoadError(
        f"no SavedModel in {version_dir}/: {named.name}/{SAVED_MODEL_FILE} (Triton's layout) or "
        f"{SAVED_MODEL_FILE} (TF Serving's) is missing"
    )

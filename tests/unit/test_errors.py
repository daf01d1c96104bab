"""The error tree's message helpers: what clients see of a model's server paths, and what the log keeps."""

from __future__ import annotations

from inferd.errors import ModelLoadError, ModelRaisedError, relative_to_model_folder, with_context


def test_paths_in_a_models_folder_are_named_relative_to_it_and_the_log_keeps_them() -> None:
    error = ModelLoadError("model file /srv/models/m/1/model.py not found in /srv/models/m.")
    shown = relative_to_model_folder(error, "/srv/models/m/")
    assert shown.message == "model file 1/model.py not found in the model's folder."
    assert shown.logged == error.message and isinstance(shown, ModelLoadError) and shown.code is error.code
    # A model whose name begins as this one's is another folder: left as it is.
    other = ModelLoadError("see /srv/models/m2/1/model.py and /srv/models/m.d/x")
    assert relative_to_model_folder(other, "/srv/models/m") is other
    # A repository given as a relative path: its folders only where a path begins.
    relative = relative_to_model_folder(ModelLoadError("'m/1/model.py' and /srv/item/1"), "m")
    assert relative.message == "'1/model.py' and /srv/item/1"


def test_context_keeps_the_logs_message_too() -> None:
    shown = relative_to_model_folder(ModelRaisedError("raised in /srv/m/1/a.txt"), "/srv/m")
    located = with_context(shown, "step 0")
    assert (located.message, located.logged) == ("step 0: raised in 1/a.txt", "step 0: raised in /srv/m/1/a.txt")

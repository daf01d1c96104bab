"""TF Serving's model config files, read as TF Serving reads them, and the repository of their models."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.config.model import ModelConfig, VersionPolicy, VersionPolicyKind
from inferd.config.served_models import ServedModel
from inferd.core.repository import ServedModels
from inferd.errors import ModelConfigError
from inferd.protocol.tfserving_model_config import read_model_config_file


def read(tmp_path: Path, text: str) -> list[ServedModel]:
    path = tmp_path / "models.config"
    path.write_text(text)
    return read_model_config_file(str(path))


def test_policies_and_labels_read_as_tf_serving_reads_them(tmp_path: Path) -> None:
    models = read(
        tmp_path,
        """
        model_config_list {
          config { name: "a" base_path: "/m/a" model_platform: "tensorflow" }
          config { name: "b" base_path: "s3://bucket/b" model_version_policy { latest { num_versions: 2 } } }
          config { name: "c" base_path: "/m/c" model_version_policy { all {} } }
          config { name: "d" base_path: "/m/d" model_version_policy { specific { versions: 5 versions: 2 } }
                   version_labels { key: "canary" value: 5 } version_labels { key: "stable" value: 2 } }
        }
        """,
    )
    assert [(m.name, m.base_path, m.version_policy) for m in models] == [
        ("a", "/m/a", None),
        ("b", "s3://bucket/b", VersionPolicy(VersionPolicyKind.LATEST, latest_n=2)),
        ("c", "/m/c", VersionPolicy(VersionPolicyKind.ALL)),
        ("d", "/m/d", VersionPolicy(VersionPolicyKind.SPECIFIC, versions=(2, 5))),
    ]
    assert models[3].labels_parameter() == "canary:5,stable:2"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("model_config_list { config { base_path: '/m' } }", "'name' is missing"),
        ("model_config_list { config { name: 'm' } }", "'base_path' is missing"),
        ("model_config_list { config { name: 'm' base_path: '/a' } config { name: 'm' base_path: '/b' } }",
         "the name 'm' is given twice"),
        ("model_config_list { config { name: 'm' base_path: '/a' model_platform: 'pytorch' } }",
         "model_platform 'pytorch' is not one TF Serving serves"),
        ("model_config_list { config { name: 'm' base_path: '/a' version_labels { key: 'x' value: 0 } } }",
         "version_labels must name positive versions"),
        ("model_config_list { config { name: 'm' base_path: '/a' model_version_policy { specific {} } } }",
         "specific names no version"),
        ("model_config_list { config { nme: 'm' } }", "not a TF Serving model config"),
    ],
)  # fmt: skip
def test_what_tf_serving_refuses_is_refused_naming_the_entry(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ModelConfigError, match=said):
        read(tmp_path, text)


def test_a_served_model_comes_from_its_base_path_with_the_config_s_policy_and_labels(tmp_path: Path) -> None:
    for version in (1, 2, 3):
        (tmp_path / "store" / "resnet-v2" / str(version)).mkdir(parents=True)
        (tmp_path / "store" / "resnet-v2" / str(version) / "model.onnx").write_bytes(b"")
    policy = VersionPolicy(VersionPolicyKind.SPECIFIC, versions=(1, 3))
    served = ServedModels([ServedModel("resnet", str(tmp_path / "store" / "resnet-v2"), policy, (("stable", 1),))],
                          tmp_path / "cache")  # fmt: skip
    assert served.model_names() == ["resnet"]  # under its own name, whatever its folder's
    assert served.fingerprint("resnet").version_numbers == [1, 2, 3]
    config = served.configured("resnet", ModelConfig(name="resnet"))
    assert config.version_policy == policy and config.parameters["version_labels"] == "stable:1"
    before = served.fingerprint("resnet")
    served.replace([ServedModel("resnet", str(tmp_path / "store" / "resnet-v2"))])
    assert served.fingerprint("resnet") != before  # a changed entry reloads the model
    assert served.configured("other", ModelConfig(name="other")) == ModelConfig(name="other")
    with pytest.raises(ModelConfigError, match="names no model folder"):
        served.replace([ServedModel("m", "/")])


def test_local_base_paths_are_taken_as_the_operator_gave_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data" / "resnet-v3" / "1").mkdir(parents=True)
    (tmp_path / "data" / "resnet-v3" / "1" / "model.onnx").write_bytes(b"")
    (tmp_path / "current").symlink_to(tmp_path / "data" / "resnet-v3")  # a version swapped by a link
    monkeypatch.chdir(tmp_path / "data")
    served = ServedModels(
        [ServedModel("linked", str(tmp_path / "current")), ServedModel("relative", "resnet-v3")], tmp_path / "cache"
    )
    assert served.model_names() == ["linked", "relative"]  # relative to the server's folder, through the link
    assert served.names() == frozenset({"linked", "relative"})


@pytest.mark.parametrize(
    ("base_path", "said"),
    [("s3://bucket", "must name a folder inside its bucket"), ("nosuchfs://bucket/m", "cannot be read")],
)
def test_a_base_path_that_names_no_model_folder_is_refused(tmp_path: Path, base_path: str, said: str) -> None:
    with pytest.raises(ModelConfigError, match=said):
        ServedModels([ServedModel("m", base_path)], tmp_path / "cache")


def test_new_base_paths_are_those_no_served_model_has(tmp_path: Path) -> None:
    served = ServedModels([ServedModel("a", "/m/a/")], tmp_path / "cache")
    asked = [ServedModel("a", "/m/a", VersionPolicy(VersionPolicyKind.ALL)), ServedModel("b", "/m/b")]
    assert served.new_base_paths(asked) == ["/m/b"]

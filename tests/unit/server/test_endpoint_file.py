"""The endpoints file a fleet's replicas follow: a controller's weights written into it, the rest
of it as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferd.server.endpoint_file import EndpointFileError, read_endpoint_file, write_endpoint_weights

pytestmark = pytest.mark.timeout(30)

DECLARED = """
endpoints:
  shop:
    variants:
      - {name: blue, model: classifier, version: 1, weight: 90}
      - {name: green, model: classifier, version: 2, weight: 10}
    sticky: X-User-Id
  other:
    variants:
      - {name: only, model: m}
"""


def test_a_controllers_weights_are_written_and_the_rest_is_kept(tmp_path: Path) -> None:
    declared = tmp_path / "endpoints.yaml"
    declared.write_text(DECLARED)
    write_endpoint_weights(str(declared), "shop", {"blue": 67.5, "green": 32.5})
    shop, other = read_endpoint_file(str(declared))
    assert [(v.name, v.weight) for v in shop.variants] == [("blue", 67.5), ("green", 32.5)]
    assert shop.sticky == "X-User-Id" and [v.version for v in shop.variants] == ["1", "2"]
    assert [v.name for v in other.variants] == ["only"]
    write_endpoint_weights(f"file://{declared}", "shop", {"blue": 0.0, "green": 100.0})
    written = yaml.safe_load(declared.read_text())["endpoints"]["shop"]["variants"]
    assert [v["weight"] for v in written] == [0, 100]  # as a person writes them
    assert not list(tmp_path.glob(".*partial"))  # replaced whole, by a rename


def test_an_endpoint_the_file_does_not_declare_is_refused(tmp_path: Path) -> None:
    declared = tmp_path / "endpoints.yaml"
    declared.write_text(DECLARED)
    with pytest.raises(EndpointFileError, match="declares no endpoint 'missing'"):
        write_endpoint_weights(str(declared), "missing", {"a": 1.0})
    with pytest.raises(EndpointFileError, match="cannot be read"):
        write_endpoint_weights(str(tmp_path / "absent.yaml"), "shop", {"blue": 1.0})

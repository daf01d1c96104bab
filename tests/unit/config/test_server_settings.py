"""The server's settings refuse combinations that cannot work, saying which flag to give."""

from __future__ import annotations

import pydantic
import pytest

from inferd.config.server import ServerSettings

pytestmark = pytest.mark.timeout(30)


def settings(**given: object) -> ServerSettings:
    return ServerSettings.model_validate({"model_repository": ("models",), **given})


def test_a_rollout_controller_names_its_source_and_writes_a_shared_state_directory() -> None:
    assert settings(rollout_controller="scrape=a:8002,b:8002", state_dir="shared").rollout_controller
    assert settings(rollout_controller="prometheus=http://p:9090", state_dir="shared").rollout_scrape_interval_s == 15
    for given, message in (
        ({"rollout_controller": "scrape=a:8002"}, "give --state-dir"),
        ({"rollout_controller": "graphite=x", "state_dir": "s"}, "is prometheus=URL or scrape="),
        ({"rollout_controller": "scrape=", "state_dir": "s"}, "is prometheus=URL or scrape="),
        ({"rollout_controller": "scrape=a:1", "state_dir": "s", "endpoints_file": "e.yaml"}, "--endpoints FILE"),
    ):
        with pytest.raises(pydantic.ValidationError, match=message):
            settings(**given)

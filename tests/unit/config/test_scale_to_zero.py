"""The scale-to-zero parameters, read one way: a model's value over the server's default, and a
malformed value refused with a message that names it."""

from __future__ import annotations

import pytest

from inferd.config.loader import parse_model_config
from inferd.config.scale_to_zero import idle_unload_seconds, max_held
from inferd.errors import ModelConfigError


def test_the_model_s_values_win_over_the_server_s_defaults() -> None:
    assert idle_unload_seconds({}, None) is None
    assert idle_unload_seconds({}, 60.0) == 60.0
    assert idle_unload_seconds({"idle_unload_seconds": "1.5"}, 60.0) == 1.5
    assert idle_unload_seconds({"idle_unload_seconds": "0"}, 60.0) is None
    assert max_held({}, 1024) == 1024
    assert max_held({"max_held": "10"}, 1024) == 10


@pytest.mark.parametrize(
    ("key", "value"),
    [("idle_unload_seconds", "soon"), ("idle_unload_seconds", "-1"), ("idle_unload_seconds", "inf"),
     ("idle_unload_seconds", "nan"), ("max_held", "0"), ("max_held", "ten"), ("max_held", "-3"), ("max_held", "2.5")],
)  # fmt: skip
def test_a_malformed_value_fails_the_config_and_names_it(key: str, value: str) -> None:
    text = f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'
    with pytest.raises(ModelConfigError) as raised:
        parse_model_config(text, model_name="m", source="m/config.pbtxt")
    assert key in raised.value.message and repr(value) in raised.value.message
    assert raised.value.message.startswith("m/config.pbtxt")

"""Config parameters read as numbers by the runtimes (runtimes.base.positive_parameter)."""

from __future__ import annotations

import pytest

from inferd.config.model import ModelConfig
from inferd.errors import ModelConfigError
from inferd.runtimes.base import positive_parameter


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5", "\u00b9", ""])
def test_a_parameter_that_is_no_positive_integer_is_a_config_error(value: str) -> None:
    # "¹".isdigit() is True but int("¹") raised ValueError, which a load override could send.
    config = ModelConfig(name="m", parameters={"max_length": value})
    with pytest.raises(ModelConfigError, match="must be a positive integer"):
        positive_parameter(config, "max_length")


def test_a_positive_integer_parameter() -> None:
    assert positive_parameter(ModelConfig(name="m", parameters={"max_length": "128"}), "max_length") == 128
    assert positive_parameter(ModelConfig(name="m"), "max_length") is None

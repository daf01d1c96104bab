"""TF Serving's batching_parameters file, read and mapped onto inferd's batcher and instances."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.config.model import DynamicBatchingConfig, InstanceGroup, InstanceKind, ModelConfig
from inferd.errors import ModelConfigError
from inferd.protocol.tfserving_batching import read_batching_parameters

# TF Serving's documented example, wrapper fields and all.
EXAMPLE = """
max_batch_size { value: 64 }
batch_timeout_micros { value: 1000 }
max_enqueued_batches { value: 1000000 }
num_batch_threads { value: 4 }
"""


def test_the_documented_example_maps_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "batching.txt"
    path.write_text(EXAMPLE)
    defaults, mapping = read_batching_parameters(str(path))
    config = defaults.apply(
        ModelConfig(name="m", max_batch_size=8, instance_groups=(InstanceGroup(count=1, kind=InstanceKind.CPU),))
    )
    assert config.max_batch_size == 64
    assert config.dynamic_batching is not None and config.dynamic_batching.max_queue_delay_us == 1000
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 64_000_000
    assert config.instance_groups == (InstanceGroup(count=4, kind=InstanceKind.CPU),)
    assert len(mapping) == 4 and "num_batch_threads 4 -> instance_group count 4" in mapping[3]


def test_models_that_do_not_batch_are_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "batching.txt"
    path.write_text("max_batch_size { value: 32 } allowed_batch_sizes: [8, 16, 32] pad_variable_length_inputs: true")
    defaults, mapping = read_batching_parameters(str(path))
    unbatched = ModelConfig(name="m", max_batch_size=0)
    assert defaults.apply(unbatched) is unbatched
    batched = defaults.apply(ModelConfig(name="m", max_batch_size=4, dynamic_batching=DynamicBatchingConfig()))
    assert batched.dynamic_batching is not None and batched.dynamic_batching.preferred_batch_sizes == (8, 16, 32)
    assert batched.parameters["allowed_batch_sizes"] == "8,16,32"  # padded up, as TF Serving pads
    own = ModelConfig(name="m", max_batch_size=4, parameters={"allowed_batch_sizes": "2,4"})
    assert batched.dynamic_batching.default_queue_policy.max_queue_size == 320  # TF's default 10 batches
    assert not batched.dynamic_batching.max_queue_size_includes_executing  # TF counts enqueued batches only
    assert any("pad_variable_length_inputs: ignored" in line for line in mapping)
    assert defaults.apply(own).parameters["allowed_batch_sizes"] == "8,16,32"  # the file's, as its max_batch_size
    streaming = ModelConfig(name="m", max_batch_size=4, decoupled=True)
    assert "allowed_batch_sizes" not in defaults.apply(streaming).parameters  # its rows cannot be padded


def test_a_models_own_padding_is_kept_only_when_it_fits_the_files_max_batch_size(tmp_path: Path) -> None:
    path = tmp_path / "batching.txt"
    path.write_text("max_batch_size { value: 32 }")
    defaults, _ = read_batching_parameters(str(path))
    fits = ModelConfig(name="m", max_batch_size=4, parameters={"allowed_batch_sizes": "16, 32"})
    assert defaults.apply(fits).parameters["allowed_batch_sizes"] == "16, 32"
    other = ModelConfig(name="m", max_batch_size=4, parameters={"allowed_batch_sizes": "2,4", "k": "v"})
    assert defaults.apply(other).parameters == {"k": "v"}  # it would fail the model's load: dropped, and logged


@pytest.mark.parametrize(
    "text",
    [
        "max_batch_size: 3",
        "max_batch_size { value: 0 }",
        "max_batch_size { value: 8 } allowed_batch_sizes: [2, 4]",
        "max_batch_size { value: 8 } allowed_batch_sizes: [0, 8]",
    ],
)
def test_bad_files_say_why(tmp_path: Path, text: str) -> None:
    path = tmp_path / "batching.txt"
    path.write_text(text)
    with pytest.raises(ModelConfigError, match=str(path)):
        read_batching_parameters(str(path))

from __future__ import annotations

import pytest

from inferd.config.loader import complete_config, parse_model_config
from inferd.config.model import (
    DynamicBatchingConfig,
    InstanceKind,
    ModelSignature,
    QueuePolicy,
    TensorSpec,
    VersionPolicyKind,
    WarmupDataKind,
)
from inferd.errors import ModelConfigError
from inferd.types import DataType

FULL = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, -1 ] reshape: { shape: [ 3, -1 ] } } ]
input [ { name: "s" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
output [ { name: "y" data_type: TYPE_FP16 dims: [ 4 ] label_filename: "labels.txt" } ]
instance_group [ { count: 3 kind: KIND_CPU }, { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
version_policy: { specific: { versions: [ 2, 5 ] } }
dynamic_batching {
  max_queue_delay_microseconds: 500
  preferred_batch_size: [ 4, 8 ]
  default_queue_policy { max_queue_size: 64 default_timeout_microseconds: 1000 }
}
model_warmup [ {
  name: "w" batch_size: 2
  inputs { key: "x" value { data_type: TYPE_FP32 dims: [3, 2] zero_data: true } }
} ]
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
response_cache { enable: true }
optimization { priority: PRIORITY_MAX }
"""


def test_parses_the_supported_subset() -> None:
    config = parse_model_config(FULL, model_name="m")
    assert config.max_batch_size == 16
    assert config.inputs[0].dims == (3, -1)
    assert config.inputs[0].reshape == (3, -1)
    assert config.inputs[1].datatype is DataType.BYTES
    assert config.inputs[1].optional
    assert config.outputs[0].datatype is DataType.FP16
    assert [(g.count, g.kind) for g in config.instance_groups] == [(3, InstanceKind.CPU), (1, InstanceKind.GPU)]
    assert config.version_policy.kind is VersionPolicyKind.SPECIFIC
    assert config.version_policy.versions == (2, 5)
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.max_queue_delay_us == 500
    assert config.dynamic_batching.preferred_batch_sizes == (4, 8)
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 64
    assert config.warmup[0].inputs["x"].kind is WarmupDataKind.ZERO
    assert config.parameters == {"intra_op_thread_count": "2"}
    assert config.response_cache


def test_reports_fields_outside_the_subset() -> None:
    config = parse_model_config(FULL, model_name="m")
    assert set(config.ignored_fields) == {"optimization"}  # label_filename feeds the classification extension
    assert config.outputs[0].label_filename


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("sequence_batching { }", "a sequence model's answers follow its state"),
        ("model_transaction_policy { decoupled: true }", "a decoupled model answers a request with any number"),
        ('backend: "remote"', "a remote model's answers follow another server"),
    ],
)
def test_a_model_whose_answers_are_not_one_request_s_cannot_cache_them(text: str, said: str) -> None:
    with pytest.raises(ModelConfigError, match=r"response_cache \{ enable: true \} cannot apply") as raised:
        parse_model_config(f"{text}\nresponse_cache {{ enable: true }}", model_name="m")
    assert said in raised.value.message
    assert not parse_model_config(text, model_name="m").response_cache  # off: nothing to refuse


def test_an_ensemble_may_cache_its_answers_as_a_whole() -> None:
    text = (
        'platform: "ensemble" input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ] ensemble_scheduling { step [ { model_name: "a" '
        'input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] } response_cache { enable: true }'
    )
    assert parse_model_config(text, model_name="e").response_cache


def test_syntax_error_names_line_and_column() -> None:
    with pytest.raises(ModelConfigError, match=r"config.pbtxt: 2:\d+ .*max_batch_sise"):
        parse_model_config('name: "m"\nmax_batch_sise: 4', model_name="m")


def test_name_must_match_folder() -> None:
    with pytest.raises(ModelConfigError, match="differs from the model's folder name"):
        parse_model_config('name: "other"', model_name="m")


@pytest.mark.parametrize(
    ("policy", "available", "selected"),
    [
        ("", [1, 2, 3], [3]),
        ("version_policy: { latest: { num_versions: 2 } }", [3, 1, 2], [2, 3]),
        ("version_policy: { all: {} }", [1, 2, 3], [1, 2, 3]),
        ("version_policy: { specific: { versions: [1, 4] } }", [1, 2, 3], [1]),
    ],
)
def test_version_policy(policy: str, available: list[int], selected: list[int]) -> None:
    assert parse_model_config(policy, model_name="m").version_policy.select(available) == selected


SIGNATURE = ModelSignature(
    inputs=(TensorSpec("a", DataType.FP32, (-1, 8)), TensorSpec("b", DataType.INT64, (-1, 2))),
    outputs=(TensorSpec("c", DataType.FP32, (-1, 8)),),
)
ONNX_NAMES = {"platform": "onnxruntime_onnx", "backend": "onnxruntime"}


def test_complete_from_nothing_makes_a_batching_model() -> None:
    config = complete_config(parse_model_config("", model_name="m"), SIGNATURE, **ONNX_NAMES)
    assert config.max_batch_size == 4
    assert [(t.name, t.dims) for t in config.inputs] == [("a", (8,)), ("b", (2,))]
    assert [(t.name, t.dims) for t in config.outputs] == [("c", (8,))]
    assert config.platform == "onnxruntime_onnx"
    assert len(config.instance_groups) == 1


def test_complete_keeps_given_inputs_and_fills_outputs() -> None:
    text = (
        'max_batch_size: 2\ninput [ { name: "a" data_type: TYPE_FP32 dims: [8] }, '
        '{ name: "b" data_type: TYPE_INT64 dims: [2] } ]'
    )
    config = complete_config(parse_model_config(text, model_name="m"), SIGNATURE, **ONNX_NAMES)
    assert config.max_batch_size == 2
    assert config.outputs[0].name == "c"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('input [ { name: "zz" data_type: TYPE_FP32 dims: [8] } ]', "not in the model file"),
        (
            'max_batch_size: 2\ninput [ { name: "a" data_type: TYPE_FP16 dims: [8] } ]',
            "TYPE_FP16 but the model file has TYPE_FP32",
        ),
        ('max_batch_size: 2\ninput [ { name: "a" data_type: TYPE_FP32 dims: [9] } ]', r"shape \[-1, 9\]"),
        (
            'max_batch_size: 0\ninput [ { name: "a" data_type: TYPE_FP32 dims: [8] } ]',
            r"shape \[8\] but the model file has \[-1, 8\]",
        ),
    ],
)
def test_complete_rejects_configs_that_contradict_the_file(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        complete_config(parse_model_config(text, model_name="m"), SIGNATURE, **ONNX_NAMES)


def test_priority_queue_policies() -> None:
    text = """
    max_batch_size: 4
    dynamic_batching {
      priority_levels: 2
      default_queue_policy { max_queue_size: 8 }
      priority_queue_policy { key: 1 value: { max_queue_size: 2 default_timeout_microseconds: 500 } }
    }
    """
    batching = parse_model_config(text, model_name="m").dynamic_batching
    assert batching is not None
    assert batching.queue_policy(1).max_queue_size == 2
    assert batching.queue_policy(1).default_timeout_us == 500
    assert batching.queue_policy(2).max_queue_size == 8


def test_the_queue_bound_includes_executing_requests_unless_a_model_asks_for_triton_s() -> None:
    def batching(parameter: str) -> DynamicBatchingConfig | None:
        text = "dynamic_batching { default_queue_policy { max_queue_size: 4 } }\n" + parameter
        return parse_model_config(text, model_name="m").dynamic_batching

    default = batching("")
    assert default == DynamicBatchingConfig(default_queue_policy=QueuePolicy(max_queue_size=4))
    assert default.max_queue_size_includes_executing
    triton_s = batching('parameters { key: "max_queue_size_includes_executing" value: { string_value: "False" } }')
    assert triton_s is not None and not triton_s.max_queue_size_includes_executing
    # Priority levels bound each level: the executing requests (of any level) are not counted by default.
    levels = parse_model_config(
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 4 } }",
        model_name="m",
    ).dynamic_batching
    assert levels is not None and not levels.max_queue_size_includes_executing
    with pytest.raises(ModelConfigError, match="max_queue_size_includes_executing must be true or false, got 'yes'"):
        batching('parameters { key: "max_queue_size_includes_executing" value: { string_value: "yes" } }')

"""Planning an ensemble against its step models' configs: each mistake is refused saying where;
the ensemble's outputs take the class labels of the step outputs that make them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferd.config.loader import parse_model_config
from inferd.config.model import ModelConfig, TensorConfig
from inferd.core.ensemble import plan_ensemble, with_step_labels
from inferd.errors import ModelConfigError
from inferd.types import DataType

TOKENIZER = ModelConfig(
    name="tokenizer",
    max_batch_size=8,
    inputs=(TensorConfig("TEXT", DataType.BYTES, (1,)),),
    outputs=(
        TensorConfig("input_ids", DataType.INT64, (-1,)),
        TensorConfig("attention_mask", DataType.INT64, (-1,)),
    ),
)
ENCODER = ModelConfig(
    name="encoder",
    max_batch_size=16,
    inputs=(
        TensorConfig("input_ids", DataType.INT64, (-1,)),
        TensorConfig("attention_mask", DataType.INT64, (-1,)),
    ),
    outputs=(TensorConfig("hidden", DataType.FP32, (-1, 4)), TensorConfig("pooled", DataType.FP32, (4,))),
)


def ensemble(steps: str, *, outputs: str = '{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] }') -> ModelConfig:
    return parse_model_config(
        f"""
        platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
        output [ {outputs} ]
        ensemble_scheduling {{ step [ {steps} ] }}
        """,
        model_name="pipeline",
    )


TOKENIZE = """{ model_name: "tokenizer" input_map { key: "TEXT" value: "TEXT" }
  output_map { key: "input_ids" value: "ids" } output_map { key: "attention_mask" value: "mask" } }"""
ENCODE = """{ model_name: "encoder" input_map { key: "input_ids" value: "ids" }
  input_map { key: "attention_mask" value: "mask" } output_map { key: "pooled" value: "EMBEDDING" } }"""
ENCODE_WITHOUT_MASK = ENCODE.replace('input_map { key: "attention_mask" value: "mask" }', "")
TOKENIZE_IDS = TOKENIZE.replace('value: "TEXT"', 'value: "ids"')
ENCODE_VERSION_3 = ENCODE.replace('model_name: "encoder"', 'model_name: "encoder" model_version: 3')


def test_a_chain_is_planned_with_each_step_waiting_for_the_tensors_before_it() -> None:
    plan = plan_ensemble(ensemble(f"{ENCODE}, {TOKENIZE}"), [ENCODER, TOKENIZER])
    encode, tokenize = plan.steps
    assert encode.waits_for == {"ids", "mask"}
    assert tokenize.waits_for == frozenset()
    assert plan.steps_for_output == {"EMBEDDING": frozenset({0, 1})}


@pytest.mark.parametrize(
    ("steps", "configs", "message"),
    [
        (
            TOKENIZE.replace('key: "TEXT"', 'key: "text"'),
            [TOKENIZER],
            "step 0 (model 'tokenizer'): input_map names input 'text', which model 'tokenizer' does not have",
        ),
        (
            TOKENIZE.replace('key: "input_ids"', 'key: "token_ids"'),
            [TOKENIZER],
            "output_map names output 'token_ids', which model 'tokenizer' does not have",
        ),
        (
            f"{TOKENIZE}, {ENCODE_WITHOUT_MASK}",
            [TOKENIZER, ENCODER],
            "model 'encoder' needs input(s) ['attention_mask'], not in input_map",
        ),
        (
            f"{TOKENIZE}, {TOKENIZE_IDS}",
            [TOKENIZER, TOKENIZER],
            "step 1 (model 'tokenizer'): output_map makes ensemble tensor 'mask', which is also made by step 0",
        ),
        (
            ENCODE.replace('value: "EMBEDDING"', 'value: "TEXT"'),
            [ENCODER],
            "output_map makes ensemble tensor 'TEXT', which is an ensemble input",
        ),
    ],
)
def test_mistakes_name_the_step_and_the_tensor(steps: str, configs: list[ModelConfig], message: str) -> None:
    with pytest.raises(ModelConfigError) as raised:
        plan_ensemble(ensemble(steps), configs)
    assert message in raised.value.message


def test_a_step_that_batches_less_than_the_ensemble_is_refused() -> None:
    small = ModelConfig(name="tokenizer", max_batch_size=4, inputs=TOKENIZER.inputs, outputs=TOKENIZER.outputs)
    with pytest.raises(ModelConfigError, match="max_batch_size 8 is more than the step model's 4"):
        plan_ensemble(ensemble(f"{TOKENIZE}, {ENCODE}"), [small, ENCODER])


def test_shapes_that_cannot_meet_are_refused() -> None:
    outputs = '{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 5 ] }'
    with pytest.raises(ModelConfigError, match=r"has shape \[-1, 4\] but \[-1, 5\] is expected"):
        plan_ensemble(ensemble(f"{TOKENIZE}, {ENCODE}", outputs=outputs), [TOKENIZER, ENCODER])


def test_an_output_no_step_makes_is_refused() -> None:
    outputs = (
        '{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "EXTRA" data_type: TYPE_FP32 dims: [ 4 ] }'
    )
    with pytest.raises(ModelConfigError, match="output 'EXTRA' is not made by any step's output_map"):
        plan_ensemble(ensemble(f"{TOKENIZE}, {ENCODE}", outputs=outputs), [TOKENIZER, ENCODER])


def test_only_ensembles_have_steps_and_ensembles_need_them() -> None:
    with pytest.raises(ModelConfigError, match='only for models with platform "ensemble"'):
        parse_model_config(f"ensemble_scheduling {{ step [ {TOKENIZE} ] }}", model_name="m")
    with pytest.raises(ModelConfigError, match="needs ensemble_scheduling with at least one step"):
        parse_model_config('platform: "ensemble"', model_name="m")


def test_step_versions_default_to_the_latest() -> None:
    config = ensemble(f"{TOKENIZE}, {ENCODE_VERSION_3}")
    assert config.ensemble is not None
    assert [s.version_label for s in config.ensemble.steps] == ["", "3"]
    assert config.ensemble.model_names == ("tokenizer", "encoder")


def test_outputs_without_labels_take_those_of_the_step_output_that_makes_them() -> None:
    labelled = ModelConfig(
        name="encoder",
        max_batch_size=16,
        inputs=ENCODER.inputs,
        outputs=(ENCODER.outputs[0], replace(ENCODER.outputs[1], labels=("a", "b", "c", "d"))),
    )
    outputs = (
        '{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] }'
    )
    config = ensemble(f"{ENCODE}, {TOKENIZE}", outputs=outputs)
    completed = with_step_labels(config, [labelled, TOKENIZER])
    assert [t.labels for t in completed.outputs] == [("a", "b", "c", "d"), ()]
    # Labels of the ensemble's own (its label_filename) stay.
    own = replace(config, outputs=(replace(config.outputs[0], labels=("x",)), config.outputs[1]))
    assert with_step_labels(own, [labelled, TOKENIZER]).outputs[0].labels == ("x",)

"""config.pbtxt → `ModelConfig`, and completion of a partial config from the model file's signature.

The text is parsed by protobuf's text_format into Triton's own compiled ModelConfig message (shipped
by tritonclient), so every valid Triton config parses and every typo is reported with its line and
column. Fields outside inferd's subset are listed in `ModelConfig.ignored_fields`, never misread.
This module is the only place where config files are read and where protobuf meets the config layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inferd.config.model import (
    ENSEMBLE_PLATFORM,
    LATEST_VERSION,
    ControlKind,
    DynamicBatchingConfig,
    EnsembleConfig,
    EnsembleStep,
    InstanceGroup,
    InstanceKind,
    ModelConfig,
    ModelSignature,
    QueuePolicy,
    SequenceBatchingConfig,
    SequenceControl,
    TensorConfig,
    TensorSpec,
    VersionPolicy,
    VersionPolicyKind,
    WarmupDataKind,
    WarmupInput,
    WarmupSample,
)
from inferd.config.parameters import QUEUE_INCLUDES_EXECUTING
from inferd.config.scale_to_zero import check_scale_to_zero
from inferd.datatypes import NAMES
from inferd.errors import ModelConfigError
from inferd.types import DataType

CONFIG_FILE_NAME = "config.pbtxt"
# Triton's --backend-config=default-max-batch-size: what an auto-completed batching model gets.
DEFAULT_MAX_BATCH_SIZE = 4
# The model parameter that says whether dynamic_batching's max_queue_size counts executing requests
# too (inferd's default) or queued ones only ("false": Triton's meaning).

# Triton's TYPE_* names → v2 datatypes (`inferd.datatypes`). TYPE_STRING is the BYTES tensor.
DATATYPES_BY_CONFIG_NAME = {names.config: datatype for datatype, names in NAMES.items()}
CONFIG_NAMES_BY_DATATYPE = {dt: name for name, dt in DATATYPES_BY_CONFIG_NAME.items()}

# The fields inferd acts on, per message type of Triton's ModelConfig; anything else that is set is
# reported as ignored (a load logs it). The docs' config reference is generated from it.
SUPPORTED_FIELDS: dict[str, frozenset[str]] = {
    "ModelConfig": frozenset(
        {
            "name",
            "platform",
            "backend",
            "default_model_filename",
            "max_batch_size",
            "input",
            "output",
            "dynamic_batching",
            "instance_group",
            "version_policy",
            "model_warmup",
            "parameters",
            "ensemble_scheduling",
            "model_transaction_policy",
            "sequence_batching",
            "response_cache",
        }
    ),
    "ModelResponseCache": frozenset({"enable"}),
    "ModelSequenceBatching": frozenset({"direct", "oldest", "max_sequence_idle_microseconds", "control_input"}),
    "StrategyDirect": frozenset({"max_queue_delay_microseconds"}),
    "StrategyOldest": frozenset({"preferred_batch_size", "max_queue_delay_microseconds"}),
    "ControlInput": frozenset({"name", "control"}),
    "Control": frozenset({"kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type"}),
    "ModelTransactionPolicy": frozenset({"decoupled"}),
    "ModelEnsembling": frozenset({"step"}),
    "Step": frozenset({"model_name", "model_version", "input_map", "output_map"}),
    "ModelInput": frozenset({"name", "data_type", "dims", "reshape", "optional"}),
    "ModelOutput": frozenset({"name", "data_type", "dims", "reshape", "label_filename"}),
    "ModelInstanceGroup": frozenset({"name", "count", "kind", "gpus"}),
    "ModelDynamicBatching": frozenset(
        {
            "max_queue_delay_microseconds",
            "preferred_batch_size",
            "preserve_ordering",
            "default_queue_policy",
            "priority_queue_policy",
            "priority_levels",
            "default_priority_level",
        }
    ),
}


def read_model_config(model_dir: Path) -> ModelConfig:
    """The model's config.pbtxt, or an empty config named after the folder when there is none."""
    path = model_dir / CONFIG_FILE_NAME
    if not path.is_file():
        return ModelConfig(name=model_dir.name)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"cannot read {path}: {exc}") from exc
    return parse_model_config(text, model_name=model_dir.name, source=str(path))


def parse_model_config(text: str, *, model_name: str, source: str = CONFIG_FILE_NAME) -> ModelConfig:
    # Imported here: tritonclient's package import also pulls in grpc, which config must not cost.
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    message = pb.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{source}: {exc}") from exc
    return _from_message(message, pb, model_name=model_name, source=source)


def parse_model_config_json(text: str, *, model_name: str, source: str = "config override") -> ModelConfig:
    """A config in Triton's JSON form, as `tritonclient`'s load_model(config=...) sends it."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as pb

    message = pb.ModelConfig()
    try:
        json_format.Parse(text, message)
    except (json_format.ParseError, ValueError, RecursionError) as exc:
        raise ModelConfigError(f"{source}: {exc}") from exc
    return _from_message(message, pb, model_name=model_name, source=source)


def _from_message(message: Any, pb: Any, *, model_name: str, source: str) -> ModelConfig:
    if message.name and message.name != model_name:
        raise ModelConfigError(f"{source}: name '{message.name}' differs from the model's folder name '{model_name}'")
    parameters = {key: value.string_value for key, value in message.parameters.items()}
    check_scale_to_zero(parameters, source)
    if message.response_cache.enable:
        _check_response_cache(message, source)
    return ModelConfig(
        name=model_name,
        platform=message.platform,
        backend=message.backend,
        default_model_filename=message.default_model_filename,
        max_batch_size=_non_negative(message.max_batch_size, "max_batch_size", source),
        inputs=tuple(_tensor(t, pb, source, is_input=True) for t in message.input),
        outputs=tuple(_tensor(t, pb, source, is_input=False) for t in message.output),
        instance_groups=tuple(_instance_group(g, pb, source) for g in message.instance_group),
        version_policy=_version_policy(message, source),
        dynamic_batching=_dynamic_batching(message, pb, source) if message.HasField("dynamic_batching") else None,
        warmup=tuple(_warmup(w, pb, source) for w in message.model_warmup),
        parameters=parameters,
        ensemble=_ensemble(message, source),
        decoupled=message.model_transaction_policy.decoupled,
        sequence_batching=_sequence_batching(message, pb, source) if message.HasField("sequence_batching") else None,
        response_cache=message.response_cache.enable,
        ignored_fields=tuple(_ignored_fields(message)),
        written=message.SerializeToString(),
    )


def _check_response_cache(message: Any, source: str) -> None:
    """A model whose answers are not a function of one request cannot cache them."""
    why = None
    if message.HasField("sequence_batching"):
        why = "a sequence model's answers follow its state, not one request"
    elif message.model_transaction_policy.decoupled:
        why = "a decoupled model answers a request with any number of responses"
    elif message.backend == "remote":
        why = "a remote model's answers follow another server, whose changes no key here can see"
    if why is not None:
        raise ModelConfigError(f"{source}: response_cache {{ enable: true }} cannot apply: {why}")


def complete_config(config: ModelConfig, signature: ModelSignature, *, platform: str, backend: str) -> ModelConfig:
    """Fill what config.pbtxt left out from the model file, and check what it did say against it.

    Like Triton's auto-complete: missing inputs/outputs come from the file; a model given no inputs
    and no batch size whose every tensor has a dynamic first dimension batches up to
    DEFAULT_MAX_BATCH_SIZE; `platform` and `backend` name the runtime that loaded it.
    """
    max_batch_size = config.max_batch_size
    if max_batch_size == 0 and not config.inputs and _all_batchable(signature):
        max_batch_size = DEFAULT_MAX_BATCH_SIZE
    strip_batch = max_batch_size > 0
    inputs = config.inputs or tuple(_from_spec(s, strip_batch) for s in signature.inputs)
    outputs = config.outputs or tuple(_from_spec(s, strip_batch) for s in signature.outputs)
    completed = dataclasses.replace(
        config,
        platform=config.platform or platform,
        backend=config.backend or backend,
        max_batch_size=max_batch_size,
        inputs=inputs,
        outputs=outputs,
        instance_groups=config.instance_groups or (InstanceGroup(),),
    )
    _check_against_signature(completed, completed.inputs, signature.inputs, "input")
    _check_against_signature(completed, completed.outputs, signature.outputs, "output")
    return completed


def _all_batchable(signature: ModelSignature) -> bool:
    tensors = (*signature.inputs, *signature.outputs)
    return bool(tensors) and all(len(t.shape) > 0 and t.shape[0] < 0 for t in tensors)


def _from_spec(spec: TensorSpec, strip_batch: bool) -> TensorConfig:
    dims = spec.shape[1:] if strip_batch else spec.shape
    return TensorConfig(name=spec.name, datatype=spec.datatype, dims=dims)


def _check_against_signature(
    config: ModelConfig, tensors: tuple[TensorConfig, ...], specs: tuple[TensorSpec, ...], kind: str
) -> None:
    by_name = {s.name: s for s in specs}
    for tensor in tensors:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise ModelConfigError(
                f"config {kind} '{tensor.name}' is not in the model file, whose {kind}s are {sorted(by_name)}"
            )
        if spec.datatype is not tensor.datatype:
            raise ModelConfigError(
                f"config {kind} '{tensor.name}' has data_type {CONFIG_NAMES_BY_DATATYPE[tensor.datatype]} "
                f"but the model file has {CONFIG_NAMES_BY_DATATYPE[spec.datatype]}"
            )
        runtime_dims = tensor.reshape if tensor.reshape is not None else tensor.dims
        expected = (-1, *runtime_dims) if config.max_batch_size > 0 else runtime_dims
        if not _shapes_compatible(expected, spec.shape):
            batch_note = (
                " (with max_batch_size > 0 the model file's first dimension must be the batch dimension)"
                if config.max_batch_size > 0
                else ""
            )
            raise ModelConfigError(
                f"config {kind} '{tensor.name}' has shape {list(expected)} but the model file has "
                f"{list(spec.shape)}{batch_note}"
            )


def _shapes_compatible(config_shape: tuple[int, ...], file_shape: tuple[int, ...]) -> bool:
    if len(config_shape) != len(file_shape):
        return False
    return all(c == f or c < 0 or f < 0 for c, f in zip(config_shape, file_shape, strict=True))


def _non_negative(value: int, field_name: str, source: str) -> int:
    if value < 0:
        raise ModelConfigError(f"{source}: {field_name} must be >= 0, got {value}")
    return int(value)


def _datatype(enum_value: int, pb: Any, where: str) -> DataType:
    name = pb.DataType.Name(enum_value)
    try:
        return DATATYPES_BY_CONFIG_NAME[name]
    except KeyError:
        raise ModelConfigError(f"{where}: data_type {name} is not supported") from None


def _tensor(message: Any, pb: Any, source: str, *, is_input: bool) -> TensorConfig:
    where = f"{source}: {'input' if is_input else 'output'} '{message.name}'"
    if not message.name:
        raise ModelConfigError(f"{source}: an {'input' if is_input else 'output'} has no name")
    dims = tuple(int(d) for d in message.dims)
    if any(d < -1 or d == 0 for d in dims):
        raise ModelConfigError(f"{where}: dims {list(dims)} may hold only positive sizes or -1")
    reshape = tuple(int(d) for d in message.reshape.shape) if message.HasField("reshape") else None
    return TensorConfig(
        name=message.name,
        datatype=_datatype(message.data_type, pb, where),
        dims=dims,
        reshape=reshape,
        optional=bool(getattr(message, "optional", False)),
        label_filename="" if is_input else message.label_filename,
    )


def _instance_group(message: Any, pb: Any, source: str) -> InstanceGroup:
    kind = InstanceKind(pb.ModelInstanceGroup.Kind.Name(message.kind))
    count = message.count if message.count > 0 else 1
    return InstanceGroup(count=count, kind=kind, gpus=tuple(int(g) for g in message.gpus))


def _version_policy(message: Any, source: str) -> VersionPolicy:
    if not message.HasField("version_policy"):
        return VersionPolicy()
    policy = message.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy(kind=VersionPolicyKind.ALL)
    if which == "specific":
        versions = tuple(int(v) for v in policy.specific.versions)
        if not versions:
            raise ModelConfigError(f"{source}: version_policy specific lists no versions")
        return VersionPolicy(kind=VersionPolicyKind.SPECIFIC, versions=versions)
    num_versions = policy.latest.num_versions if which == "latest" else 1
    if num_versions < 1:
        raise ModelConfigError(f"{source}: version_policy latest num_versions must be >= 1")
    return VersionPolicy(kind=VersionPolicyKind.LATEST, latest_n=int(num_versions))


def _ensemble(message: Any, source: str) -> EnsembleConfig | None:
    """The steps of an ensemble's `ensemble_scheduling`; only an ensemble may (and must) have them."""
    has_steps = message.HasField("ensemble_scheduling") and len(message.ensemble_scheduling.step) > 0
    if message.platform != ENSEMBLE_PLATFORM:
        if has_steps:
            raise ModelConfigError(
                f'{source}: ensemble_scheduling is only for models with platform "{ENSEMBLE_PLATFORM}"'
            )
        return None
    if not has_steps:
        raise ModelConfigError(f"{source}: an ensemble needs ensemble_scheduling with at least one step")
    steps = []
    for index, step in enumerate(message.ensemble_scheduling.step):
        where = f"{source}: ensemble_scheduling step {index}"
        if not step.model_name:
            raise ModelConfigError(f"{where} has no model_name")
        if step.model_version < LATEST_VERSION:
            raise ModelConfigError(f"{where} (model '{step.model_name}'): model_version must be -1 (latest) or >= 1")
        if not step.output_map:
            raise ModelConfigError(f"{where} (model '{step.model_name}') has no output_map: it would produce nothing")
        steps.append(
            EnsembleStep(
                model_name=step.model_name,
                # Left out (0) means the latest, as -1 does.
                model_version=int(step.model_version) if step.model_version > 0 else LATEST_VERSION,
                # Sorted: protobuf maps have no order, and messages about them should not vary.
                input_map=dict(sorted(step.input_map.items())),
                output_map=dict(sorted(step.output_map.items())),
            )
        )
    return EnsembleConfig(steps=tuple(steps))


def _dynamic_batching(message: Any, pb: Any, source: str) -> DynamicBatchingConfig:
    batching = message.dynamic_batching
    # With priority levels each level has its own bound, and the executing requests (of any level)
    # would count against every one of them: a level bounded to 1 would refuse whenever anything
    # runs. Such models keep Triton's meaning unless they ask otherwise.
    single_level = int(batching.priority_levels) <= 1
    return DynamicBatchingConfig(
        max_queue_delay_us=int(batching.max_queue_delay_microseconds),
        preferred_batch_sizes=tuple(int(s) for s in batching.preferred_batch_size),
        preserve_ordering=bool(batching.preserve_ordering),
        priority_levels=int(batching.priority_levels),
        default_priority_level=int(batching.default_priority_level),
        default_queue_policy=_queue_policy(batching.default_queue_policy, pb),
        priority_queue_policies={
            int(level): _queue_policy(policy, pb) for level, policy in batching.priority_queue_policy.items()
        },
        max_queue_size_includes_executing=_boolean_parameter(
            message, QUEUE_INCLUDES_EXECUTING.name, source, default=single_level
        ),
    )


def _boolean_parameter(message: Any, key: str, source: str, *, default: bool) -> bool:
    """A `parameters` entry that must read true or false (`default` when absent)."""
    if key not in message.parameters:
        return default
    value = str(message.parameters[key].string_value)
    if value.lower() not in ("true", "false"):
        raise ModelConfigError(f"{source}: parameter {key} must be true or false, got {value!r}")
    return value.lower() == "true"


def _sequence_batching(message: Any, pb: Any, source: str) -> SequenceBatchingConfig:
    batching = message.sequence_batching
    strategy = batching.WhichOneof("strategy_choice") or "direct"
    chosen = getattr(batching, strategy)
    controls = []
    for control_input in batching.control_input:
        for control in control_input.control:
            kind = ControlKind(pb.ModelSequenceBatching.Control.Kind.Name(control.kind))
            where = f"{source}: sequence_batching control input '{control_input.name}'"
            if kind is ControlKind.CORRID:
                datatype = _datatype(control.data_type, pb, where) if control.data_type else DataType.UINT64
                controls.append(SequenceControl(control_input.name, kind, datatype))
                continue
            pairs = [(DataType.INT32, list(control.int32_false_true)), (DataType.FP32, list(control.fp32_false_true)),
                     (DataType.BOOL, list(control.bool_false_true))]  # fmt: skip
            given = [(datatype, values) for datatype, values in pairs if values]
            if len(given) != 1 or len(given[0][1]) != 2:
                raise ModelConfigError(
                    f"{where}: a {kind.value} control needs exactly one of int32_false_true, fp32_false_true, "
                    "bool_false_true, with two values (false, true)"
                )
            datatype, (false_value, true_value) = given[0]
            controls.append(SequenceControl(control_input.name, kind, datatype, false_value, true_value))
    return SequenceBatchingConfig(
        strategy=strategy,
        max_idle_us=int(batching.max_sequence_idle_microseconds) or 1_000_000,
        controls=tuple(controls),
        max_queue_delay_us=int(chosen.max_queue_delay_microseconds),
        preferred_batch_sizes=tuple(int(s) for s in getattr(chosen, "preferred_batch_size", ())),
    )


def _queue_policy(queue: Any, pb: Any) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=int(queue.max_queue_size),
        default_timeout_us=int(queue.default_timeout_microseconds),
        timeout_action_reject=queue.timeout_action == pb.ModelQueuePolicy.REJECT,
        allow_timeout_override=bool(queue.allow_timeout_override),
    )


def _warmup(message: Any, pb: Any, source: str) -> WarmupSample:
    inputs: dict[str, WarmupInput] = {}
    for name, item in message.inputs.items():
        where = f"{source}: model_warmup '{message.name}' input '{name}'"
        which = item.WhichOneof("input_data_type")
        kind = {
            "zero_data": WarmupDataKind.ZERO,
            "random_data": WarmupDataKind.RANDOM,
            "input_data_file": WarmupDataKind.FILE,
        }.get(which or "")
        if kind is None:
            raise ModelConfigError(f"{where}: needs zero_data, random_data or input_data_file")
        inputs[name] = WarmupInput(
            datatype=_datatype(item.data_type, pb, where),
            dims=tuple(int(d) for d in item.dims),
            kind=kind,
            file_name=item.input_data_file if kind is WarmupDataKind.FILE else "",
        )
    return WarmupSample(
        name=message.name, batch_size=int(message.batch_size), inputs=inputs, count=max(1, int(message.count))
    )


def is_repeated(descriptor: Any) -> bool:
    """protobuf >= 6.31 deprecates `label` for `is_repeated`; support both."""
    if hasattr(descriptor, "is_repeated"):
        return bool(descriptor.is_repeated)
    return bool(descriptor.label == descriptor.LABEL_REPEATED)


def _ignored_fields(message: Any, prefix: str = "") -> Iterator[str]:
    supported = SUPPORTED_FIELDS.get(message.DESCRIPTOR.name)
    if supported is None:
        return
    for descriptor, value in message.ListFields():
        path = f"{prefix}{descriptor.name}"
        if descriptor.name not in supported:
            yield path
        elif descriptor.message_type is not None and descriptor.message_type.name in SUPPORTED_FIELDS:
            if is_repeated(descriptor):
                for index, item in enumerate(value):
                    yield from _ignored_fields(item, f"{path}[{index}].")
            else:
                yield from _ignored_fields(value, f"{path}.")

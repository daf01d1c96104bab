"""inferd's ModelConfig → Triton's ModelConfig message (gRPC) and its JSON form (REST).

The REST form is Triton's: field names as in config.pbtxt, enums by name, integers as numbers
(perf_analyzer reads `max_batch_size` and dims as numbers, so protobuf's int64-as-string JSON
mapping will not do).
"""

from __future__ import annotations

from typing import Any

from inferd.config.loader import CONFIG_NAMES_BY_DATATYPE, is_repeated
from inferd.config.model import ModelConfig, QueuePolicy, TensorConfig, VersionPolicyKind


def to_proto(config: ModelConfig) -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    message = pb.ModelConfig(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        max_batch_size=config.max_batch_size,
        default_model_filename=config.default_model_filename,
    )
    for tensor in config.inputs:
        item = message.input.add(name=tensor.name, data_type=_proto_datatype(pb, tensor), dims=tensor.dims)
        item.optional = tensor.optional
        if tensor.reshape is not None:
            item.reshape.shape.extend(tensor.reshape)
    for tensor in config.outputs:
        item = message.output.add(name=tensor.name, data_type=_proto_datatype(pb, tensor), dims=tensor.dims)
        if tensor.reshape is not None:
            item.reshape.shape.extend(tensor.reshape)
    for group in config.instance_groups:
        message.instance_group.add(
            name=config.name,
            count=group.count,
            kind=pb.ModelInstanceGroup.Kind.Value(group.kind.value),
            gpus=group.gpus,
        )
    versions = config.version_policy
    if versions.kind is VersionPolicyKind.ALL:
        message.version_policy.all.SetInParent()
    elif versions.kind is VersionPolicyKind.SPECIFIC:
        message.version_policy.specific.versions.extend(versions.versions)
    else:
        message.version_policy.latest.num_versions = versions.latest_n
    if config.dynamic_batching is not None:
        batching = config.dynamic_batching
        message.dynamic_batching.max_queue_delay_microseconds = batching.max_queue_delay_us
        message.dynamic_batching.preferred_batch_size.extend(batching.preferred_batch_sizes)
        message.dynamic_batching.preserve_ordering = batching.preserve_ordering
        message.dynamic_batching.priority_levels = batching.priority_levels
        message.dynamic_batching.default_priority_level = batching.default_priority_level
        _fill_queue_policy(pb, message.dynamic_batching.default_queue_policy, batching.default_queue_policy)
        for level, queue_policy in batching.priority_queue_policies.items():
            _fill_queue_policy(pb, message.dynamic_batching.priority_queue_policy[level], queue_policy)
    for key, value in config.parameters.items():
        message.parameters[key].string_value = value
    return message


def _fill_queue_policy(pb: Any, message: Any, policy: QueuePolicy) -> None:
    message.max_queue_size = policy.max_queue_size
    message.default_timeout_microseconds = policy.default_timeout_us
    message.allow_timeout_override = policy.allow_timeout_override
    message.timeout_action = pb.ModelQueuePolicy.REJECT if policy.timeout_action_reject else pb.ModelQueuePolicy.DELAY


def to_json(config: ModelConfig) -> dict[str, Any]:
    result: dict[str, Any] = _message_to_dict(to_proto(config))
    # Triton always shows these, even at their zero defaults; clients read them unconditionally.
    result.setdefault("max_batch_size", 0)
    result.setdefault("input", [])
    result.setdefault("output", [])
    return result


def _proto_datatype(pb: Any, tensor: TensorConfig) -> int:
    return int(pb.DataType.Value(CONFIG_NAMES_BY_DATATYPE[tensor.datatype]))


def _message_to_dict(message: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for descriptor, value in message.ListFields():
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            value_field = descriptor.message_type.fields_by_name["value"]
            result[descriptor.name] = {
                key: _message_to_dict(item) if value_field.message_type is not None else item
                for key, item in value.items()
            }
        elif is_repeated(descriptor):
            result[descriptor.name] = [_field_value(descriptor, item) for item in value]
        else:
            result[descriptor.name] = _field_value(descriptor, value)
    return result


def _field_value(descriptor: Any, value: Any) -> Any:
    if descriptor.message_type is not None:
        return _message_to_dict(value)
    if descriptor.enum_type is not None:
        return descriptor.enum_type.values_by_number[value].name
    return value

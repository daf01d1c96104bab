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
    """The configuration as Triton reports it: every field of config.pbtxt (those inferd does not act
    on included: an input's `format`, an output's `label_filename`, `optimization`, ...), with what
    inferd completed or normalised (tensors from the model file, batching, instances) in place."""
    from tritonclient.grpc import model_config_pb2 as pb

    message = pb.ModelConfig.FromString(config.written) if config.written else pb.ModelConfig()
    message.name = config.name
    message.platform = config.platform
    message.backend = config.backend
    message.max_batch_size = config.max_batch_size
    message.default_model_filename = config.default_model_filename
    _set_tensors(pb, message.input, config.inputs, is_input=True)
    _set_tensors(pb, message.output, config.outputs, is_input=False)
    written_groups = list(message.instance_group)
    del message.instance_group[:]
    for index, group in enumerate(config.instance_groups):
        item = message.instance_group.add()
        if index < len(written_groups):
            item.CopyFrom(written_groups[index])  # profile, host_policy, rate_limiter, ... as written
        item.name = item.name or config.name
        item.count = group.count
        item.kind = pb.ModelInstanceGroup.Kind.Value(group.kind.value)
        del item.gpus[:]
        item.gpus.extend(group.gpus)
    versions = config.version_policy
    message.ClearField("version_policy")
    if versions.kind is VersionPolicyKind.ALL:
        message.version_policy.all.SetInParent()
    elif versions.kind is VersionPolicyKind.SPECIFIC:
        message.version_policy.specific.versions.extend(versions.versions)
    else:
        message.version_policy.latest.num_versions = versions.latest_n
    if config.dynamic_batching is not None:
        batching = config.dynamic_batching
        message.dynamic_batching.max_queue_delay_microseconds = batching.max_queue_delay_us
        del message.dynamic_batching.preferred_batch_size[:]
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


def _set_tensors(pb: Any, field: Any, tensors: tuple[TensorConfig, ...], *, is_input: bool) -> None:
    """`field` (the message's input or output list) as inferd has the tensors, each keeping the
    fields it was written with that inferd does not act on (format, label_filename, ...)."""
    written = {item.name: item for item in field}
    messages = []
    for tensor in tensors:
        item = pb.ModelInput() if is_input else pb.ModelOutput()
        if tensor.name in written:
            item.CopyFrom(written[tensor.name])
        item.name = tensor.name
        item.data_type = _proto_datatype(pb, tensor)
        del item.dims[:]
        item.dims.extend(tensor.dims)
        if is_input:
            item.optional = tensor.optional
        item.ClearField("reshape")
        if tensor.reshape is not None:
            item.reshape.shape.extend(tensor.reshape)
        messages.append(item)
    del field[:]
    field.extend(messages)


def _fill_queue_policy(pb: Any, message: Any, policy: QueuePolicy) -> None:
    message.max_queue_size = policy.max_queue_size
    message.default_timeout_microseconds = policy.default_timeout_us
    message.allow_timeout_override = policy.allow_timeout_override
    message.timeout_action = pb.ModelQueuePolicy.REJECT if policy.timeout_action_reject else pb.ModelQueuePolicy.DELAY


def to_json(config: ModelConfig) -> dict[str, Any]:
    """Triton's JSON form: every scalar, enum and list printed even at its default (clients read
    them unconditionally), messages only when set, enums by name, integers as numbers."""
    return _message_to_dict(to_proto(config))


def _proto_datatype(pb: Any, tensor: TensorConfig) -> int:
    return int(pb.DataType.Value(CONFIG_NAMES_BY_DATATYPE[tensor.datatype]))


def _message_to_dict(message: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for descriptor in message.DESCRIPTOR.fields:
        value = getattr(message, descriptor.name)
        repeated = is_repeated(descriptor)
        has_presence = descriptor.containing_oneof is not None or (descriptor.message_type is not None and not repeated)
        if has_presence and not message.HasField(descriptor.name):
            continue  # a message (or a oneof's member) is shown only when set
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            value_field = descriptor.message_type.fields_by_name["value"]
            result[descriptor.name] = {
                key: _message_to_dict(item) if value_field.message_type is not None else item
                for key, item in value.items()
            }
        elif repeated:
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

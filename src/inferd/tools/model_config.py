"""config.pbtxt as the tools write it: Triton's own ModelConfig message (from tritonclient) read from
and written back to protobuf text, so every field a user set survives an edit (optimize renames a
model and points it at a new file; analyze changes batching and instance counts) and what is written
is what Triton and inferd both parse. Checked by inferd's loader before it leaves a tool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.config.loader import CONFIG_FILE_NAME, CONFIG_NAMES_BY_DATATYPE, parse_model_config
from inferd.config.model import ModelConfig
from inferd.types import DataType


@dataclass(frozen=True, slots=True)
class TensorDescription:
    name: str
    datatype: DataType
    dims: tuple[int, ...]
    """Without the batch dimension when the model batches."""


def read_message(model_dir: Path) -> Any:
    """The folder's config.pbtxt as a ModelConfig message (empty when there is none)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    message = pb.ModelConfig()
    path = model_dir / CONFIG_FILE_NAME
    if path.is_file():
        text_format.Parse(path.read_text(encoding="utf-8"), message)
    return message


def new_message(
    name: str,
    platform: str,
    max_batch_size: int,
    inputs: Sequence[TensorDescription] = (),
    outputs: Sequence[TensorDescription] = (),
) -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    message = pb.ModelConfig(name=name, platform=platform, max_batch_size=max_batch_size)
    for target, tensors in ((message.input, inputs), (message.output, outputs)):
        for tensor in tensors:
            entry = target.add(name=tensor.name, dims=list(tensor.dims))
            entry.data_type = pb.DataType.Value(CONFIG_NAMES_BY_DATATYPE[tensor.datatype])
    if max_batch_size > 0:
        message.dynamic_batching.SetInParent()
    return message


def set_batching(
    message: Any,
    *,
    max_batch_size: int | None = None,
    preferred_batch_sizes: Sequence[int] | None = None,
    max_queue_delay_us: int | None = None,
    instances: int | None = None,
) -> None:
    """Change what `inferd analyze` searches over; None leaves a field as it is."""
    if max_batch_size is not None:
        message.max_batch_size = max_batch_size
    if message.max_batch_size == 0:  # a model that does not batch has no batcher to tune
        message.ClearField("dynamic_batching")
    else:
        message.dynamic_batching.SetInParent()
        if preferred_batch_sizes is not None:
            del message.dynamic_batching.preferred_batch_size[:]
            message.dynamic_batching.preferred_batch_size.extend(preferred_batch_sizes)
        if max_queue_delay_us is not None:
            message.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    if instances is not None:
        if not message.instance_group:
            message.instance_group.add()
        for group in message.instance_group:
            group.count = instances


def to_text(message: Any, comment: str = "") -> str:
    from google.protobuf import text_format

    header = "".join(f"# {line}".rstrip() + "\n" for line in comment.splitlines())
    return header + str(text_format.MessageToString(message))


def write(model_dir: Path, message: Any, comment: str = "") -> ModelConfig:
    """Write config.pbtxt, and return it as inferd's loader reads it (a config it refuses raises)."""
    text = to_text(message, comment)
    config = parse_model_config(text, model_name=model_dir.name, source=str(model_dir / CONFIG_FILE_NAME))
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / CONFIG_FILE_NAME).write_text(text, encoding="utf-8")
    return config

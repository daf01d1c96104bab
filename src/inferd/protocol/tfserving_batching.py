"""TF Serving's `batching_parameters` text format (what --batching_parameters_file reads; a path or
an fsspec URL such as s3://...) →
`config.batching.BatchingDefaults`, with TF Serving's defaults for fields left out and each
field's mapping said in words, for the log."""

from __future__ import annotations

import os

from inferd.config.batching import BatchingDefaults
from inferd.errors import ModelConfigError
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.protocol.tfserving_text import read_text_message

# TF's shared_batch_scheduler defaults for fields a file leaves out.
_DEFAULT_MAX_BATCH_SIZE = 1000
_DEFAULT_MAX_ENQUEUED_BATCHES = 10


def read_batching_parameters(path: str) -> tuple[BatchingDefaults, list[str]]:
    """The settings, and one line per field saying what it became in inferd (or that it is ignored)."""
    message = read_text_message(path, serving_pb.BatchingParameters(), "TF Serving batching_parameters file")
    max_batch = message.max_batch_size.value if message.HasField("max_batch_size") else _DEFAULT_MAX_BATCH_SIZE
    timeout = message.batch_timeout_micros.value if message.HasField("batch_timeout_micros") else 0
    enqueued = (
        message.max_enqueued_batches.value
        if message.HasField("max_enqueued_batches")
        else _DEFAULT_MAX_ENQUEUED_BATCHES
    )
    threads = message.num_batch_threads.value if message.HasField("num_batch_threads") else os.cpu_count() or 1
    allowed = tuple(message.allowed_batch_sizes)
    if max_batch < 1 or timeout < 0 or enqueued < 1 or threads < 1:
        raise ModelConfigError(f"{path}: sizes, counts and the timeout must be positive")
    if allowed and (list(allowed) != sorted(set(allowed)) or allowed[0] < 1 or allowed[-1] != max_batch):
        raise ModelConfigError(
            f"{path}: allowed_batch_sizes must be positive, increase and end with max_batch_size ({max_batch}); "
            f"got {list(allowed)}"
        )
    defaults = BatchingDefaults(
        max_batch_size=max_batch,
        max_queue_delay_us=timeout,
        max_queue_size=enqueued * max_batch,
        instances=threads,
        preferred_batch_sizes=allowed,
    )
    mapping = [
        f"max_batch_size {max_batch} -> max_batch_size {max_batch}",
        f"batch_timeout_micros {timeout} -> dynamic_batching max_queue_delay_microseconds {timeout}",
        f"max_enqueued_batches {enqueued} -> max_queue_size {enqueued * max_batch} (batches x max_batch_size; "
        "batches executing not counted, as in TF)",
        f"num_batch_threads {threads} -> instance_group count {threads} (batches run at once)",
    ]
    if allowed:
        mapping.append(
            f"allowed_batch_sizes {list(allowed)} -> preferred_batch_size {list(allowed)} (formed when the queue "
            f'allows) and parameter allowed_batch_sizes "{",".join(map(str, allowed))}" (each batch padded up to '
            "the next, as TF Serving pads it)"
        )
    set_fields = {field.name for field, _ in message.ListFields()}
    for field in ("thread_pool_name", "pad_variable_length_inputs", "enable_large_batch_splitting"):
        if field in set_fields:
            mapping.append(f"{field}: ignored (no inferd equivalent)")
    if message.HasField("max_execution_batch_size"):
        mapping.append("max_execution_batch_size: ignored (inferd never splits a request across batches)")
    return defaults, mapping

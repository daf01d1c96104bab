"""Server-wide batching settings that every batching model takes: how a TF Serving user's
`batching_parameters` file (read by `protocol.tfserving_batching`) carries over onto inferd's
dynamic batcher and instances."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from inferd.config.model import DynamicBatchingConfig, InstanceGroup, ModelConfig
from inferd.config.parameters import ALLOWED_BATCH_SIZES

logger = logging.getLogger("inferd.config")


def batch_sizes(text: str) -> tuple[int, ...]:
    """A list of batch sizes as `allowed_batch_sizes` writes it ("8, 16,32"); ValueError when a
    part is not a whole number."""
    return tuple(int(part) for part in text.replace(" ", "").split(",") if part)


@dataclass(frozen=True, slots=True)
class BatchingDefaults:
    max_batch_size: int
    """The largest batch formed (TF: max_batch_size)."""
    max_queue_delay_us: int
    """How long a batch waits to fill (TF: batch_timeout_micros)."""
    max_queue_size: int
    """Requests waiting at most (TF: max_enqueued_batches x max_batch_size); 0: unbounded. As in TF,
    the batches executing are not counted."""
    instances: int
    """Batches run at once (TF: num_batch_threads) as the model's instance count."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """TF's allowed_batch_sizes: the sizes formed when the queue allows, and (as TF does) every
    batch padded up to the next of them (the model's `allowed_batch_sizes` parameter)."""

    def apply(self, config: ModelConfig) -> ModelConfig:
        """`config` with these settings when its model batches (max_batch_size > 0, not an ensemble,
        which batches through its steps); as it is otherwise."""
        if config.max_batch_size <= 0 or config.ensemble is not None:
            return config
        batching = config.dynamic_batching or DynamicBatchingConfig()
        queue_policy = replace(batching.default_queue_policy, max_queue_size=self.max_queue_size)
        kind = config.instance_groups[0].kind if config.instance_groups else InstanceGroup().kind
        return replace(
            config,
            max_batch_size=self.max_batch_size,
            dynamic_batching=replace(
                batching,
                max_queue_delay_us=self.max_queue_delay_us,
                preferred_batch_sizes=self.preferred_batch_sizes,
                default_queue_policy=queue_policy,
                max_queue_size_includes_executing=False,
            ),
            instance_groups=(InstanceGroup(count=self.instances, kind=kind),),
            parameters=self._padding(config),
        )

    def _padding(self, config: ModelConfig) -> dict[str, str]:
        """The model's parameters with the file's allowed_batch_sizes, which replaces the model's own
        as the file's max_batch_size replaces its (a model's list made for another max_batch_size
        would fail its load; it is dropped, and the log says so). Models whose rows cannot be padded
        (sequences, decoupled models) keep what they had."""
        parameters = dict(config.parameters)
        if config.sequence_batching is not None or config.decoupled:
            return parameters
        own = parameters.pop(ALLOWED_BATCH_SIZES.name, None)
        if self.preferred_batch_sizes:
            parameters[ALLOWED_BATCH_SIZES.name] = ",".join(map(str, self.preferred_batch_sizes))
        elif own is not None and _ends_at(own, self.max_batch_size):
            parameters[ALLOWED_BATCH_SIZES.name] = own
        elif own is not None:
            logger.warning(
                "model %s: its allowed_batch_sizes %r ends below the batching file's max_batch_size %d: dropped",
                config.name,
                own,
                self.max_batch_size,
            )
        return parameters

    def describe(self) -> str:
        return (
            f"max_batch_size {self.max_batch_size}, max_queue_delay_microseconds {self.max_queue_delay_us}, "
            f"max_queue_size {self.max_queue_size or 'unbounded'}, instance_group count {self.instances}"
            + (f", preferred_batch_size {list(self.preferred_batch_sizes)}" if self.preferred_batch_sizes else "")
        )


def _ends_at(text: str, max_batch_size: int) -> bool:
    try:
        sizes = batch_sizes(text)
    except ValueError:
        return True  # kept: the model's load says what is wrong with it
    return bool(sizes) and sizes[-1] == max_batch_size

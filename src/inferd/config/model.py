"""A model's configuration: the subset of Triton's ModelConfig that inferd acts on, as frozen types.

`config.loader` builds these from config.pbtxt; nothing else in inferd sees protobuf.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from inferd.types import DataType


@dataclass(frozen=True, slots=True)
class TensorConfig:
    name: str
    datatype: DataType
    # Dimensions without the batch dimension when the model batches; -1 means any size.
    dims: tuple[int, ...]
    # The shape the runtime receives instead of `dims` (Triton's `reshape`), None when equal.
    reshape: tuple[int, ...] | None = None
    optional: bool = False
    # An output's class labels (Triton's label_filename, relative to the model's folder), one a line;
    # `labels` is filled when a version loads and read by the classification extension.
    label_filename: str = ""
    labels: tuple[str, ...] = field(default=(), compare=False)


class InstanceKind(enum.Enum):
    AUTO = "KIND_AUTO"
    CPU = "KIND_CPU"
    GPU = "KIND_GPU"
    MODEL = "KIND_MODEL"


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    count: int = 1
    kind: InstanceKind = InstanceKind.AUTO
    gpus: tuple[int, ...] = ()


class VersionPolicyKind(enum.Enum):
    LATEST = "latest"
    ALL = "all"
    SPECIFIC = "specific"


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    kind: VersionPolicyKind = VersionPolicyKind.LATEST
    # With LATEST: how many of the highest versions to serve (Triton's default is 1).
    latest_n: int = 1
    # With SPECIFIC: exactly these versions.
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to load out of those present on storage, ascending."""
        ordered = sorted(set(available))
        if self.kind is VersionPolicyKind.ALL:
            return ordered
        if self.kind is VersionPolicyKind.SPECIFIC:
            return [v for v in ordered if v in self.versions]
        return ordered[-self.latest_n :] if self.latest_n > 0 else []


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    max_queue_size: int = 0
    """Requests waiting at most; 0 means unbounded (Triton's default)."""
    default_timeout_us: int = 0
    """Queue timeout in microseconds; 0 means none."""
    timeout_action_reject: bool = True
    allow_timeout_override: bool = False


class ControlKind(enum.Enum):
    START = "CONTROL_SEQUENCE_START"
    READY = "CONTROL_SEQUENCE_READY"
    END = "CONTROL_SEQUENCE_END"
    CORRID = "CONTROL_SEQUENCE_CORRID"


@dataclass(frozen=True, slots=True)
class SequenceControl:
    """An input the sequence batcher fills for the model: a flag (false and true values in the
    input's datatype) or the correlation id."""

    input: str
    kind: ControlKind
    datatype: DataType
    false_value: float | int | bool = 0
    true_value: float | int | bool = 1


@dataclass(frozen=True, slots=True)
class SequenceBatchingConfig:
    """Triton's sequence_batching: a stateful model's requests grouped by correlation id."""

    strategy: str = "direct"
    """"direct": each sequence keeps one batch slot (row) from START to END; "oldest": batches of the
    oldest sequences' next requests, one request a sequence."""
    max_idle_us: int = 1_000_000
    """A sequence without a request this long is ended (max_sequence_idle_microseconds)."""
    controls: tuple[SequenceControl, ...] = ()
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DynamicBatchingConfig:
    max_queue_delay_us: int = 0
    """How long the batcher may hold a request waiting for company, in microseconds (default 0)."""
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    # priority level -> its own queue policy (levels not listed use the default one)
    priority_queue_policies: Mapping[int, QueuePolicy] = field(default_factory=dict)
    max_queue_size_includes_executing: bool = True
    """Whether max_queue_size also counts the requests executing (the model's parameter
    `max_queue_size_includes_executing`; true unless set to "false", or unless the model has
    priority levels): then an admitted request waits for at most that many requests ahead of it.
    Triton's bound ("false": queued ones only) lets it also wait for a whole batch that is
    executing. See core/batcher.py."""

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.priority_queue_policies.get(level, self.default_queue_policy)


class WarmupDataKind(enum.Enum):
    ZERO = "zero"
    RANDOM = "random"
    FILE = "file"


@dataclass(frozen=True, slots=True)
class WarmupInput:
    datatype: DataType
    dims: tuple[int, ...]
    kind: WarmupDataKind
    # With FILE: the file's name under the model's `warmup/` folder.
    file_name: str = ""


@dataclass(frozen=True, slots=True)
class WarmupSample:
    name: str
    batch_size: int
    inputs: Mapping[str, WarmupInput]
    count: int = 1


ENSEMBLE_PLATFORM = "ensemble"
# An ensemble step's `model_version` that means "the version the model serves by default".
LATEST_VERSION = -1


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One model an ensemble calls: which tensors of the ensemble feed it and which it produces."""

    model_name: str
    model_version: int = LATEST_VERSION
    # The step model's input name -> the ensemble tensor that feeds it.
    input_map: Mapping[str, str] = field(default_factory=dict)
    # The step model's output name -> the ensemble tensor it becomes.
    output_map: Mapping[str, str] = field(default_factory=dict)

    @property
    def version_label(self) -> str:
        """The version as a request names it ("" for the default one)."""
        return "" if self.model_version == LATEST_VERSION else str(self.model_version)


@dataclass(frozen=True, slots=True)
class EnsembleConfig:
    """Triton's `ensemble_scheduling`: the steps, in the order the config lists them."""

    steps: tuple[EnsembleStep, ...]

    @property
    def model_names(self) -> tuple[str, ...]:
        """The models the ensemble depends on, each once, in the order of the steps."""
        return tuple(dict.fromkeys(step.model_name for step in self.steps))


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    platform: str = ""
    backend: str = ""
    default_model_filename: str = ""
    max_batch_size: int = 0
    """Largest batch the model accepts; 0 means the model does not batch (shapes are the dims as-is)."""
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    instance_groups: tuple[InstanceGroup, ...] = ()
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    dynamic_batching: DynamicBatchingConfig | None = None
    warmup: tuple[WarmupSample, ...] = ()
    parameters: Mapping[str, str] = field(default_factory=dict)
    # Present when the model is an ensemble (platform "ensemble"): the models it chains.
    ensemble: EnsembleConfig | None = None
    # Triton's model_transaction_policy { decoupled: true }: any number of responses a request, sent
    # as the model makes them (over gRPC's ModelStreamInfer).
    decoupled: bool = False
    sequence_batching: SequenceBatchingConfig | None = None
    # Triton's response_cache { enable: true }: the server's response cache keeps this model's answers.
    response_cache: bool = False
    # Fields present in config.pbtxt that inferd does not act on, reported at load.
    ignored_fields: tuple[str, ...] = ()
    # The configuration as written (Triton's ModelConfig message, serialized), so the configuration
    # API can echo every field, those inferd does not act on included, as Triton does.
    written: bytes = field(default=b"", repr=False, compare=False)
    _inputs_by_name: Mapping[str, TensorConfig] = field(init=False, repr=False, compare=False)
    _outputs_by_name: Mapping[str, TensorConfig] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Lookups by name happen per tensor per request; build the maps once.
        object.__setattr__(self, "_inputs_by_name", {t.name: t for t in self.inputs})
        object.__setattr__(self, "_outputs_by_name", {t.name: t for t in self.outputs})

    def input(self, name: str) -> TensorConfig | None:
        return self._inputs_by_name.get(name)

    def output(self, name: str) -> TensorConfig | None:
        return self._outputs_by_name.get(name)

    def full_shape(self, tensor: TensorConfig) -> tuple[int, ...]:
        """The shape a client sees, with -1 for the batch dimension when the model batches."""
        return (-1, *tensor.dims) if self.max_batch_size > 0 else tensor.dims


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor as a model file declares it: the full shape, -1 (or a symbolic name) for any size."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """What a runtime reads from the model file; completes a missing or partial config."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

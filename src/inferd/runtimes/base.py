"""The runtime contract: what core needs from an execution engine (ONNX Runtime, PyTorch, Python).

A runtime is one loaded session of one model version. `execute` runs one batch that core has
already merged and validated; core splits the outputs back per request, so a runtime never knows
how many requests a batch came from. `execute` is called from a worker thread, one call at a time
per runtime instance (core owns one instance per `instance_group` slot).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from inferd.config.model import InstanceGroup, ModelConfig, ModelSignature


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """How core asks a runtime to be placed."""

    instance_group: InstanceGroup
    intra_op_threads: int
    """Threads one execution may use (instances x threads should fit the cores)."""


class Runtime(Protocol):
    @property
    def signature(self) -> ModelSignature: ...

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch. Raises InvalidRequestError when the engine rejects the inputs themselves."""
        ...

    def close(self) -> None: ...


class RuntimeFactory(Protocol):
    def __call__(self, config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> Runtime: ...

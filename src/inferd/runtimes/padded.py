"""Batches padded up to allowed sizes (`allowed_batch_sizes`, TF Serving's batching parameter).

Some engines pay for every new input shape: ONNX Runtime's CUDA provider sets each convolution up
again whenever the batch size differs from the last run's (on an H100, ResNet-18: 2 ms a run at
a fixed size, 30-130 ms when dynamic batching changes it every run, even for sizes seen before).
Padding every batch to a few sizes, or to one, keeps the shapes the engine has seen. The wrapper
sits around any runtime, so every path to an instance (the dynamic batcher, a lone request,
warm-up) is padded alike.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from inferd.config.batching import batch_sizes
from inferd.config.model import ModelConfig, ModelSignature
from inferd.config.parameters import ALLOWED_BATCH_SIZES
from inferd.errors import ModelConfigError, ModelOutputError
from inferd.runtimes.base import Runtime

# Padding copies a row the client chose: past this many added bytes an execution runs unpadded,
# so that one large row cannot make the server hold max_batch_size copies of it.
MAX_PADDING_BYTES = 64 * 1024 * 1024


def allowed_batch_sizes(config: ModelConfig) -> tuple[int, ...]:
    """The sizes a model's config allows (empty: any), checked as TF Serving checks them."""
    text = config.parameters.get(ALLOWED_BATCH_SIZES.name)
    if text is None:
        return ()
    where = f"model '{config.name}': parameter {ALLOWED_BATCH_SIZES.name} {text!r}"
    try:
        sizes = batch_sizes(text)
    except ValueError:
        raise ModelConfigError(f'{where}: give batch sizes separated by commas, such as "8,16,32"') from None
    if config.max_batch_size <= 0:
        raise ModelConfigError(
            f"{where}: the model does not batch (max_batch_size is 0; it is read before auto-complete, so "
            "set max_batch_size in config.pbtxt)"
        )
    if config.sequence_batching is not None:
        raise ModelConfigError(f"{where}: a sequence batcher's rows are sequences' slots and cannot be padded")
    if config.decoupled:
        raise ModelConfigError(f"{where}: a decoupled model's responses stream per request and cannot be padded")
    if not sizes or sizes[0] < 1 or any(b <= a for a, b in pairwise(sizes)):
        raise ModelConfigError(f"{where}: the sizes must be positive and ascending")
    if sizes[-1] != config.max_batch_size:
        raise ModelConfigError(f"{where}: the last size must be max_batch_size ({config.max_batch_size})")
    return sizes


class PaddedBatches:
    """`runtime`, its batches padded up to the next of `sizes` (copies of the first row); each
    output checked to have the padded batch's rows, then cut back to the rows asked for (a view)."""

    def __init__(self, runtime: Runtime, sizes: Sequence[int], model_name: str = "") -> None:
        self._runtime = runtime
        self._sizes = tuple(sizes)
        self._model_name = model_name

    @property
    def signature(self) -> ModelSignature:
        return self._runtime.signature

    @property
    def may_run_inline(self) -> bool:
        # The inline bound (core.executor) is timed on unpadded inputs: a padded execution does up
        # to max_batch_size times that work, so it never runs on the event loop.
        return False

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        rows = len(next(iter(inputs.values()))) if inputs else 0
        at = bisect.bisect_left(self._sizes, rows)
        if rows == 0 or at == len(self._sizes) or self._sizes[at] == rows:
            return self._runtime.execute(inputs, output_names, deadline_s)
        padded_rows = self._sizes[at]
        extra = padded_rows - rows
        if extra * sum(_row_bytes(array) for array in inputs.values()) > MAX_PADDING_BYTES:
            return self._runtime.execute(inputs, output_names, deadline_s)
        padded = {name: np.concatenate([array, np.repeat(array[:1], extra, axis=0)]) for name, array in inputs.items()}
        results = self._runtime.execute(padded, output_names, deadline_s)
        for name, array in results.items():
            if array.ndim == 0 or array.shape[0] != padded_rows:
                raise ModelOutputError(
                    f"model '{self._model_name}' output '{name}' has shape {list(array.shape)}, but the batch "
                    f"had {padded_rows} rows ({rows} padded up by allowed_batch_sizes): a batching model's outputs "
                    "have the batch as their first dimension"
                )
        return {name: array[:rows] for name, array in results.items()}

    def close(self) -> None:
        self._runtime.close()


def _row_bytes(array: np.ndarray[Any, Any]) -> int:
    """The bytes one row of `array` holds (a BYTES row: its elements' lengths)."""
    if array.dtype == object:
        return sum(len(item) if isinstance(item, (bytes, str)) else 8 for item in array[:1].ravel())
    return int(array[:1].nbytes)

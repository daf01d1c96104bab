"""Batches padded up to allowed sizes: the sizes a config may give, and what the runtime sees."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from inferd.config.loader import parse_model_config
from inferd.config.model import ModelSignature
from inferd.errors import ModelConfigError, ModelOutputError
from inferd.runtimes.padded import MAX_PADDING_BYTES, PaddedBatches, allowed_batch_sizes


class RowsSeen:
    """A runtime answering y = x, which keeps the rows of each execution."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.closed = False

    @property
    def signature(self) -> ModelSignature:
        return ModelSignature(inputs=(), outputs=())

    @property
    def may_run_inline(self) -> bool:
        return True

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        self.rows.append(len(inputs["x"]))
        return {"y": inputs["x"] * 2, "t": inputs["t"]}

    def close(self) -> None:
        self.closed = True


def config(sizes: str, extra: str = "max_batch_size: 8") -> Any:
    text = f'{extra}\nparameters {{ key: "allowed_batch_sizes" value {{ string_value: "{sizes}" }} }}'
    return parse_model_config(text, model_name="m")


def test_each_batch_is_padded_up_to_the_next_allowed_size_and_cut_back() -> None:
    inner = RowsSeen()
    padded = PaddedBatches(inner, allowed_batch_sizes(config("2, 4,8")))
    for rows in (1, 2, 3, 5, 8):
        x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + 1
        texts = np.array([[f"t{i}".encode()] for i in range(rows)], dtype=object)
        out = padded.execute({"x": x, "t": texts}, ["y", "t"])
        np.testing.assert_array_equal(out["y"], x * 2)
        assert out["t"].tolist() == texts.tolist()
    assert inner.rows == [2, 2, 4, 8, 8]
    padded.close()
    assert inner.closed


def test_a_model_without_the_parameter_allows_every_size() -> None:
    assert allowed_batch_sizes(parse_model_config("max_batch_size: 8", model_name="m")) == ()


@pytest.mark.parametrize(
    ("sizes", "extra", "reason"),
    [
        ("4,16", "max_batch_size: 8", "the last size must be max_batch_size (8)"),
        ("8,4,8", "max_batch_size: 8", "positive and ascending"),
        ("0,8", "max_batch_size: 8", "positive and ascending"),
        ("four", "max_batch_size: 8", "separated by commas"),
        ("8", "max_batch_size: 0", "does not batch"),
        ("8", "max_batch_size: 8\nsequence_batching { }", "cannot be padded"),
        ("8", "max_batch_size: 8\nmodel_transaction_policy { decoupled: true }", "cannot be padded"),
    ],
)
def test_sizes_a_model_cannot_use_are_refused_with_the_reason(sizes: str, extra: str, reason: str) -> None:
    with pytest.raises(ModelConfigError, match=re.escape(reason)):
        allowed_batch_sizes(config(sizes, extra))


class Unbatched(RowsSeen):
    """A runtime whose output has no batch dimension: its contract broken."""

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        self.rows.append(len(inputs["x"]))
        return {"y": np.zeros(8, dtype=np.float32)}


def test_outputs_without_the_padded_rows_are_the_models_error_not_cut_to_fit() -> None:
    padded = PaddedBatches(Unbatched(), (4, 8), "m")
    with pytest.raises(ModelOutputError, match="output 'y' has shape \\[8\\], but the batch had 4 rows"):
        padded.execute({"x": np.ones((3, 2), dtype=np.float32)}, ["y"])


def test_a_row_too_large_to_copy_runs_unpadded_and_padding_never_runs_inline() -> None:
    inner = RowsSeen()
    padded = PaddedBatches(inner, (8,), "m")
    big = np.ones((1, MAX_PADDING_BYTES // 4 // 7 + 1), dtype=np.float32)  # 7 copies would pass the bound
    out = padded.execute({"x": big, "t": np.array([[b"a"]], dtype=object)}, ["y"])
    assert inner.rows == [1] and out["y"].shape == big.shape
    assert not padded.may_run_inline

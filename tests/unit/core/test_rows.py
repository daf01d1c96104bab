"""Row merge and split (core.rows), shared by the dynamic batcher and the ensemble."""

from __future__ import annotations

import numpy as np

from inferd.core.rows import fill, merge_arrays, merge_requests, split_arrays, stack_tensors, tensor_rows
from inferd.types import DataType, InferRequest, RequestContext, Tensor


def test_fill_cuts_in_order_within_the_row_budget_and_a_large_item_goes_alone() -> None:
    assert fill([1, 2, 3, 1, 9, 1], lambda rows: rows, 4) == [[1, 2], [3, 1], [9], [1]]
    assert fill([], lambda rows: rows, 4) == []


def test_merge_then_split_gives_each_part_its_own_rows_as_views() -> None:
    parts = [{"x": np.full((rows, 2), float(rows), dtype=np.float32)} for rows in (1, 3, 2)]
    merged = merge_arrays(parts)
    assert merged["x"].shape == (6, 2)
    outputs = {"y": merged["x"] * 2, "z": merged["x"][:, :1]}
    split = split_arrays(outputs, [1, 3, 2], [["y"], ["y", "z"], ["z"]])
    assert [sorted(part) for part in split] == [["y"], ["y", "z"], ["z"]]
    assert split[1]["y"].tolist() == [[6.0, 6.0]] * 3
    assert split[2]["z"].tolist() == [[2.0], [2.0]]
    assert np.shares_memory(split[1]["y"], outputs["y"])  # views, not copies


def test_a_single_part_passes_through_uncopied() -> None:
    part = {"x": np.zeros((2, 2), dtype=np.float32)}
    assert merge_arrays([part]) is part


def test_tensors_stack_by_name_whatever_their_order_and_split_back() -> None:
    a = (Tensor("a", DataType.INT32, (1, 2), np.array([[1, 2]], dtype=np.int32)),
         Tensor("b", DataType.BYTES, (1,), np.array([b"x"], dtype=object)))  # fmt: skip
    b = (Tensor("b", DataType.BYTES, (2,), np.array([b"y", b"z"], dtype=object)),
         Tensor("a", DataType.INT32, (2, 2), np.array([[3, 4], [5, 6]], dtype=np.int32)))  # fmt: skip
    stacked = stack_tensors([a, b], 3)
    assert [(t.name, t.shape) for t in stacked] == [("a", (3, 2)), ("b", (3,))]
    assert stacked[0].data.tolist() == [[1, 2], [3, 4], [5, 6]]
    back = tensor_rows(stacked[1], 1, 3, "renamed")
    assert (back.name, back.shape, back.data.tolist()) == ("renamed", (2,), [b"y", b"z"])


def test_merged_requests_keep_the_first_id_and_the_earliest_deadline() -> None:
    def request(request_id: str, deadline_s: float | None) -> InferRequest:
        x = np.zeros((1, 2), dtype=np.float32)
        context = RequestContext(request_id, deadline_s)
        return InferRequest("m", "", (Tensor("x", DataType.FP32, (1, 2), x),), context=context)

    merged = merge_requests([request("first", None), request("second", 5.0), request("third", 3.0)], 3)
    assert (merged.context.request_id, merged.context.deadline_s, merged.inputs[0].shape) == ("first", 3.0, (3, 2))

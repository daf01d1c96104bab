"""Rows: several requests' inputs merged along the batch dimension, the merged outputs split back,
and arrivals cut into batches that fit a row budget. The one place the dynamic batcher (arrays by
name) and the ensemble (tensors, requests) merge and split.

Merging copies each input once (one concatenate per input); splitting makes views, never copies.
A single part is passed through as it is (no copy): the common case under light load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from inferd.types import InferRequest, RequestContext, Tensor

Arrays = dict[str, np.ndarray[Any, Any]]
Item = TypeVar("Item")


def fill(items: Iterable[Item], rows_of: Callable[[Item], int], max_rows: int) -> list[list[Item]]:
    """`items` in order, cut into batches of at most `max_rows` rows (an item larger than that
    alone in its batch)."""
    batches: list[list[Item]] = []
    rows = max_rows
    for item in items:
        count = rows_of(item)
        if rows + count > max_rows:
            batches.append([])
            rows = 0
        batches[-1].append(item)
        rows += count
    return batches


def merge_arrays(parts: Sequence[Mapping[str, np.ndarray[Any, Any]]]) -> Mapping[str, np.ndarray[Any, Any]]:
    """Inputs of the same names, each part's rows one after the other (the first part's names)."""
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def split_arrays(
    results: Mapping[str, np.ndarray[Any, Any]], rows: Sequence[int], names: Sequence[Sequence[str]]
) -> list[Arrays]:
    """Each part's own rows (views) of the outputs it asked for, `rows[i]` rows for part i."""
    parts: list[Arrays] = []
    start = 0
    for count, wanted in zip(rows, names, strict=True):
        end = start + count
        parts.append({name: results[name][start:end] for name in wanted})
        start = end
    return parts


def tensor_rows(tensor: Tensor, start: int, end: int, name: str | None = None) -> Tensor:
    """Rows `start:end` of `tensor` (a view), named `name` (its own name when None)."""
    data = tensor.data.reshape(tensor.shape)[start:end]
    return Tensor(tensor.name if name is None else name, tensor.datatype, (end - start, *tensor.shape[1:]), data)


def stack_tensors(groups: Sequence[Sequence[Tensor]], rows: int) -> tuple[Tensor, ...]:
    """Tensors of the same names (in any order in each group), each group's rows one after the
    other: `rows` rows in all."""
    stacked = []
    for tensor in groups[0]:
        parts = [_named(group, tensor.name) for group in groups]
        data = np.concatenate([part.data.reshape(part.shape) for part in parts])
        stacked.append(Tensor(tensor.name, tensor.datatype, (rows, *tensor.shape[1:]), data))
    return tuple(stacked)


def merge_requests(requests: Sequence[InferRequest], rows: int) -> InferRequest:
    """One request of `rows` rows: each input the requests' rows one after another. The first
    request's id names it in logs; the earliest deadline holds."""
    first = requests[0]
    deadlines = [r.context.deadline_s for r in requests if r.context.deadline_s is not None]
    context = RequestContext(first.context.request_id, min(deadlines, default=None), first.context.door)
    return InferRequest(
        model_name=first.model_name,
        model_version=first.model_version,
        inputs=stack_tensors([r.inputs for r in requests], rows),
        outputs=first.outputs,
        parameters=first.parameters,
        context=context,
    )


def _named(tensors: Sequence[Tensor], name: str) -> Tensor:
    return next(t for t in tensors if t.name == name)

"""The building blocks of every codec's strategies: the models they aim at, JSON values, tensor
elements of each datatype, shapes, and the mutations that turn a well-formed body into a near miss.

Most generated bodies are close to valid for a real model (`TARGETS`, the models of
`inferd.testing.doors`), so they reach deep into the decoders and the service; the rest are
mutated or arbitrary, so the decoders' refusals are exercised as well.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from inferd.types import DataType, ModelMetadata, TensorMetadata

Strategy = st.SearchStrategy


@dataclass(frozen=True, slots=True)
class Target:
    """A model the strategies aim at: its inputs (name, datatype, dims without the batch)."""

    model: str
    inputs: tuple[tuple[str, DataType, tuple[int, ...]], ...]
    max_batch_size: int

    def metadata(self) -> ModelMetadata:
        """What the TF Serving codec reads the model's inputs from."""
        batch = (-1,) if self.max_batch_size else ()
        tensors = tuple(TensorMetadata(name, dt.value, (*batch, *dims)) for name, dt, dims in self.inputs)
        return ModelMetadata(self.model, ("1",), "onnxruntime_onnx", tensors, ())


TARGETS = (
    Target("add_sub", (("INPUT0", DataType.FP32, (16,)), ("INPUT1", DataType.FP32, (16,))), 8),
    Target("mlp", (("x", DataType.FP32, (16,)),), 32),
    Target("sentence_embedding", (("TEXT", DataType.BYTES, (1,)),), 32),
)
targets = st.sampled_from(TARGETS)


def one_in(draw: st.DrawFn, n: int) -> bool:
    """True once in `n` draws: how often a generated body departs from a valid one. Kept rare per
    choice, so that a body with several choices is still valid often enough to reach the models."""
    return draw(st.integers(0, n - 1)) == 0


@st.composite
def usually(draw: st.DrawFn, common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], n: int = 8) -> Any:
    """`common`'s value, but `rare`'s once in `n` (st.one_of would take each half the time)."""
    return draw(rare) if one_in(draw, n) else draw(common)


# Names a decoder may meet: the targets' own, and others.
TENSOR_NAMES = ("INPUT0", "INPUT1", "x", "TEXT", "y", "OUTPUT0")
names = usually(st.sampled_from(TENSOR_NAMES), st.text(max_size=6), 4)
model_names = usually(st.sampled_from([t.model for t in TARGETS]), st.text(min_size=1, max_size=8), 3)
# A v2 `id` or X-Request-ID: printable text mostly (control characters are refused, rightly).
ids = usually(st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=8), st.text(max_size=8))

# JSON scalars with the edges decoders trip on: integers past 64 bits, floats at their limits, and
# NaN and ±inf, which encode_json writes as the tokens Triton's, TF Serving's and TorchServe's
# clients send (NaN, Infinity, -Infinity).
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


# Header values http.client can send: printable Latin-1, no CR or LF.
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=12)


def encode_json(document: Any) -> bytes:
    """The stdlib's JSON: it writes integers of any size (orjson refuses past 64 bits), and NaN,
    Infinity and -Infinity."""
    return json.dumps(document).encode()


def elements(datatype: DataType) -> Strategy[Any]:
    """JSON values for one element of `datatype`, mostly in range, sometimes just past it."""
    if datatype is DataType.BOOL:
        return st.booleans()
    if datatype is DataType.BYTES:
        return st.text(max_size=12)
    dtype = datatype.numpy_dtype
    if dtype.kind == "f" or datatype is DataType.BF16:
        return st.floats(width=32) | st.integers(-100, 100)
    info = np.iinfo(dtype)
    return st.integers(int(info.min), int(info.max)) | st.sampled_from([int(info.min) - 1, int(info.max) + 1])


# Dimensions: small ones mostly, and the sizes that overflow or cannot be allocated.
EDGE_DIMS = (2**31, 2**32 + 1, 2**62, 2**63 - 1)
dims = st.integers(0, 6) | st.sampled_from(EDGE_DIMS) | st.integers(-3, -1)


def shapes(max_rank: int = 4) -> Strategy[list[int]]:
    return st.lists(dims, max_size=max_rank)


def element_count(shape: list[int]) -> int:
    return math.prod(shape) if all(d >= 0 for d in shape) else -1


def small_count(shape: list[int]) -> bool:
    """Whether a generated body can hold every element of `shape` (the rest get a few)."""
    return 0 <= element_count(shape) <= 64


@st.composite
def target_shape(draw: st.DrawFn, target: Target, dims_: tuple[int, ...]) -> list[int]:
    """A shape for one of `target`'s inputs: right (batch 1 to 3) most of the time, else anything."""
    if one_in(draw, 12):
        return draw(shapes())
    batch = [draw(st.integers(1, 3))] if target.max_batch_size else []
    return [*batch, *dims_]


@st.composite
def tensor_data(draw: st.DrawFn, datatype: DataType, shape: list[int]) -> list[Any]:
    """A flat list of the shape's element count (or a few elements when it is too large or wrong)."""
    count = element_count(shape) if small_count(shape) else draw(st.integers(0, 3))
    if one_in(draw, 20):
        count = max(0, count + draw(st.sampled_from([-1, 1])))
    return draw(st.lists(elements(datatype), min_size=count, max_size=count))


@st.composite
def array_bytes(draw: st.DrawFn, datatype: DataType, shape: list[int]) -> bytes:
    """The little-endian bytes of a tensor (BYTES: each element's 4-byte length, then it); the
    right size for its shape most of the time, else a few bytes more or less."""
    count = element_count(shape) if small_count(shape) else draw(st.integers(0, 3))
    if datatype is DataType.BYTES:
        items = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
        raw = b"".join(len(item).to_bytes(4, "little") + item for item in items)
    else:
        raw = draw(st.binary(min_size=count * datatype.itemsize, max_size=count * datatype.itemsize))
    if one_in(draw, 12):
        cut = draw(st.integers(1, 5))
        raw = raw[:-cut] if draw(st.booleans()) else raw + b"\x00" * cut
    return raw


@st.composite
def mutated(draw: st.DrawFn, document: Any) -> Any:
    """`document`, or (one time in eight) with one key dropped or its value replaced by any JSON,
    or replaced whole."""
    kind = draw(st.integers(0, 23))
    if kind > 2 or not isinstance(document, dict) or not document:
        return document if kind != 0 else draw(json_values)
    key = draw(st.sampled_from(sorted(document)))
    changed = dict(document)
    if kind == 1:
        del changed[key]
    else:
        changed[key] = draw(json_values)
    return changed

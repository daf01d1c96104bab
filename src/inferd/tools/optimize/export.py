"""PyTorch → ONNX for `inferd optimize`: a torch.export program (model.pt2), a TorchScript file
(model.pt) or a Hugging Face model folder, exported with a dynamic batch dimension (and, for
transformers, a dynamic sequence length) so the result batches on the server. torch, transformers
and onnxscript are imported only here, only when such a source is given.

A sentence-transformers folder (modules.json naming a mean Pooling, optionally a Normalize) gets its
pooling inside the graph: output `sentence_embedding` beside `last_hidden_state`, the same math
`SentenceTransformer.encode` runs. The exported graph is checked against PyTorch before it is kept."""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OPSET = 18  # the dynamo exporter's native opset: no version conversion step
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
EXPORT_CHECK_SENTENCES = (
    "inferd serves models fast",
    "A man is playing a guitar on the stage.",
    "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun.",
)
# float32 through a transformer's layers: an export must match PyTorch to well within this.
MAX_EXPORT_DIFF = 1e-4
MAX_BATCH = 4096


class ExportError(Exception):
    """The source could not be exported, or its export does not compute what PyTorch computes."""


@dataclass(frozen=True, slots=True)
class HuggingFaceExport:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    hidden_size: int
    max_diff: float
    """Largest |diff| between ONNX Runtime and PyTorch on EXPORT_CHECK_SENTENCES."""


def is_hugging_face_folder(path: Path) -> bool:
    return (
        path.is_dir()
        and (path / "config.json").is_file()
        and any((path / name).is_file() for name in ("model.safetensors", "pytorch_model.bin"))
    )


def export_hugging_face(folder: Path, output: Path) -> HuggingFaceExport:
    """A transformer encoder (BERT-class) from its folder: inputs the tokenizer's ids, outputs
    `last_hidden_state` (and `sentence_embedding` for a sentence-transformers folder)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    torch.manual_seed(0)
    # Eager attention: plain MatMul/Softmax in the graph, the math PyTorch runs on the CPU.
    encoder = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    accepted = inspect.signature(encoder.forward).parameters  # follows transformers' decorators
    inputs = tuple(name for name in TOKEN_INPUTS if name in accepted)
    if "input_ids" not in inputs:
        raise ExportError(f"{folder}: not a text encoder (its forward takes {list(accepted)})")
    pooling = _sentence_pooling(folder)
    wrapper = _sentence_encoder(encoder, inputs, pooling)
    outputs = ("last_hidden_state",) if pooling is None else ("last_hidden_state", "sentence_embedding")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    positions = int(json.loads((folder / "config.json").read_text()).get("max_position_embeddings", 512))
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    sequence = torch.export.Dim("sequence", min=2, max=positions)
    example = _tokenized(tokenizer, EXPORT_CHECK_SENTENCES[:2], inputs)
    output.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad(), _export_errors():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            (),
            str(output),
            kwargs={name: torch.from_numpy(example[name]) for name in inputs},
            input_names=list(inputs),
            output_names=list(outputs),
            opset_version=OPSET,
            dynamo=True,
            dynamic_shapes={name: {0: batch, 1: sequence} for name in inputs},
            external_data=False,
            verbose=False,
        )
    feeds = _tokenized(tokenizer, EXPORT_CHECK_SENTENCES, inputs)
    with torch.no_grad():
        expected = wrapper(**{name: torch.from_numpy(feeds[name]) for name in inputs})
    expected = [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
    max_diff = _check_against(output, feeds, outputs, expected)
    return HuggingFaceExport(inputs, outputs, int(expected[0].shape[-1]), max_diff)


def export_torch(source: Path, output: Path, inputs: Sequence[str], outputs: Sequence[str],
                 examples: dict[str, np.ndarray[Any, Any]], batched: bool) -> float:  # fmt: skip
    """A torch.export program or TorchScript file, its inputs and outputs named as inferd serves
    them; `examples` (batch of 2 when `batched`) trace it and check the export. Returns the largest
    |diff| between ONNX Runtime and PyTorch on them."""
    import torch

    arguments = tuple(torch.from_numpy(examples[name]) for name in inputs)
    output.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad(), _export_errors():
        warnings.simplefilter("ignore")
        if source.suffix == ".pt2":
            program = torch.export.load(str(source))
            module = program.module()
            # The program carries its own dynamic dimensions.
            torch.onnx.export(program, (), str(output), input_names=list(inputs), output_names=list(outputs),
                              opset_version=OPSET, dynamo=True, external_data=False, verbose=False)  # fmt: skip
        else:
            module = torch.jit.load(str(source))  # type: ignore[no-untyped-call]
            axes = {name: {0: "batch"} for name in (*inputs, *outputs)} if batched else None
            torch.onnx.export(module, arguments, str(output), input_names=list(inputs), output_names=list(outputs),
                              opset_version=17, dynamo=False, dynamic_axes=axes)  # fmt: skip
        expected = module(*arguments)
    expected_arrays = [t.numpy() for t in (expected if isinstance(expected, tuple | list) else (expected,))]
    return _check_against(output, examples, outputs, expected_arrays)


@contextmanager
def _export_errors() -> Iterator[None]:
    """torch.onnx.export's failures (pages of advice) as one line naming the cause."""
    try:
        yield
    except ExportError:
        raise
    except Exception as exc:
        cause: BaseException = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        summary = " ".join(str(cause).split())[:300]
        raise ExportError(f"torch.onnx.export failed: {type(cause).__name__}: {summary}") from exc


def _check_against(
    path: Path, feeds: dict[str, np.ndarray[Any, Any]], outputs: Sequence[str], expected: list[np.ndarray[Any, Any]]
) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(list(outputs), feeds)
    worst = max(float(np.max(np.abs(g - e))) if g.size else 0.0 for g, e in zip(got, expected, strict=True))
    if worst > MAX_EXPORT_DIFF:
        raise ExportError(f"the ONNX export differs from PyTorch by {worst:.3g} (> {MAX_EXPORT_DIFF:g})")
    return worst


def _sentence_pooling(folder: Path) -> str | None:
    """'normalize' or 'mean' for a sentence-transformers folder with mean pooling, else None."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    types = {module["type"].rsplit(".", 1)[-1]: module.get("path", "") for module in modules}
    if "Pooling" not in types:
        return None
    pooling = json.loads((folder / types["Pooling"] / "config.json").read_text())
    if not pooling.get("pooling_mode_mean_tokens"):
        raise ExportError(f"{folder}: only mean pooling is exported (pooling config {pooling})")
    return "normalize" if "Normalize" in types else "mean"


def _sentence_encoder(encoder: Any, inputs: Sequence[str], pooling: str | None, answers: Any = None) -> Any:
    """The encoder as inferd serves it: token inputs (the encoder's of TOKEN_INPUTS, in that order),
    `last_hidden_state`, and for a sentence-transformers folder (`pooling`) `sentence_embedding`
    beside it, the math `SentenceTransformer.encode` runs. `answers`: the dtype its outputs are cast
    to (a port computing in bfloat16 still answers float32); None: the encoder's own."""
    import torch

    class SentenceEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> Any:
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            arguments = {name: given[name] for name in inputs}
            hidden = self.encoder(**arguments).last_hidden_state
            if pooling is None:
                return hidden if answers is None else hidden.to(answers)
            # sentence_transformers.models.Pooling (mean over the mask) ...
            mask = arguments["attention_mask"].unsqueeze(-1).expand(hidden.size()).to(hidden.dtype)
            pooled = torch.sum(hidden * mask, 1) / torch.clamp(mask.sum(1), min=1e-9)
            # ... then Normalize when the folder has it.
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1) if pooling == "normalize" else pooled
            return (hidden, pooled) if answers is None else (hidden.to(answers), pooled.to(answers))

    return SentenceEncoder().eval()


def _tokenized(tokenizer: Any, sentences: Sequence[str], inputs: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch(list(sentences))
    columns = {
        "input_ids": [e.ids for e in encodings],
        "attention_mask": [e.attention_mask for e in encodings],
        "token_type_ids": [e.type_ids for e in encodings],
    }
    return {name: np.array(columns[name], dtype=np.int64) for name in inputs}


# ONNX opset of tf2onnx's conversions: 17 is its newest tested (tf2onnx 1.17), which every
# candidate's tools (ONNX Runtime's transformer optimizer, quantization) take.
TF2ONNX_OPSET = 17
TF2ONNX_TIMEOUT_S = 1800


def _onnx_ops() -> frozenset[str]:
    import onnx.defs

    return frozenset(schema.name for schema in onnx.defs.get_all_schemas_with_history() if schema.domain == "")


def convert_saved_model(folder: Path, output: Path, signature: str, tag: str) -> None:
    """A TensorFlow SavedModel's `signature` (of the MetaGraph tagged `tag`) to ONNX with
    tf2onnx's --saved-model path, its tensors named as the signature names them (as inferd serves
    the SavedModel). Run as tf2onnx's own command, in a process of its own: TensorFlow and its
    converter stay out of this one."""
    import subprocess
    import sys

    output.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(folder), "--output", str(output),
               "--signature_def", signature, "--tag", tag, "--opset", str(TF2ONNX_OPSET)]  # fmt: skip
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=TF2ONNX_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ExportError(f"tf2onnx did not convert {folder} within {TF2ONNX_TIMEOUT_S} s") from None
    if completed.returncode != 0 or not output.is_file():
        said = [line for line in completed.stderr.splitlines() if line.strip()][-8:]
        hint = " (pip install 'inferd[tensorflow]')" if "No module named" in completed.stderr else ""
        raise ExportError(f"tf2onnx could not convert {folder}{hint}:\n" + "\n".join(said))
    # tf2onnx keeps an op it cannot convert as a TensorFlow op and still succeeds: name them.
    import onnx

    left = sorted({node.op_type for node in onnx.load(str(output), load_external_data=False).graph.node
                   if node.domain == "" and node.op_type not in _onnx_ops()})  # fmt: skip
    if left:
        output.unlink()
        raise ExportError(
            f"tf2onnx converted {folder} but left TensorFlow ops ONNX has not: {', '.join(left)} "
            f"(tf.nn.gelu's exact form is an Erfc, for one; its tanh approximation converts)"
        )


def export_hugging_face_torch(folder: Path, output: Path, dtype: str = "bfloat16") -> tuple[str, ...]:
    """A transformer encoder (BERT-class) from its folder as a torch.export program (model.pt2)
    that computes in `dtype` (bfloat16: the BF16 port the published precision check compared),
    its token inputs INT64 and its outputs float32, so that clients, configs and `inferd validate`
    see a drop-in for the FP32 model. Returns its outputs' names, in order (`last_hidden_state`,
    and `sentence_embedding` for a sentence-transformers folder), for its config to name them."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    torch.manual_seed(0)
    precision = getattr(torch, dtype)
    encoder = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval().to(precision)
    accepted = inspect.signature(encoder.forward).parameters
    inputs = tuple(name for name in TOKEN_INPUTS if name in accepted)
    pooling = _sentence_pooling(folder)

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    positions = int(json.loads((folder / "config.json").read_text()).get("max_position_embeddings", 512))
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    sequence = torch.export.Dim("sequence", min=2, max=positions)
    example = _tokenized(tokenizer, EXPORT_CHECK_SENTENCES[:2], inputs)
    with warnings.catch_warnings(), torch.no_grad(), _export_errors():
        warnings.simplefilter("ignore")
        program = torch.export.export(  # positional: inferd's PyTorch runtime passes the inputs in order
            _sentence_encoder(encoder, inputs, pooling, answers=torch.float32),
            tuple(torch.from_numpy(example[name]) for name in inputs),  # the encoder's own: no unused input
            dynamic_shapes={name: {0: batch, 1: sequence} for name in inputs},
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(output))
    return ("last_hidden_state",) if pooling is None else ("last_hidden_state", "sentence_embedding")

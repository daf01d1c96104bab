"""The candidates `inferd optimize` builds, each a function that fills a version folder. Most start
from the FP32 ONNX model, with ONNX Runtime's own tools doing the work:

* `fp32`         the model itself (its batch dimension made dynamic if it was fixed);
* `ort`          ONNX Runtime's offline graph optimization (constant folding, node fusions) saved;
* `transformer`  onnxruntime.transformers' optimizer (attention, LayerNorm, GELU fusions) for
                 BERT-class models (those with an `input_ids` input);
* `fp16`         weights and compute in float16, inputs and outputs kept float32 (clients and
                 configs unchanged), from the transformer-optimized graph when there is one;
* `int8-dynamic` weights int8 per channel, activations quantized on the fly (MatMuls with constant
                 weights only: quantizing activation-by-activation products costs accuracy);
* `int8-static`  weights and activations int8 (QDQ), activation ranges calibrated on a sample file.

Two stay in the source's framework and compute in bfloat16 where the CPU has bfloat16 arithmetic,
served with the MIXED_PRECISION parameter:

* `bf16-tf`      a SavedModel, rewritten by grappler's oneDNN bfloat16 auto mixed precision;
* `bf16-torch`   a PyTorch model (a Hugging Face folder's as a torch.export program) under autocast.

A build that has nothing to do (no MatMul to quantize, a source of another framework) raises
`NotApplicable`, reported as skipped."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

Precision = Literal["fp32", "fp16", "bf16", "int8"]
Framework = Literal["onnx", "tensorflow", "pytorch", "hugging-face"]
"""What the source is: a candidate in the source's framework runs there (onnx: any source, through
its FP32 ONNX model)."""
ONNX_FILE = "model.onnx"
SAVEDMODEL_FOLDER = "model.savedmodel"
Samples = list[dict[str, np.ndarray[Any, Any]]]


class NotApplicable(Exception):
    """This candidate does not apply to the model (the reason is reported)."""


@dataclass(frozen=True, slots=True)
class BuildContext:
    source: Path
    """The FP32 ONNX model every candidate starts from."""
    work: Path
    """A scratch folder for intermediate files."""
    calibration: Samples | None
    model_type: str
    """onnxruntime.transformers' model type (bert, roberta, ...) for the transformer optimizer."""
    original: Path | None = None
    """The source as given: a SavedModel folder, a .pt / .pt2 file, a Hugging Face folder."""
    framework: Framework = "onnx"


@dataclass(frozen=True, slots=True)
class CandidateKind:
    name: str
    precision: Precision
    build: Callable[[BuildContext, Path], None]
    """Fills the (empty) version folder it is given."""
    description: str
    framework: Framework = "onnx"
    """The framework the candidate runs in: onnx ones apply to every source, the others to theirs."""

    def applies_to(self, source: Framework) -> bool:
        return self.framework == "onnx" or self.framework == source or (
            self.framework == "pytorch" and source == "hugging-face"
        )  # fmt: skip


def build_fp32(context: BuildContext, version: Path) -> None:
    import onnx

    output = version / ONNX_FILE
    model = onnx.load(str(context.source))
    if make_batch_dynamic(model):
        onnx.save(model, str(output))
    else:
        shutil.copyfile(context.source, output)


def build_ort(context: BuildContext, version: Path) -> None:
    import onnxruntime as ort

    output = version / ONNX_FILE
    options = ort.SessionOptions()
    # EXTENDED, not ALL: ALL adds layout changes for this machine's CPU, which a saved model must not keep.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(output)
    ort.InferenceSession(str(context.source), options, providers=["CPUExecutionProvider"])


def build_transformer(context: BuildContext, version: Path) -> None:
    _transformer_optimized(context).save_model_to_file(str(version / ONNX_FILE))


def build_fp16(context: BuildContext, version: Path) -> None:
    if _is_transformer(context):
        model = _transformer_optimized(context)
    else:
        import onnx
        from onnxruntime.transformers.onnx_model import OnnxModel

        model = OnnxModel(onnx.load(str(context.source)))
    if not any(_is_float32(t) for t in model.model.graph.initializer):
        raise NotApplicable("the model has no float32 weights")
    with _quiet():
        model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(version / ONNX_FILE))


def build_int8_dynamic(context: BuildContext, version: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _needs_weight_matmul(context.source)
    with _quiet():
        quantize_dynamic(str(context.source), str(version / ONNX_FILE), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True})  # fmt: skip


def build_int8_static(context: BuildContext, version: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    if not context.calibration:
        raise NotApplicable("no calibration samples (--calibration FILE)")
    _needs_weight_matmul(context.source)
    samples = context.calibration

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._samples = iter(samples)

        def get_next(self) -> dict[str, np.ndarray[Any, Any]] | None:
            return next(self._samples, None)

    with _quiet():
        quantize_static(
            str(context.source), str(version / ONNX_FILE), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm", "Conv"], extra_options={"MatMulConstBOnly": True},
        )  # fmt: skip


def build_bf16_tf(context: BuildContext, version: Path) -> None:
    _needs_bfloat16_arithmetic()
    assert context.original is not None
    shutil.copytree(context.original, version / SAVEDMODEL_FOLDER)


def build_bf16_torch(context: BuildContext, version: Path) -> None:
    from inferd.runtimes.pytorch import EXPORTED_FILENAME, TORCHSCRIPT_FILENAME
    from inferd.tools.optimize.export import export_hugging_face_torch

    _needs_bfloat16_arithmetic()
    assert context.original is not None
    if context.framework == "hugging-face":  # float32 weights, as the source's: autocast computes in bfloat16
        export_hugging_face_torch(context.original, version / EXPORTED_FILENAME, "float32")
    else:
        name = EXPORTED_FILENAME if context.original.suffix == ".pt2" else TORCHSCRIPT_FILENAME
        shutil.copyfile(context.original, version / name)


def _needs_bfloat16_arithmetic() -> None:
    from inferd.runtimes.base import cpu_computes_bfloat16

    if not cpu_computes_bfloat16():
        raise NotApplicable(
            "this CPU has no bfloat16 arithmetic (AVX512-BF16 or AMX): bfloat16 would be slower than float32 here"
        )


CANDIDATES: dict[str, CandidateKind] = {
    kind.name: kind
    for kind in (
        CandidateKind("fp32", "fp32", build_fp32, "the model as given, batch dimension dynamic"),
        CandidateKind("ort", "fp32", build_ort, "ONNX Runtime offline graph optimization (extended)"),
        CandidateKind("transformer", "fp32", build_transformer, "onnxruntime.transformers fusions (BERT-class)"),
        CandidateKind("fp16", "fp16", build_fp16, "float16 weights and compute, float32 inputs and outputs"),
        CandidateKind("int8-dynamic", "int8", build_int8_dynamic, "int8 weights per channel, dynamic activations"),
        CandidateKind("int8-static", "int8", build_int8_static, "int8 weights and activations (QDQ), calibrated"),
        CandidateKind(
            "bf16-tf", "bf16", build_bf16_tf, "the SavedModel, oneDNN bfloat16 mixed precision", "tensorflow"
        ),
        CandidateKind("bf16-torch", "bf16", build_bf16_torch, "the PyTorch model under bfloat16 autocast", "pytorch"),
    )
}


def make_batch_dynamic(model: Any) -> bool:
    """Give every graph input and output a symbolic first dimension when all of them have the same
    fixed one (an export traced at batch 1); True when the model changed. Intermediate shapes
    recorded for the fixed batch are dropped so ONNX Runtime infers them again."""
    values = [*model.graph.input, *model.graph.output]
    initializers = {t.name for t in model.graph.initializer}
    values = [v for v in values if v.name not in initializers]
    firsts = {
        v.type.tensor_type.shape.dim[0].dim_value if v.type.tensor_type.shape.dim else None
        for v in values
        if v.type.HasField("tensor_type")
    }
    if len(firsts) != 1 or not next(iter(firsts)):  # already symbolic, unranked or mixed
        return False
    for value in values:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]
    return True


def _is_transformer(context: BuildContext) -> bool:
    import onnx

    graph = onnx.load(str(context.source), load_external_data=False).graph
    return any(value.name == "input_ids" for value in graph.input)


def _transformer_optimized(context: BuildContext) -> Any:
    """The transformer optimizer's model for this source (a fresh copy each call: fp16 converts in place)."""
    if not _is_transformer(context):
        raise NotApplicable("not a BERT-class model (no input_ids input)")
    import onnx
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.onnx_model import OnnxModel

    saved = context.work / "transformer-optimized.onnx"
    if not saved.exists():
        with _quiet():
            model = optimizer.optimize_model(str(context.source), model_type=context.model_type, num_heads=0,
                                             hidden_size=0, opt_level=1, use_gpu=False)  # fmt: skip
        model.save_model_to_file(str(saved))
    return OnnxModel(onnx.load(str(saved)))


def _needs_weight_matmul(path: Path) -> None:
    import onnx

    graph = onnx.load(str(path)).graph
    weights = {t.name for t in graph.initializer}
    if not any(node.op_type in ("MatMul", "Gemm", "Conv") and node.input[1] in weights for node in graph.node):
        raise NotApplicable("no MatMul, Gemm or Conv with constant weights to quantize")


def _is_float32(tensor: Any) -> bool:
    return int(tensor.data_type) == 1  # onnx.TensorProto.FLOAT


@contextmanager
def _quiet() -> Iterator[None]:
    """ONNX Runtime's Python tools log advice at WARNING on the root logger; optimize reports itself."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)

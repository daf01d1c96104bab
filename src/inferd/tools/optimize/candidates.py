"""The candidates `inferd optimize` builds from an FP32 ONNX model, each a function from the source
file to a new file, with ONNX Runtime's own tools doing the work:

* `fp32`         the model itself (its batch dimension made dynamic if it was fixed);
* `ort`          ONNX Runtime's offline graph optimization (constant folding, node fusions) saved;
* `transformer`  onnxruntime.transformers' optimizer (attention, LayerNorm, GELU fusions) for
                 BERT-class models (those with an `input_ids` input);
* `fp16`         weights and compute in float16, inputs and outputs kept float32 (clients and
                 configs unchanged), from the transformer-optimized graph when there is one;
* `int8-dynamic` weights int8 per channel, activations quantized on the fly (MatMuls with constant
                 weights only: quantizing activation-by-activation products costs accuracy);
* `int8-static`  weights and activations int8 (QDQ), activation ranges calibrated on a sample file.

A build that has nothing to do (no MatMul to quantize) raises `NotApplicable`, reported as skipped."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

Precision = Literal["fp32", "fp16", "int8"]
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


@dataclass(frozen=True, slots=True)
class CandidateKind:
    name: str
    precision: Precision
    build: Callable[[BuildContext, Path], None]
    description: str


def build_fp32(context: BuildContext, output: Path) -> None:
    import onnx

    model = onnx.load(str(context.source))
    if make_batch_dynamic(model):
        onnx.save(model, str(output))
    else:
        shutil.copyfile(context.source, output)


def build_ort(context: BuildContext, output: Path) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # EXTENDED, not ALL: ALL adds layout changes for this machine's CPU, which a saved model must not keep.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(output)
    ort.InferenceSession(str(context.source), options, providers=["CPUExecutionProvider"])


def build_transformer(context: BuildContext, output: Path) -> None:
    _transformer_optimized(context).save_model_to_file(str(output))


def build_fp16(context: BuildContext, output: Path) -> None:
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
    model.save_model_to_file(str(output))


def build_int8_dynamic(context: BuildContext, output: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _needs_weight_matmul(context.source)
    with _quiet():
        quantize_dynamic(str(context.source), str(output), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True})  # fmt: skip


def build_int8_static(context: BuildContext, output: Path) -> None:
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
            str(context.source), str(output), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm", "Conv"], extra_options={"MatMulConstBOnly": True},
        )  # fmt: skip


CANDIDATES: dict[str, CandidateKind] = {
    kind.name: kind
    for kind in (
        CandidateKind("fp32", "fp32", build_fp32, "the model as given, batch dimension dynamic"),
        CandidateKind("ort", "fp32", build_ort, "ONNX Runtime offline graph optimization (extended)"),
        CandidateKind("transformer", "fp32", build_transformer, "onnxruntime.transformers fusions (BERT-class)"),
        CandidateKind("fp16", "fp16", build_fp16, "float16 weights and compute, float32 inputs and outputs"),
        CandidateKind("int8-dynamic", "int8", build_int8_dynamic, "int8 weights per channel, dynamic activations"),
        CandidateKind("int8-static", "int8", build_int8_static, "int8 weights and activations (QDQ), calibrated"),
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

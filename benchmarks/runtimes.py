#!/usr/bin/env python3
"""The Python runtime against ONNX Runtime on the same work: the tiny model (an MLP 16 → 64 → 4)
served as an ONNX file and as a model.py computing it with numpy from the same weights, both from
one inferd with dynamic batching, measured with wrk in turns, in ONE run.

    .venv/bin/python benchmarks/runtimes.py [--seconds 5] [--rounds 3]

Target (issue 12): the Python model within 10% of the ONNX one (no copy, no process hop: what
Triton's Python backend costs its users 6-8x). Throughput at concurrency 16, p50 at 1; the median
of the rounds counts. Needs wrk.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import Measurement, tiny_model, wrk

from inferd.testing.models import mlp_model, python_model, write_config
from inferd.testing.server import run_server

console = Console()

# The ONNX file's weights, read back, so that both models compute the same function.
MLP_IN_NUMPY = """
import numpy as np


class Model:
    may_run_inline = {may_run_inline}
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]

    def initialize(self, args):
        weights = np.load(args["version_dir"] + "/weights.npz")
        self.w1, self.b1, self.w2, self.b2 = (weights[k] for k in ("w1", "b1", "w2", "b2"))

    def execute(self, inputs):
        hidden = np.maximum(inputs["x"] @ self.w1 + self.b1, 0)
        return {"y": hidden @ self.w2 + self.b2}
"""
CONFIG = "max_batch_size: 32\ndynamic_batching { }"
# python_mlp runs on worker threads (the default for Python models); python_mlp_inline declares
# `may_run_inline = True`, so that, like the ONNX model, it runs on the event loop while fast.
MODELS = ("onnx_mlp", "python_mlp", "python_mlp_inline")


def build(root: Path) -> None:
    import onnx
    from onnx import numpy_helper

    mlp_model(root / "onnx_mlp" / "1" / "model.onnx", sizes=(16, 64, 4), seed=0)
    write_config(root / "onnx_mlp", CONFIG)
    graph = onnx.load(str(root / "onnx_mlp" / "1" / "model.onnx")).graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    nodes = [n for n in graph.node if n.op_type == "Gemm"]
    if len(nodes) != 2:
        raise RuntimeError(f"expected two Gemm nodes, found {[n.op_type for n in graph.node]}")
    arrays = {}
    for index, node in enumerate(nodes, start=1):
        w, b = weights[node.input[1]], weights[node.input[2]]
        trans_b = any(a.name == "transB" and a.i == 1 for a in node.attribute)
        arrays[f"w{index}"], arrays[f"b{index}"] = (w.T if trans_b else w), b
    for name, inline in (("python_mlp", False), ("python_mlp_inline", True)):
        python_model(root / name / "1", MLP_IN_NUMPY.replace("{may_run_inline}", str(inline)))
        np.savez(root / name / "1" / "weights.npz", **arrays)
        write_config(root / name, CONFIG)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    body = tiny_model().v2_json()
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        build(scratch / "repository")
        with run_server(scratch / "repository", scratch / "server.log") as server:
            import tritonclient.http as httpclient

            # Same answers first: the comparison is of the same work.
            x = tiny_model().inputs["x"]
            with httpclient.InferenceServerClient(server.http_url) as client:
                answers = []
                for model in MODELS:
                    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x)
                    answers.append(client.infer(model, [tensor]).as_numpy("y"))
            for answer in answers[1:]:
                np.testing.assert_allclose(answer, answers[0], rtol=1e-5, atol=1e-6)
            results: dict[tuple[str, int], list[Measurement]] = {}
            with console.status("measuring in turns") as status:
                for round_index in range(args.rounds):
                    for concurrency in (1, 16):
                        for model in MODELS:
                            status.update(f"round {round_index + 1}/{args.rounds}: {model}, concurrency {concurrency}")
                            url = f"http://{server.http_url}/v2/models/{model}/infer"
                            m = wrk(url, body, concurrency, args.seconds, scratch)
                            results.setdefault((model, concurrency), []).append(m)
    table = Table(title=f"tiny MLP: Python model vs ONNX, one inferd, wrk in turns, median of {args.rounds} rounds")
    for column in ("model", "c=16 inferences/s", "c=1 p50 us", "c=16 p50 us", "throughput / ONNX"):
        table.add_column(column, justify="left" if column == "model" else "right")
    onnx_rate = statistics.median(m.throughput for m in results[("onnx_mlp", 16)])
    for model in MODELS:
        rate = statistics.median(m.throughput for m in results[(model, 16)])
        p50_1 = statistics.median(m.p50_us for m in results[(model, 1)])
        p50_16 = statistics.median(m.p50_us for m in results[(model, 16)])
        table.add_row(model, f"{rate:,.0f}", f"{p50_1:.0f}", f"{p50_16:.0f}", f"{rate / onnx_rate:.3f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A convolutional model on ONNX Runtime's CUDA provider under dynamic batching: the default
cuDNN search, HEURISTIC, and batches padded to `allowed_batch_sizes`, against the same network as
TorchScript on the GPU. Needs a GPU, onnxruntime-gpu (with its CUDA and cuDNN wheels), torch and
torchvision (ResNet-18, seeded random weights):

    python benchmarks/gpu_batch_sizes.py [--seconds 4] [--clients 16]

Single-image requests over gRPC (tritonclient) from `--clients` threads of this process, twice
each (the first pass meets new batch sizes), then from one thread. The client is Python: the top
figures may be the client's limit, not the server's; the ratios between configs are the point.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from inferd.testing.models import write_config
from inferd.testing.server import run_server

console = Console()
BATCHING = "max_batch_size: 32\ndynamic_batching { max_queue_delay_microseconds: 500 }\n"
GPU = "instance_group [ { count: 1 kind: KIND_GPU } ]\n"
WARM_16 = (
    'model_warmup [ { name: "b16" batch_size: 16 inputs { key: "input" value { data_type: TYPE_FP32 '
    "dims: [ 3, 224, 224 ] zero_data: true } } } ]\n"
)


def parameter(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


ONNX_VARIANTS = {
    "default (EXHAUSTIVE search)": "",
    "cudnn_conv_algo_search 1 (HEURISTIC)": parameter("cudnn_conv_algo_search", "1"),
    "allowed_batch_sizes 32": parameter("allowed_batch_sizes", "32"),
    "allowed_batch_sizes 16,32 + warm-up of 16": parameter("allowed_batch_sizes", "16,32") + WARM_16,
    "allowed_batch_sizes 8,16,32": parameter("allowed_batch_sizes", "8,16,32"),
}


def build(root: Path) -> dict[str, tuple[str, str]]:
    """The repository; each row's label -> (model name, input name)."""
    import torch
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()
    example = torch.randn(1, 3, 224, 224)
    root.mkdir(parents=True, exist_ok=True)
    onnx_file = root / "resnet18.onnx"
    torch.onnx.export(
        net, (example,), str(onnx_file), input_names=["input"], output_names=["logits"],
        dynamic_axes={"input": {0: "n"}, "logits": {0: "n"}}, opset_version=17, dynamo=False,
    )  # fmt: skip
    models = {}
    for index, (label, extra) in enumerate(ONNX_VARIANTS.items()):
        name = f"onnx_{index}"
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(onnx_file.read_bytes())
        write_config(root / name, 'platform: "onnxruntime_onnx"\n' + BATCHING + GPU + extra)
        models[f"ONNX, {label}"] = (name, "input")
    (root / "torchscript" / "1").mkdir(parents=True)
    with torch.inference_mode():
        torch.jit.trace(net, example).save(str(root / "torchscript" / "1" / "model.pt"))  # type: ignore[no-untyped-call]
    write_config(
        root / "torchscript",
        'platform: "pytorch_libtorch"\n' + BATCHING + GPU + 'input [ { name: "INPUT__0" data_type: TYPE_FP32 '
        'dims: [ 3, 224, 224 ] } ]\noutput [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]\n',
    )
    models["TorchScript (for comparison)"] = ("torchscript", "INPUT__0")
    onnx_file.unlink()
    return models


def images_per_second(url: str, model: str, input_name: str, clients: int, seconds: float) -> float:
    import tritonclient.grpc as grpcclient

    image = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    done = [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client() -> None:
        connection = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput(input_name, list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        count = 0
        while time.perf_counter() < deadline and count < 100_000:
            connection.infer(model, [tensor])
            count += 1
        with lock:
            done[0] += count

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done[0] / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        models = build(root / "repository")
        with run_server(root / "repository", root / "server.log") as server:
            table = Table(title=f"ResNet-18 on one GPU, images/s ({args.seconds:g} s a pass)")
            for column in (f"{args.clients} clients, pass 1", "pass 2", "1 client"):
                table.add_column(column, justify="right")
            table.add_column("config")
            for label, (name, input_name) in models.items():
                runs = [images_per_second(server.grpc_url, name, input_name, args.clients, args.seconds) for _ in "12"]
                alone = images_per_second(server.grpc_url, name, input_name, 1, args.seconds)
                table.add_row(*(f"{value:.0f}" for value in (*runs, alone)), label)
                console.print(f"{label}: {runs[0]:.0f}, {runs[1]:.0f}, alone {alone:.0f}")
            console.print(table)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The published precision check, on the bundled all-MiniLM-L6-v2: its FP32 ONNX model (the
example repository's) against its FP16 and INT8 ports (`inferd optimize`'s builders) and a BF16
port (`inferd.tools.optimize.export.export_hugging_face_torch`: PyTorch computing in bfloat16, a
torch.export program inferd serves), each judged by `inferd validate`'s regression form as the
published table was made: a pair's score is 5 x the cosine of its embeddings (0 to 5), decisions at
threshold 3, the decisions that flip against FP32, each side's F1 against the pairs' labels, and
max / min / mean / std of the scores' |diff|.

    make example && .venv/bin/python benchmarks/precision.py [--pairs examples/sentence_pairs.tsv]

The pairs are the repository's 240 (labelled 0/1 by the project: alike or not, taken as they are).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from inferd.testing.models import minilm_files
from inferd.tools.optimize.candidates import BuildContext, build_fp16, build_int8_dynamic
from inferd.tools.optimize.export import export_hugging_face_torch
from inferd.tools.validate import Tolerances, ValidateSettings, run_validation

ROOT = Path(__file__).resolve().parents[1]
MINILM = ROOT / "examples" / "model_repository" / "minilm"
THRESHOLD = 3.0
SCALE = 5.0
console = Console(width=140)

BF16_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 32
input [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "token_type_ids" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [
  { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 384 ] },
  { name: "sentence_embedding" data_type: TYPE_FP32 dims: [ 384 ] }
]
"""


def build_ports(work: Path) -> dict[str, Path]:
    """Model folders of the three ports, each as inferd loads it."""
    ports: dict[str, Path] = {}
    context = BuildContext(MINILM / "1" / "model.onnx", work / "scratch", None, "bert")
    (work / "scratch").mkdir(parents=True)
    for name, build in (("FP16", build_fp16), ("INT8", build_int8_dynamic)):
        folder = work / f"minilm_{name.lower()}"
        (folder / "1").mkdir(parents=True)
        # The FP32 model's config, its name left to the folder's.
        config = re.sub(r"^name: .*$", "", (MINILM / "config.pbtxt").read_text(), flags=re.MULTILINE)
        (folder / "config.pbtxt").write_text(config)
        with console.status(f"building the {name} port"):
            build(context, folder / "1")
        ports[name] = folder
    folder = work / "minilm_bf16"
    with console.status("exporting the BF16 port (PyTorch in bfloat16, torch.export)"):
        outputs = export_hugging_face_torch(minilm_files(), folder / "1" / "model.pt2", "bfloat16")
    assert outputs == ("last_hidden_state", "sentence_embedding"), outputs
    (folder / "config.pbtxt").write_text(BF16_CONFIG)
    ports["BF16"] = folder
    return ports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=ROOT / "examples" / "sentence_pairs.tsv")
    args = parser.parse_args()
    if not (MINILM / "1" / "model.onnx").is_file():
        print("MiniLM not exported: make example", file=sys.stderr)
        return 2
    table = Table(
        title=f"all-MiniLM-L6-v2, {args.pairs.name}: score = 5 x cosine, threshold 3, against FP32 (ONNX)",
        title_justify="left",
    )
    for column in ("port", "flips", "F1 FP32", "F1 port", "|diff| max", "min", "mean", "std", "ms / sentence"):
        table.add_column(column, justify="left" if column == "port" else "right")
    with tempfile.TemporaryDirectory() as scratch:
        for name, folder in build_ports(Path(scratch)).items():
            settings = ValidateSettings(
                reference=str(MINILM),
                candidate=str(folder),
                inputs=str(args.pairs),
                tokenizer=minilm_files() / "tokenizer.json",
                embedding="sentence_embedding",
                score_scale=SCALE,
                threshold=THRESHOLD,
                tolerances=Tolerances(atol=None, min_cosine=None, max_flip_rate=1.0),
            )
            with console.status(f"validating the {name} port"):
                report = run_validation(settings)
            similarity = report.comparisons[0]
            f1 = report.label_f1 or {}
            table.add_row(
                name, str(similarity.flips), f"{f1.get('reference', float('nan')):.4f}",
                f"{f1.get('candidate', float('nan')):.4f}", f"{similarity.abs_diff_max:.6f}",
                f"{similarity.abs_diff_min:.6f}", f"{similarity.abs_diff_mean:.6f}", f"{similarity.abs_diff_std:.6f}",
                f"{report.candidate_ms:.2f}",
            )  # fmt: skip
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`inferd optimize`: a model to validated, timed ONNX candidates; the fastest that passes is written."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from inferd.tools.optimize.candidates import Precision
    from inferd.tools.validate import Tolerances


@click.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where the winner (OUTPUT/NAME), the passing candidates and optimize.json go.")  # fmt: skip
@click.option("--name", help="The model's name in the repository (default: the source's).")
@click.option("--version", "model_version", type=click.IntRange(min=1), default=1, show_default=True,
              help="The winner's version folder.")  # fmt: skip
@click.option("--candidates", default="all", show_default=True,
              help="Comma-separated candidates to build (all: every one that applies to the source).")  # fmt: skip
@click.option("--inputs", default="random", show_default=True,
              help="Validation inputs: zero, random, a .npz / .json / .jsonl file, or a .tsv of pairs.")  # fmt: skip
@click.option("--samples", type=click.IntRange(min=1), default=32, show_default=True, help="Generated samples.")
@click.option("--shape", "shapes", multiple=True, help="A variable input's shape without the batch: NAME:1,128.")
@click.option(
    "--calibration", type=click.Path(path_type=Path), help="int8-static's calibration samples (any --inputs file)."
)
@click.option("--tokenizer", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="tokenizer.json for sentence pairs (a Hugging Face folder's own is used by default).")  # fmt: skip
@click.option("--tolerance", "tolerances", multiple=True,
              help="A precision's tolerances instead of its defaults, as int8:atol=0.1,cosine=0.95,flip-rate=0.01,"
                   "flips=0 (0 turns atol or cosine off).")  # fmt: skip
@click.option("--threshold", type=float, default=0.5, show_default=True, help="Pairs: the decision threshold.")
@click.option(
    "--max-batch-size", type=click.IntRange(min=0), help="The config's max_batch_size (default: the source's, or 32)."
)
@click.option("--model-type", default="bert", show_default=True, help="onnxruntime.transformers model type.")
@click.option("--min-gain", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="How much faster a lower precision must be to win.")  # fmt: skip
def optimize(
    source: Path,
    output: Path,
    name: str | None,
    model_version: int,
    candidates: str,
    inputs: str,
    samples: int,
    shapes: tuple[str, ...],
    calibration: Path | None,
    tokenizer: Path | None,
    tolerances: tuple[str, ...],
    threshold: float,
    max_batch_size: int | None,
    model_type: str,
    min_gain: float,
) -> None:
    """Turn SOURCE (an ONNX, TorchScript .pt or torch.export .pt2 file or model folder, a TensorFlow
    SavedModel, or a Hugging Face model folder) into candidates: ONNX ones (fp32, ort: offline graph
    optimization, transformer: fusions, fp16, int8-dynamic, int8-static) and bfloat16 ones in the
    source's framework (bf16-tf, bf16-torch). Each is loaded by inferd, validated against the
    original at its precision's tolerances and timed; the fastest that passes is written to
    OUTPUT/NAME with its config.pbtxt. Exits 1 when none passes."""
    from rich.console import Console

    from inferd.errors import InferdError
    from inferd.tools.inputs import InputError, parse_shape
    from inferd.tools.optimize import OptimizeError, OptimizeSettings, run_optimize
    from inferd.tools.optimize.export import ExportError
    from inferd.tools.optimize.report import table

    console = Console(stderr=True)
    try:
        settings = OptimizeSettings(
            source=source,
            output=output,
            name=name,
            version=model_version,
            candidates=None if candidates == "all" else tuple(c.strip() for c in candidates.split(",") if c.strip()),
            inputs=inputs,
            samples=samples,
            shapes=dict(parse_shape(s) for s in shapes),
            calibration=calibration,
            tokenizer=tokenizer,
            tolerances=parse_tolerances(tolerances),
            threshold=threshold,
            max_batch_size=max_batch_size,
            model_type=model_type,
            min_gain=min_gain,
        )
        with console.status("optimizing") as status:

            def progress(line: str) -> None:
                status.update(line)
                console.log(line)

            report = run_optimize(settings, progress)
    except (OptimizeError, InputError, ExportError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    except InferdError as exc:
        raise click.ClickException(exc.message) from None
    out = Console()
    if not out.is_terminal:
        out = Console(width=200)
    out.print(table(report))
    if report.winner is None:
        raise SystemExit(1)


def parse_tolerances(texts: tuple[str, ...]) -> dict[Precision, Tolerances]:
    """`PRECISION:key=value,...` over the defaults of that precision."""
    from dataclasses import replace

    from inferd.tools.optimize import DEFAULT_TOLERANCES

    result = dict(DEFAULT_TOLERANCES)
    fields = {"atol": ("atol", float), "cosine": ("min_cosine", float), "flips": ("max_flips", int),
              "flip-rate": ("max_flip_rate", float)}  # fmt: skip
    for text in texts:
        name, _, assignments = text.partition(":")
        precision = next((p for p in result if p == name), None)
        if precision is None or not assignments:
            raise click.BadParameter(f"{text!r}: write PRECISION:key=value,... with PRECISION one of "
                                     f"{', '.join(result)}", param_hint="--tolerance")  # fmt: skip
        changes: dict[str, Any] = {}
        for assignment in assignments.split(","):
            key, _, value = assignment.partition("=")
            if key not in fields:
                raise click.BadParameter(f"{key!r} is not one of {', '.join(fields)}", param_hint="--tolerance")
            field, kind = fields[key]
            try:
                number = kind(value)
            except ValueError:
                raise click.BadParameter(
                    f"{assignment!r}: {value!r} is not a number", param_hint="--tolerance"
                ) from None
            changes[field] = None if field in ("atol", "min_cosine") and number <= 0 else number
        result[precision] = replace(result[precision], **changes)
    return result

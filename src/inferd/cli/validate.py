"""`inferd validate`: compare a candidate model's outputs with a reference's; exit 1 outside tolerance."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click


class ValidateError(click.ClickException):
    """The comparison could not run (exit 2); exit 1 is kept for a candidate outside tolerance."""

    exit_code = 2


@click.command()
@click.argument("reference")
@click.argument("candidate")
@click.option(
    "--inputs", default="random", show_default=True,
    help="zero or random (from the reference's metadata), a .npz / .json / .jsonl file, or a .tsv of sentence pairs.",
)  # fmt: skip
@click.option("--samples", type=click.IntRange(min=1), default=32, show_default=True, help="Generated samples.")
@click.option("--shape", "shapes", multiple=True, help="A variable input's shape without the batch: NAME:1,128.")
@click.option("--output", "outputs", multiple=True, help="Compare only these outputs (default: all both share).")
@click.option("--scores", multiple=True, help="An output of scores, judged by the decisions at --threshold.")
@click.option("--classes", multiple=True, help="An output of class scores, judged by top-1 agreement.")
@click.option("--threshold", type=float, default=0.5, show_default=True, help="The decision threshold of scores.")
@click.option("--atol", type=float, default=1e-3, show_default=True, help="Largest |diff| allowed; 0 or less: off.")
@click.option("--min-cosine", type=float, default=0.999, show_default=True, help="Lowest cosine allowed; 0: off.")
@click.option("--max-flips", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--max-flip-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Or this share of the decisions, when more.")  # fmt: skip
@click.option("--max-top1", type=click.IntRange(min=0), default=0, show_default=True, help="Top-1 changes allowed.")
@click.option("--tokenizer", type=click.Path(exists=True, path_type=Path), help="tokenizer.json, for token-id models.")
@click.option(
    "--embedding",
    help="Pairs: the output holding the embedding, or a cross-encoder's score "
    "(default sentence_embedding or the first).",
)
@click.option(
    "--score-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Pairs: a pair's score is this times its embeddings' cosine, or a cross-encoder's score (5: STS's 0-5, "
    "with --threshold 3).",
)
@click.option("--pair-model", type=click.Choice(["auto", "bi-encoder", "cross-encoder"]), default="auto",
              show_default=True,
              help="Pairs: a bi-encoder embeds each sentence (score: cosine); a cross-encoder reads the pair and "
                   "answers its score (auto: two text inputs, or an output of one value a row).")  # fmt: skip
@click.option("--score-activation", type=click.Choice(["none", "sigmoid"]), default="none", show_default=True,
              help="Pairs: a cross-encoder's score as answered, or through a sigmoid (for a logit).")  # fmt: skip
@click.option("--report", "report_dir", type=click.Path(file_okay=False, path_type=Path), help="Write JSON + PNG here.")
def validate(
    reference: str,
    candidate: str,
    inputs: str,
    samples: int,
    shapes: tuple[str, ...],
    outputs: tuple[str, ...],
    scores: tuple[str, ...],
    classes: tuple[str, ...],
    threshold: float,
    atol: float,
    min_cosine: float,
    max_flips: int,
    max_flip_rate: float,
    max_top1: int,
    tokenizer: Path | None,
    embedding: str | None,
    score_scale: float,
    pair_model: Literal["auto", "bi-encoder", "cross-encoder"],
    score_activation: Literal["none", "sigmoid"],
    report_dir: Path | None,
) -> None:
    """Run REFERENCE and CANDIDATE (model files or folders inferd can load, or server models as
    http://host:port/MODEL) on the same inputs and compare every output: |diff| max/min/mean/std,
    cosine similarity, flips of score decisions, top-1 changes. Exits 1 when the candidate is
    outside a tolerance, 2 when the comparison cannot run."""
    from rich.console import Console

    from inferd.errors import InferdError
    from inferd.tools.inputs import InputError, parse_shape
    from inferd.tools.validate import Tolerances, ValidateSettings, run_validation
    from inferd.tools.validate.report import table, write_report

    try:
        settings = ValidateSettings(
            reference=reference,
            candidate=candidate,
            inputs=inputs,
            samples=samples,
            shapes=dict(parse_shape(s) for s in shapes),
            outputs=outputs,
            scores=scores,
            classes=classes,
            threshold=threshold,
            tolerances=Tolerances(
                atol=atol if atol > 0 else None,
                min_cosine=min_cosine if min_cosine > 0 else None,
                max_flips=max_flips,
                max_flip_rate=max_flip_rate,
                max_top1=max_top1,
            ),
            tokenizer=tokenizer,
            embedding=embedding,
            score_scale=score_scale,
            pair_model=pair_model,
            score_activation=score_activation,
        )
        report = run_validation(settings)
    except (InputError, ValueError) as exc:
        raise ValidateError(str(exc)) from None
    except InferdError as exc:
        raise ValidateError(exc.message) from None
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table(report))
    if report_dir is not None:
        for path in write_report(report, report_dir):
            console.print(f"wrote {path}")
    if not report.passed:
        raise SystemExit(1)

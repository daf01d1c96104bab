"""`run_validation`: the same inputs through a reference and a candidate, every shared output
compared (`compare.py`), each side timed. Inputs come from a file (.npz, perf_analyzer's .json,
.jsonl), are generated from the reference's metadata (zero or random), or are sentence pairs
(.tsv), whose scores (a bi-encoder's cosine similarities, a cross-encoder's own) are thresholded."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from inferd.comparison import OutputComparison, Tolerances, compare_output
from inferd.tools.inputs import file_samples, request_shapes, synthetic_samples
from inferd.tools.validate.models import Arrays, ModelUnderTest, open_model
from inferd.tools.validate.pairs import Activation, PairModel, pair_scorer, read_pairs
from inferd.types import DataType


@dataclass(frozen=True, slots=True)
class ValidateSettings:
    reference: str
    candidate: str
    inputs: str = "random"
    """zero, random (from the reference's metadata), or a .npz / .json / .jsonl / .tsv (pairs) file."""
    samples: int = 32
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    """The outputs compared (default: every output both sides have)."""
    scores: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    threshold: float = 0.5
    tolerances: Tolerances = field(default_factory=Tolerances)
    tokenizer: Path | None = None
    embedding: str | None = None
    score_scale: float = 1.0
    """Pairs: a pair's score is this times the cosine of its embeddings (5: STS's 0-5 scale, as
    the published check scored MiniLM), or times a cross-encoder's score, judged at `threshold` on
    that scale."""
    pair_model: PairModel = "auto"
    """Pairs: how each model scores a pair (auto: as its inputs and output say)."""
    score_activation: Activation = "none"
    """Pairs: a cross-encoder's score as answered, or through a sigmoid (a logit to 0-1)."""


@dataclass(frozen=True, slots=True)
class ValidationReport:
    reference: str
    candidate: str
    mode: Literal["tensors", "pairs"]
    samples: int
    comparisons: list[OutputComparison]
    reference_ms: float
    """Mean milliseconds per sample (per sentence for pairs) on the reference, this machine."""
    candidate_ms: float
    label_accuracy: dict[str, float] | None = None
    """For labelled pairs: the share of decisions at the threshold that match the labels."""
    label_f1: dict[str, float] | None = None
    """For labelled pairs: F1 of each side's decisions against the labels' (alike is positive)."""
    pair_model: str | None = None
    """For pairs: bi-encoder (timed per sentence) or cross-encoder (per pair)."""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)


def run_validation(settings: ValidateSettings) -> ValidationReport:
    reference = open_model(settings.reference)
    try:
        candidate = open_model(settings.candidate)
        try:
            if settings.inputs.endswith(".tsv"):
                return _pairs(settings, reference, candidate)
            return _tensors(settings, reference, candidate)
        finally:
            candidate.close()
    finally:
        reference.close()


def _tensors(settings: ValidateSettings, reference: ModelUnderTest, candidate: ModelUnderTest) -> ValidationReport:
    metadata = reference.metadata
    theirs = {t.name: t for t in candidate.metadata.inputs}
    if sorted(theirs) != sorted(t.name for t in metadata.inputs):
        raise ValueError(
            f"the candidate's inputs {sorted(theirs)} are not the reference's {[t.name for t in metadata.inputs]}"
        )
    shared = [t.name for t in metadata.outputs if t.name in {o.name for o in candidate.metadata.outputs}]
    outputs = list(settings.outputs) or shared
    unknown = [name for name in (*outputs, *settings.scores, *settings.classes) if name not in shared]
    if unknown:
        raise ValueError(f"outputs {unknown} are not outputs of both models; they share {shared}")
    shapes = request_shapes(metadata, reference.max_batch_size, 1, settings.shapes)
    if settings.inputs in ("zero", "random"):
        samples = synthetic_samples(metadata, shapes, settings.inputs, count=settings.samples)
    else:
        samples = file_samples(Path(settings.inputs), metadata, shapes)
    # A candidate may take other datatypes (an FP16 port without FP32 inputs): each side gets its own.
    candidate_types = {name: DataType.from_wire(t.datatype).numpy_dtype for name, t in theirs.items()}
    ref_results, ref_s = _run_all(reference, samples, outputs)
    cand_samples = [
        {n: a.astype(candidate_types[n]) if a.dtype != object else a for n, a in s.items()} for s in samples
    ]
    cand_results, cand_s = _run_all(candidate, cand_samples, outputs)
    comparisons = [
        compare_output(
            name,
            [r[name] for r in ref_results],
            [c[name] for c in cand_results],
            settings.tolerances,
            "scores" if name in settings.scores else "classes" if name in settings.classes else "values",
            settings.threshold,
        )
        for name in outputs
    ]
    count = len(samples)
    return ValidationReport(
        settings.reference, settings.candidate, "tensors", count, comparisons, ref_s / count * 1e3, cand_s / count * 1e3
    )


def _pairs(settings: ValidateSettings, reference: ModelUnderTest, candidate: ModelUnderTest) -> ValidationReport:
    pairs = read_pairs(Path(settings.inputs))
    scorers = [
        pair_scorer(model, settings.tokenizer, settings.embedding, settings.pair_model, settings.score_activation)
        for model in (reference, candidate)
    ]
    kinds = {type(scorer).__name__ for scorer in scorers}
    if len(kinds) != 1:
        raise ValueError(
            "the reference and the candidate score pairs differently (one embeds sentences, the other reads "
            "pairs): name the form with --pair-model"
        )
    started = time.perf_counter()
    ref_scores, ref_vectors = scorers[0].score(pairs)
    ref_s = time.perf_counter() - started
    started = time.perf_counter()
    cand_scores, cand_vectors = scorers[1].score(pairs)
    cand_s = time.perf_counter() - started
    ref_scores, cand_scores = ref_scores * settings.score_scale, cand_scores * settings.score_scale
    tolerances = settings.tolerances
    comparisons = [
        compare_output("similarity", list(ref_scores[:, None]), list(cand_scores[:, None]), tolerances, "scores",
                       settings.threshold),
    ]  # fmt: skip
    if ref_vectors is not None and cand_vectors is not None:
        # Embeddings are judged by the decisions they lead to and their cosine, not element by element.
        comparisons.append(compare_output(f"embedding ({scorers[0].output})", ref_vectors, cand_vectors,
                                          Tolerances(atol=None, min_cosine=tolerances.min_cosine)))  # fmt: skip
    accuracy = f1 = None
    gold = pairs.gold(settings.threshold)
    if gold is not None:
        decided = {"reference": ref_scores > settings.threshold, "candidate": cand_scores > settings.threshold}
        accuracy = {side: float(np.mean(decisions == gold)) for side, decisions in decided.items()}
        f1 = {side: f1_score(decisions, gold) for side, decisions in decided.items()}
    cross = ref_vectors is None
    runs = len(pairs.first) * (1 if cross else 2)
    return ValidationReport(
        settings.reference, settings.candidate, "pairs", len(pairs.first), comparisons,
        ref_s / runs * 1e3, cand_s / runs * 1e3, accuracy, f1, "cross-encoder" if cross else "bi-encoder",
    )  # fmt: skip


def f1_score(decisions: np.ndarray[Any, Any], gold: np.ndarray[Any, Any]) -> float:
    """F1 of boolean decisions against boolean gold labels (positive: alike); 0 with no positive."""
    true_positives = int(np.sum(decisions & gold))
    predicted, actual = int(np.sum(decisions)), int(np.sum(gold))
    return 2 * true_positives / (predicted + actual) if predicted + actual else 0.0


def _run_all(model: ModelUnderTest, samples: list[Arrays], outputs: list[str]) -> tuple[list[Arrays], float]:
    model.run(samples[0], outputs)  # warm-up: a first run pays for allocations, not for the model
    started = time.perf_counter()
    results = [model.run(sample, outputs) for sample in samples]
    return results, time.perf_counter() - started


def as_json(report: ValidationReport) -> dict[str, Any]:
    return {
        "reference": report.reference,
        "candidate": report.candidate,
        "mode": report.mode,
        "samples": report.samples,
        "passed": report.passed,
        "reference_ms": report.reference_ms,
        "candidate_ms": report.candidate_ms,
        "label_accuracy": report.label_accuracy,
        "label_f1": report.label_f1,
        "pair_model": report.pair_model,
        "outputs": [_comparison_json(c) for c in report.comparisons],
    }


_FIELDS = ("name", "kind", "samples", "abs_diff_max", "abs_diff_min", "abs_diff_mean", "abs_diff_std", "cosine_mean",
           "cosine_min", "flips", "top1_disagreements")  # fmt: skip


def _comparison_json(comparison: OutputComparison) -> dict[str, Any]:
    document = {key: getattr(comparison, key) for key in _FIELDS}
    return document | {"passed": comparison.passed, "failures": list(comparison.failures)}

"""How a candidate's outputs are judged against the reference's, output by output: |diff| max, min,
mean and std over every element; cosine similarity per sample; for score outputs the decisions
that flip at a threshold, and for class outputs the rows whose top-1 class differs. Each figure
has its tolerance, and an output that breaks one says which.

One judgment for every comparison inferd makes: `inferd validate` and `inferd optimize` (a port or
a server against a reference) and an endpoint's shadow variants (`core.shadow`: each copied
request's answer against the primary's), so "agrees" means the same everywhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Kind = Literal["values", "scores", "classes"]


@dataclass(frozen=True, slots=True)
class Tolerances:
    atol: float | None = 1e-3
    """The largest |diff| allowed in any element (None: not judged)."""
    min_cosine: float | None = 0.999
    """The lowest cosine similarity allowed for any sample (None: not judged)."""
    max_flips: int = 0
    """Score decisions (at the threshold) allowed to differ."""
    max_flip_rate: float = 0.0
    """... or this share of the decisions, when that allows more (INT8 ports are judged by rate)."""
    max_top1: int = 0
    """Rows whose top-1 class may differ."""


@dataclass(frozen=True, slots=True)
class OutputComparison:
    name: str
    kind: Kind
    samples: int
    abs_diff_max: float
    abs_diff_min: float
    abs_diff_mean: float
    abs_diff_std: float
    cosine_mean: float
    cosine_min: float
    flips: int | None = None
    top1_disagreements: int | None = None
    failures: tuple[str, ...] = ()
    diffs: np.ndarray[Any, Any] = field(default_factory=lambda: np.empty(0), repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return not self.failures


def compare_output(
    name: str,
    reference: list[np.ndarray[Any, Any]],
    candidate: list[np.ndarray[Any, Any]],
    tolerances: Tolerances,
    kind: Kind = "values",
    threshold: float | None = None,
) -> OutputComparison:
    """`reference[i]` and `candidate[i]`: the output for sample i (any shape, the same on both sides)."""
    for index, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
        if ref.shape != cand.shape:
            raise ValueError(f"output '{name}' sample {index}: reference shape {ref.shape}, candidate {cand.shape}")
    ref_rows = [np.asarray(r, dtype=np.float64).reshape(-1) for r in reference]
    cand_rows = [np.asarray(c, dtype=np.float64).reshape(-1) for c in candidate]
    diffs = np.abs(np.concatenate(ref_rows) - np.concatenate(cand_rows)) if ref_rows else np.zeros(1)
    cosines = np.array([_cosine(r, c) for r, c in zip(ref_rows, cand_rows, strict=True)]) if ref_rows else np.ones(1)
    failures = []
    if tolerances.atol is not None and diffs.max() > tolerances.atol:
        failures.append(f"|diff| max {diffs.max():.6g} > {tolerances.atol:g}")
    if tolerances.min_cosine is not None and cosines.min() < tolerances.min_cosine:
        failures.append(f"cosine min {cosines.min():.6f} < {tolerances.min_cosine:g}")
    flips = top1 = None
    if kind == "scores":
        if threshold is None:
            raise ValueError(f"score output '{name}' needs a threshold")
        decisions = np.concatenate(ref_rows) > threshold
        flips = int(np.sum(decisions != (np.concatenate(cand_rows) > threshold)))
        allowed = max(tolerances.max_flips, int(tolerances.max_flip_rate * decisions.size))
        if flips > allowed:
            failures.append(f"{flips} decisions flip at threshold {threshold:g} (at most {allowed})")
    elif kind == "classes":
        top1 = sum(
            int(np.sum(np.argmax(np.asarray(r), axis=-1) != np.argmax(np.asarray(c), axis=-1)))
            for r, c in zip(reference, candidate, strict=True)
        )
        if top1 > tolerances.max_top1:
            failures.append(f"top-1 class differs in {top1} rows (at most {tolerances.max_top1})")
    return OutputComparison(
        name=name,
        kind=kind,
        samples=len(reference),
        abs_diff_max=float(diffs.max()),
        abs_diff_min=float(diffs.min()),
        abs_diff_mean=float(diffs.mean()),
        abs_diff_std=float(diffs.std()),
        cosine_mean=float(cosines.mean()),
        cosine_min=float(cosines.min()),
        flips=flips,
        top1_disagreements=top1,
        failures=tuple(failures),
        diffs=diffs,
    )


def _cosine(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:  # all zeros on a side: alike only if both are
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a, b) / norms)

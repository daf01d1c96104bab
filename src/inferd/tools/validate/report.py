"""`inferd validate`'s table (the one the published BF16 port printed), its JSON record and a
histogram of the differences (PNG)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.table import Table

from inferd.tools.validate.run import ValidationReport, as_json


def table(report: ValidationReport) -> Table:
    unit = "sample" if report.mode != "pairs" else "pair" if report.pair_model == "cross-encoder" else "sentence"
    title = (
        f"{report.candidate} against {report.reference}: {report.samples} "
        f"{'sentence pairs' if report.mode == 'pairs' else 'samples'}; "
        f"{report.reference_ms:.2f} ms / {report.candidate_ms:.2f} ms per {unit} (reference / candidate)"
    )
    result = Table(title=title, title_justify="left")
    for name in ("output", "kind", "flips / top-1", "|diff| max", "min", "mean", "std", "cosine mean", "cosine min"):
        result.add_column(name, justify="left" if name in ("output", "kind") else "right")
    result.add_column("verdict")
    for c in report.comparisons:
        decided = c.flips if c.flips is not None else c.top1_disagreements
        result.add_row(
            c.name, c.kind, "-" if decided is None else str(decided),
            f"{c.abs_diff_max:.6f}", f"{c.abs_diff_min:.6f}", f"{c.abs_diff_mean:.6f}", f"{c.abs_diff_std:.6f}",
            f"{c.cosine_mean:.6f}", f"{c.cosine_min:.6f}",
            "pass" if c.passed else "FAIL: " + "; ".join(c.failures),
        )  # fmt: skip
    if report.label_accuracy:
        f1 = report.label_f1 or {}
        result.caption = "agreement with the labels: " + ", ".join(
            f"{side} {share:.1%}" + (f" (F1 {f1[side]:.4f})" if side in f1 else "")
            for side, share in report.label_accuracy.items()
        )
    return result


def write_report(report: ValidationReport, folder: Path) -> list[Path]:
    """`validate.json` and `diffs.png` (log-scale histogram of |diff| per output) in `folder`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "validate.json"
    record.write_text(json.dumps(as_json(report), indent=2))
    figure, axes = plt.subplots(len(report.comparisons), 1, figsize=(8, 2.6 * len(report.comparisons)), squeeze=False)
    for axis, comparison in zip(axes[:, 0], report.comparisons, strict=True):
        diffs = comparison.diffs[comparison.diffs > 0]
        if diffs.size:
            bins = np.logspace(np.log10(diffs.min()), np.log10(diffs.max()) + 1e-9, 50)
            axis.hist(diffs, bins=bins, color="tab:blue")
            axis.set_xscale("log")
        axis.set_title(
            f"{comparison.name}: |diff| (max {comparison.abs_diff_max:.3g}, mean {comparison.abs_diff_mean:.3g})"
        )
        axis.set_ylabel("elements")
    figure.tight_layout()
    plot = folder / "diffs.png"
    figure.savefig(plot, dpi=100)
    plt.close(figure)
    return [record, plot]

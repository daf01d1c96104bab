"""`inferd optimize`'s table: one row per candidate, with the figures of its validation (the worst
output's), its speed beside the original's, and its verdict."""

from __future__ import annotations

from rich.table import Table

from inferd.tools.optimize.run import CandidateResult, OptimizeReport

_STATUS_STYLE = {"passed": "green", "rejected": "red", "unservable": "red", "error": "red", "skipped": "dim"}


def table(report: OptimizeReport) -> Table:
    reference = f"{report.reference_ms:.2f} ms per batch-1 request" if report.reference_ms else "not timed"
    result = Table(title=f"inferd optimize {report.source} → {report.name}: original {reference}", title_justify="left")
    for name in ("candidate", "precision", "status", "ms / request", "speed-up", "MB", "flips", "|diff| max",
                 "cosine min", "why"):  # fmt: skip
        result.add_column(name, justify="left" if name in ("candidate", "precision", "status", "why") else "right")
    for candidate in report.candidates:
        result.add_row(*_row(candidate, report), style="bold" if candidate.name == report.winner else None)
    result.caption = (
        f"winner: {report.winner} → {report.model_dir}" if report.winner else "no candidate passed: nothing written"
    )
    return result


def _row(candidate: CandidateResult, report: OptimizeReport) -> list[str]:
    comparisons = candidate.validation.comparisons if candidate.validation else []
    flips = [c.flips for c in comparisons if c.flips is not None]
    speedup = (
        f"{report.reference_ms / candidate.latency_ms:.2f}x" if report.reference_ms and candidate.latency_ms else "-"
    )
    status = candidate.status + (" (winner)" if candidate.name == report.winner else "")
    return [
        candidate.name,
        candidate.precision,
        f"[{_STATUS_STYLE[candidate.status]}]{status}[/]",
        f"{candidate.latency_ms:.2f}" if candidate.latency_ms else "-",
        speedup,
        f"{candidate.size_bytes / 1e6:.1f}" if candidate.size_bytes else "-",
        str(sum(flips)) if flips else "-",
        f"{max(c.abs_diff_max for c in comparisons):.6f}" if comparisons else "-",
        f"{min(c.cosine_min for c in comparisons):.6f}" if comparisons else "-",
        candidate.reason,
    ]

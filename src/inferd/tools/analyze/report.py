"""`inferd analyze`'s outputs for people: a rich table per model, and report.html with, per model,
the throughput-vs-p99 curve of every configuration measured (matplotlib, embedded as PNG), the
resource table (memory, CPU), the winner and its config.pbtxt."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from rich.table import Table

from inferd.tools.analyze.run import AnalyzeReport, AnalyzeSettings, Measurement, ModelResult


def table(result: ModelResult, settings: AnalyzeSettings) -> Table:
    gain = result.gain(settings)
    title = f"{result.name}: {len(result.measurements)} configurations"
    if result.winner is not None:
        title += f"; winner {result.winner.point.label()}" + (f", {gain:.2f}x the model's own" if gain else "")
    rendered = Table(title=title, title_justify="left")
    for column in ("configuration", "best load", "inferences/s", "p50 ms", "p99 ms", "batch", "RSS MB", "CPU cores",
                   "verdict"):  # fmt: skip
        rendered.add_column(column, justify="left" if column in ("configuration", "verdict") else "right")
    for measurement in _ordered(result, settings):
        rendered.add_row(*_row(measurement, result, settings), style="bold" if measurement is result.winner else None)
    return rendered


def _ordered(result: ModelResult, settings: AnalyzeSettings) -> list[Measurement]:
    return sorted(result.measurements, key=lambda m: (m.score is None, -(m.score or 0.0)))


def _row(measurement: Measurement, result: ModelResult, settings: AnalyzeSettings) -> list[str]:
    best = measurement.best_step(settings)
    label = measurement.point.label() + (" (own config)" if measurement.baseline else "")
    if measurement is result.winner:
        verdict = "winner"
    elif measurement.error:
        verdict = measurement.error[:80]
    elif best is None:
        verdict = "infeasible"
    else:
        verdict = ""
    if best is None:
        return [label, "-", "-", "-", "-", "-", f"{measurement.rss_mb:.0f}", "-", verdict]
    return [label, f"{best.load:g}", f"{best.throughput:.1f}", f"{best.p50_ms:.2f}", f"{best.p99_ms:.2f}",
            f"{best.batch_size:.1f}", f"{measurement.rss_mb:.0f}", f"{best.cpu_cores:.2f}", verdict]  # fmt: skip


def write_html(report: AnalyzeReport, path: Path) -> None:
    settings = report.settings
    objective = (
        f"max throughput{f' with p99 ≤ {settings.p99_budget_ms:g} ms' if settings.p99_budget_ms else ''}"
        if settings.objective == "throughput"
        else f"min p99 at {settings.request_rate:g} requests/s"
    )
    sections = [
        f"<h1>inferd analyze</h1><p>Objective: {html.escape(objective)}; search: {settings.search}, "
        f"budget {settings.budget} configurations per model. Measurements: "
        f"<code>{html.escape(str(report.results_path))}</code>; profile: "
        f"<code>{html.escape(str(report.profile_path))}</code>.</p>"
    ]
    for result in report.models:
        sections.append(_model_section(result, settings))
    document = (
        "<!doctype html><html><head><meta charset='utf-8'><title>inferd analyze</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        "tr.winner{font-weight:bold;background:#e8f5e9}pre{background:#f6f6f6;padding:1em}</style></head><body>"
        + "".join(sections)
        + "</body></html>"
    )
    path.write_text(document, encoding="utf-8")


def _model_section(result: ModelResult, settings: AnalyzeSettings) -> str:
    gain = result.gain(settings)
    parts = [f"<h2>{html.escape(result.name)}</h2>"]
    if result.winner is None:
        parts.append("<p>No configuration was feasible: nothing written.</p>")
    else:
        parts.append(
            f"<p>Winner: <b>{html.escape(result.winner.point.label())}</b>"
            + (f", {gain:.2f}x the model's own configuration" if gain else "")
            + f"; written to <code>{html.escape(str(result.model_dir))}</code>.</p>"
        )
    parts.append(f"<img alt='throughput against p99 latency' src='data:image/png;base64,{_curves(result)}'>")
    header = ("configuration", "best load", "inferences/s", "p50 ms", "p99 ms", "batch", "RSS MB", "CPU cores",
              "verdict")  # fmt: skip
    rows = "".join(
        f"<tr{' class=winner' if m is result.winner else ''}>"
        + "".join(f"<td>{html.escape(cell)}</td>" for cell in _row(m, result, settings))
        + "</tr>"
        for m in _ordered(result, settings)
    )
    parts.append(f"<table><tr>{''.join(f'<th>{h}</th>' for h in header)}</tr>{rows}</table>")
    parts.append(
        f"<p>Memory is the server's peak RSS while measured; an empty inferd takes "
        f"{result.memory_baseline_mb:.0f} MB.</p>"
    )
    if result.winner is not None:
        parts.append(f"<h3>config.pbtxt</h3><pre>{html.escape(result.winner.config_text)}</pre>")
    return "".join(parts)


def _curves(result: ModelResult) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 5.5))
    for measurement in result.measurements:
        if not measurement.steps:
            continue
        steps = sorted(measurement.steps, key=lambda s: s.load)
        winner = measurement is result.winner
        label = measurement.point.label() + (" (winner)" if winner else "")
        axes.plot([s.p99_ms for s in steps], [s.throughput for s in steps], marker="o",
                  linewidth=3 if winner else 1, label=label)  # fmt: skip
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel("throughput (inferences/s)")
    axes.set_title(f"{result.name}: throughput against p99, one curve per configuration (points: loads)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")

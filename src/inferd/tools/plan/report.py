"""A plan shown: rich tables (the fleet, the instances) and a PNG picture of the packing."""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

from rich.table import Table

from inferd.tools.plan.plan_file import Plan

MAX_DRAWN = 200
"""Instances drawn one bar each; a bigger fleet is drawn as its first MAX_DRAWN (the title says so)."""


def summary_table(plan: Plan) -> Table:
    s = plan.summary
    currency = plan.catalog.get("currency", "USD")
    table = Table(title=f"inferd plan: {len(plan.models)} models on {len(plan.instances)} instances")
    table.add_column("fleet")
    table.add_column("instances", justify="right")
    table.add_column(f"{currency}/hour", justify="right")
    table.add_column(f"{currency}/model-hour", justify="right")
    prices = {i.type: i.price_per_hour for i in plan.instances}
    for kind, count in sorted(s.instances_by_type.items()):
        table.add_row(f"  {kind}", str(count), f"{prices[kind] * count:,.3f}", "")
    models = max(1, len(plan.models))
    table.add_row("plan", str(len(plan.instances)), f"{s.cost_per_hour:,.3f}", f"{s.cost_per_model_hour:.5f}",
                  style="bold")  # fmt: skip
    table.add_row("lower bound", "", f"{s.lower_bound:,.3f}", f"{s.lower_bound / models:.5f}")
    table.add_row(
        "first-fit decreasing", "", f"{s.first_fit_decreasing:,.3f}", f"{s.first_fit_decreasing / models:.5f}"
    )
    table.add_row("one model per instance", "", f"{s.one_per_instance:,.3f}", f"{s.one_per_instance / models:.5f}")
    table.caption = (
        f"{s.status}, gap {s.gap:.2%}, solved in {s.solve_seconds:.1f} s; "
        f"prices: {plan.catalog.get('source', '?')} ({plan.catalog.get('prices_as_of', '?')})"
    )
    return table


def instances_table(plan: Plan, limit: int = 40) -> Table:
    table = Table(
        title="instances" + (f" (the first {limit} of {len(plan.instances)})" if len(plan.instances) > limit else "")
    )
    for column in ("instance", "type", "models", "memory", "CPU", "accelerator memory", "accelerator"):
        table.add_column(column, justify="left" if column in ("instance", "type") else "right")
    for instance in plan.instances[:limit]:
        use = instance.utilization()

        def cell(key: str, use: dict[str, float] = use) -> str:
            return f"{use[key]:.0%}" if key in use else "-"

        table.add_row(instance.name, instance.type, str(len(instance.models)), cell("memory_mb"), cell("cpu_milli"),
                      cell("device_memory_mb"), cell("device_milli"))  # fmt: skip
    return table


def write_png(plan: Plan, path: Path) -> None:
    """One row per instance, two bars (memory, CPU; accelerator ones where there are), each split
    into the replicas it holds: the packing as it is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = plan.instances[:MAX_DRAWN]
    keys = ["memory_mb", "cpu_milli"]
    if any(i.capacity["device_memory_mb"] for i in drawn):
        keys += ["device_memory_mb", "device_milli"]
    labels = {"memory_mb": "memory", "cpu_milli": "CPU", "device_memory_mb": "accelerator memory",
              "device_milli": "accelerator"}  # fmt: skip
    height = max(3.0, 0.22 * len(drawn) + 1.5)
    figure, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), height), sharey=True, squeeze=False)
    colormap = plt.get_cmap("tab20")
    types = sorted({i.type for i in drawn})
    for axis, key in zip(axes[0], keys, strict=True):
        for row, instance in enumerate(drawn):
            capacity = instance.capacity[key] or 1
            start = 0.0
            segments, colors = [], []
            for model in instance.models:
                width = plan.models[model].demand.get(instance.type, {}).get(key, 0) / capacity
                if width > 0:
                    segments.append((start, width))
                    colors.append(colormap(zlib.crc32(model.encode()) % 20))
                    start += width
            axis.broken_barh(segments, (row - 0.4, 0.8), facecolors=colors, edgecolor="white", linewidth=0.2)
            axis.barh(row, 1.0, height=0.9, fill=False, edgecolor=f"C{types.index(instance.type)}", linewidth=1.0)
        axis.set_xlim(0, 1.0)
        axis.set_xlabel(f"{labels[key]} (share of what the limits allow)")
    axes[0][0].invert_yaxis()  # the axes share y: inverting one inverts all, bin-00 on top
    axes[0][0].set_yticks(range(len(drawn)), [f"{i.name} {i.type}" for i in drawn], fontsize=7)
    counts = Counter(i.type for i in plan.instances)
    fleet = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
    shown = f" (the first {MAX_DRAWN} drawn)" if len(plan.instances) > MAX_DRAWN else ""
    figure.suptitle(
        f"{len(plan.models)} models on {fleet}: {plan.summary.cost_per_hour:,.2f} "
        f"{plan.catalog.get('currency', 'USD')}/hour, gap {plan.summary.gap:.1%}{shown}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)

"""The quality report's PNG plots (matplotlib, imported when a plot is drawn)."""

from __future__ import annotations

from pathlib import Path

from ..methods import BUDGETS, FULL
from ..plotting import pyplot
from .report import budget_compression

PANELS = (
    ("retention", "teacher-forced, all positions"),
    ("lr_retention", "teacher-forced, long-range positions"),
    ("compression_retention", "prompt compression"),
)


def plot_retention(results: dict, summary: dict, kvpress: dict, path: Path) -> None:
    """:func:`retention_figure`, saved as a PNG at ``path``."""
    fig = retention_figure(results, summary, kvpress)
    fig.savefig(path, dpi=110, format="png")
    pyplot().close(fig)


def retention_figure(results: dict, summary: dict, kvpress: dict):
    """Retention (% of full attention's top-1 accuracy) against compression, one line per
    method, one panel per figure the run measured (:data:`PANELS`: a protocol left out draws no
    empty panel), the legend beside the last; bars are the 95% intervals. ``ValueError`` where
    no method has a figure to draw."""
    lines: dict[str, dict[float, object]] = {}
    for name, record in results["methods"].items():
        if record["policy"] is not None:
            lines.setdefault(record["policy"], {})[budget_compression(record["budget"])] = summary[
                name
            ]
    for (press, budget), figures in kvpress.items():
        lines.setdefault(f"kvpress {press}", {})[budget_compression(budget)] = figures
    measured = {figure for points in lines.values() for f in points.values() for figure in f}
    panels = [(figure, title) for figure, title in PANELS if figure in measured]
    if not panels:
        raise ValueError(
            f"no method has a retention figure to plot ({', '.join(f for f, _ in PANELS)}): "
            "run a compressing policy with the teacher_forced or compression protocol"
        )
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), sharey=True,
                             squeeze=False)  # fmt: skip
    axes = axes[0]
    colours = plt.get_cmap("tab20")
    for ax, (figure, title) in zip(axes, panels, strict=True):
        for index, (label, points) in enumerate(lines.items()):
            xs = sorted(x for x, f in points.items() if figure in f)
            if not xs:
                continue
            est = [points[x][figure] for x in xs]
            ys = [100 * e.value for e in est]
            err = [[100 * (e.value - e.low) for e in est], [100 * (e.high - e.value) for e in est]]
            style = "--" if label.startswith("kvpress") else "-"
            width = 2.5 if label == "memory" else 1.2
            ax.errorbar(
                [100 * x for x in xs], ys, yerr=err, marker="o", capsize=3, linestyle=style,
                linewidth=width, label=label, color=colours(index % 20),
            )  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("compression (% of the sequence evicted)")
        ax.set_xticks([100 * budget_compression(b) for b in BUDGETS])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("retention (% of full-attention top-1 accuracy)")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig


def plot_cache_memory(results: dict, path: Path) -> None:
    """Cache bytes per sequence against tokens in context during greedy continuation."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, record in results["methods"].items():
        if "continuation" not in record or record["policy"] not in (None, "memory"):
            continue
        sizes = record["continuation"]["cache_bytes"]
        xs = [int(n) for n in sizes]
        label = "full attention" if name == FULL else f"KVpop memory, {record['budget']}"
        ax.plot(xs, [sizes[str(n)] / 2**20 for n in xs], marker=".", label=label)
    ax.set_xlabel("tokens in context (prompt + generated)")
    ax.set_ylabel("KV cache per sequence (MiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)

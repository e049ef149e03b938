"""The long-context benchmark's report: a markdown table, the figures as JSON and a plot."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from ..._version import __version__
from ...atomic import atomic_write
from .settings import BASELINE, METHODS, BenchResult, Row, context_label

MiB = 2**20
GiB = 2**30
FILES = ("long_context.md", "long_context.json", "long_context.png")
COLUMNS = (
    "N", "method", "prefill s", "decode tok/s", "peak MiB", "KV cache MiB",
    f"prefill vs {BASELINE}", f"decode vs {BASELINE}", f"peak vs {BASELINE}",
)  # fmt: skip
ERROR_CELL = 120  # characters of an error shown in the table (all of it is in the JSON)
COLUMN_NOTES = f"""\
- **prefill s**: seconds to run the N-token prompt into a new cache (last position's logits).
- **decode tok/s**: tokens per second once the prompt is in, over the batch: its size over the
  median of the timed decode steps.
- **peak MiB**: the most memory the run allocates above what was resident before it, so the
  weights are not counted (GPU memory on CUDA, resident memory on the CPU): the larger of the
  prefill's peak and the cache plus what the decode steps add.
- **KV cache MiB**: the cache's bytes after decoding (KVpop's include the tokens' positions,
  priorities and the scorer's state).
- **vs {BASELINE}**: the figure over the {METHODS[BASELINE]}'s at the same N: decode above 1x
  is faster; prefill and peak below 1x take less."""


def table(header: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _number(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _mib(nbytes: int | None) -> str:
    return "–" if nbytes is None else f"{nbytes / MiB:,.1f}"


def _cells(result: BenchResult, row: Row) -> list[str]:
    head = [context_label(row.context), METHODS[row.method]]
    if row.error is not None:
        error = row.error.splitlines()[0].replace("|", "\\|")
        if len(error) > ERROR_CELL:
            error = error[: ERROR_CELL - 1] + "…"
        return [*head, f"failed: {error}", *["–"] * (len(COLUMNS) - 3)]
    ratios = result.ratios(row)
    return [
        *head,
        _number(row.prefill_s, ".3f"),
        _number(row.decode_tok_s, ".1f"),
        _mib(row.peak_bytes),
        _mib(row.kv_bytes),
        _number(ratios["prefill"], ".2f", "x"),
        _number(ratios["decode"], ".2f", "x"),
        _number(ratios["peak"], ".2f", "x"),
    ]


def bench_table(result: BenchResult) -> str:
    """One row per context and method."""
    return table(COLUMNS, [_cells(result, row) for row in result.rows])


def bench_setup(result: BenchResult) -> str:
    """What ran, where, and how it was measured, in a paragraph."""
    settings, budget = result.settings, result.settings.kvpop_config
    layers = f"{result.layers} layer{'s' if result.layers > 1 else ''}"
    steps = f"untimed one{'s' if settings.warmup > 1 else ''}"
    return (
        f"{result.model}: {layers}, {result.dtype}, {result.weights_bytes / GiB:.2f} GiB of "
        f"weights; batch {settings.batch} on {result.device}. torch {torch.__version__}, "
        f"transformers {transformers.__version__}, kvpop_compile {__version__}, Python "
        f"{platform.python_version()}. KVpop: capacity {budget.capacity} ({budget.sinks} sinks, "
        f"window {budget.window}, pool {budget.topk}; `{budget.scorer.value}` scorer), prompts in "
        f"chunks of {budget.chunk_length}. A random prompt of N tokens, then the median of "
        f"{settings.decode_tokens} timed decode steps after {settings.warmup} {steps} "
        "(compilation happens there)."
    )


def bench_markdown(result: BenchResult, plot: str | None = None) -> str:
    """The report: setup, table, what the columns mean, notes and the plot (a file name in the
    same folder), or why there is none."""
    parts = ["# Long context: transformers' caches against KVpop", bench_setup(result),
             bench_table(result), COLUMN_NOTES, *result.notes]  # fmt: skip
    if plot is not None:
        parts.append(f"![prefill, decode and memory against N]({plot})")
    else:
        parts.append("Plot skipped: matplotlib is not installed (`pip install matplotlib`).")
    return "\n\n".join(parts) + "\n"


def bench_json(result: BenchResult) -> dict:
    """Every figure, the decode steps' seconds included, and the settings."""
    settings = asdict(result.settings)
    settings["kvpop_config"]["scorer"] = result.settings.kvpop_config.scorer.value
    rows = []
    for row in result.rows:
        ratios = result.ratios(row)
        rows.append(
            {**asdict(row), "label": METHODS[row.method], "decode_tok_s": row.decode_tok_s,
             **{f"{name}_vs_{BASELINE}": value for name, value in ratios.items()}}
        )  # fmt: skip
    return {
        "model": result.model, "layers": result.layers, "dtype": result.dtype,
        "device": result.device, "weights_bytes": result.weights_bytes, "settings": settings,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "kvpop_compile": __version__, "python": platform.python_version()},
        "notes": result.notes, "rows": rows,
    }  # fmt: skip


def plot_bench(result: BenchResult, path: Path) -> bool:
    """Prefill seconds, decode tokens/s and peak MiB against N, a line per method, into the PNG
    ``path`` (atomically); ``False`` without matplotlib."""
    try:
        from ..plotting import pyplot

        plt = pyplot()
    except ImportError:
        return False
    panels = (
        ("prefill", "prefill seconds", lambda row: row.prefill_s),
        ("decode", "decode tokens / s", lambda row: row.decode_tok_s),
        ("peak memory", "peak MiB above the weights",
         lambda row: None if row.peak_bytes is None else row.peak_bytes / MiB),
    )  # fmt: skip
    contexts = list(result.settings.contexts)
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (title, label, value) in zip(axes, panels, strict=True):
        ys = []
        for method in result.settings.methods:
            points = [(n, value(row)) for n in contexts if (row := result.row(n, method))]
            points = [(n, y) for n, y in points if y is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=METHODS[method])
                ys += [y for _, y in points]
        if len(contexts) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [context_label(n) for n in contexts])
        ax.minorticks_off()
        # Full caches grow with N and KVpop's does not: past a 20x spread only a log axis
        # shows both.
        if ys and min(ys) > 0 and max(ys) > 20 * min(ys):
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.set_xlabel("tokens in the prompt (N)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    atomic_write(path, lambda temporary: figure.savefig(temporary, dpi=110, format="png"))
    plt.close(figure)
    return True


def write_bench(result: BenchResult, out: str | Path) -> list[Path]:
    """Write ``long_context.md``, ``long_context.json`` and ``long_context.png`` (when
    matplotlib is installed) into the folder ``out``, each atomically; returns the files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    markdown, data, image = (out / name for name in FILES)
    plotted = plot_bench(result, image)
    document = bench_markdown(result, image.name if plotted else None)
    atomic_write(markdown, lambda temporary: Path(temporary).write_text(document))
    text = json.dumps(bench_json(result), indent=1) + "\n"
    atomic_write(data, lambda temporary: Path(temporary).write_text(text))
    return [markdown, data, *([image] if plotted else [])]

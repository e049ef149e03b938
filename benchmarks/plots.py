"""PNG plots for the benchmark results (matplotlib, a dependency of the package).

Without matplotlib every drawer returns ``False`` and the suite writes its tables only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Series:
    """One line: ``y`` (with error bars ``err``, same length) over ``x``."""

    label: str
    x: list[float]
    y: list[float]
    err: list[float] | None = None


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _tick(x: float) -> str:
    return f"{int(x) // 1024}k" if x >= 1024 and int(x) % 1024 == 0 else f"{x:g}"


def line_plot(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: list[Series],
    *,
    logx: bool = True,
    logy: bool = False,
) -> bool:
    """Draw ``series`` as lines with error bars into ``path``; ``False`` without matplotlib."""
    if not matplotlib_available():
        return False
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or opened
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for line in series:
        if not line.x:
            continue
        axes.errorbar(line.x, line.y, yerr=line.err, marker="o", capsize=3, label=line.label)
    if logx:
        axes.set_xscale("log", base=2)
        ticks = sorted({x for line in series for x in line.x})
        axes.set_xticks(ticks, [_tick(x) for x in ticks])
        axes.xaxis.set_minor_locator(NullLocator())
    if logy:
        axes.set_yscale("log")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True

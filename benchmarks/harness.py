"""What every benchmark family shares: timing, peak memory, the model shapes and the report.

Timing is the median of several timed runs after a warm-up, with half the range as the spread;
absolute times are noisy on shared machines, so every family reports ratios between paths
measured in the same process, one right after the other.

Peak memory is the process's peak resident set (``VmHWM``), reset before the measured region
through ``/proc/self/clear_refs``, minus what stays resident once the measured objects are
freed: memory a path holds and allocates while it runs, whatever allocates it (C++ kernels
included), and not the weights or libraries every path shares. The meter, the model shapes and
the table format live in :mod:`kvpop_compile.evaluation`, which ``kvpop-compile bench`` uses
too.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvpop_compile.atomic import atomic_write

# Shared with `kvpop-compile bench`, so they live in the package (the wheel has no benchmarks/).
from kvpop_compile.evaluation.bench.model_shapes import SHAPES, qwen3_model
from kvpop_compile.evaluation.bench.peak_memory import PeakMemory, peak_memory_supported
from kvpop_compile.evaluation.bench.report import table
from kvpop_compile.evaluation.bench.settings import context_label

__all__ = [
    "SHAPES", "Measured", "MiB", "PeakMemory", "Section", "Target", "Timing", "context_label",
    "interleave", "measure", "mib", "peak_memory_supported", "qwen3_model", "table",
]  # fmt: skip

MiB = 2**20


@dataclass(frozen=True)
class Timing:
    """Seconds per call of each timed run."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Half the range of the runs."""
        return (max(self.samples) - min(self.samples)) / 2

    def ms(self) -> str:
        """``median ± spread`` in milliseconds, for a table cell."""
        return f"{self.median * 1e3:.2f} ± {self.spread * 1e3:.2f}"

    def seconds(self) -> str:
        return f"{self.median:.3f} ± {self.spread:.3f}"


def measure(fn: Callable[[], object], *, warmup: int, repeats: int, calls: int = 1) -> Timing:
    """Call ``fn`` ``warmup`` times, then time ``repeats`` runs of ``calls`` calls each."""
    if repeats < 1 or calls < 1 or warmup < 0:
        raise ValueError(
            f"need repeats >= 1, calls >= 1 and warmup >= 0; got {repeats}, {calls}, {warmup}"
        )
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return Timing(tuple(samples))


@dataclass(frozen=True)
class Measured:
    """A call's timing and, where measured, its peak memory in bytes (the largest of its runs)."""

    timing: Timing
    peak_bytes: int | None = None


def interleave(
    calls: dict, *, repeats: int, calls_per_run: int = 1, peak: bool = False
) -> dict[object, Measured]:
    """Time ``repeats`` runs of ``calls_per_run`` calls of every entry of ``calls``, round-robin:
    run r of each entry before run r + 1 of any, so that a slow spell on a shared machine falls
    on all of them alike and their ratios hold. With ``peak``, each run's peak memory too."""
    if repeats < 1:
        raise ValueError(f"need repeats >= 1, got {repeats}")
    samples: dict[object, list[float]] = {key: [] for key in calls}
    peaks: dict[object, int | None] = dict.fromkeys(calls)
    for _ in range(repeats):
        for key, fn in calls.items():
            with PeakMemory() if peak else contextlib.nullcontext() as memory:
                samples[key] += measure(fn, warmup=0, repeats=1, calls=calls_per_run).samples
            run_peak = memory.settle() if peak else None  # the call's outputs are freed by now
            if run_peak is not None:
                peaks[key] = max(run_peak, peaks[key] or 0)
    return {key: Measured(Timing(tuple(samples[key])), peaks[key]) for key in calls}


def mib(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / MiB:,.1f}"


@dataclass
class Target:
    """One of the issue's targets, judged on this run's measurements."""

    name: str
    met: bool
    measured: str  # the measured figure, e.g. "2.1x at 32k"
    note: str = ""  # what limits it, when missed

    def line(self) -> str:
        verdict = "met" if self.met else "missed"
        note = f" {self.note}" if self.note else ""
        return f"- **{self.name}**: {verdict} — {self.measured}.{note}"


@dataclass
class Section:
    """One benchmark family's results: prose, tables, plots, targets and raw data."""

    title: str
    method: str  # markdown: how it was measured
    tables: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: dict[str, Callable[[Path], bool]] = field(default_factory=dict)  # file -> drawer
    targets: list[Target] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def markdown(self, plotted: list[str]) -> str:
        parts = [f"## {self.title}", self.method, *self.tables]
        parts += [note for note in self.notes]
        parts += [f"![{name}]({name})" for name in plotted]
        if self.targets:
            parts.append("\n".join(target.line() for target in self.targets))
        return "\n\n".join(parts)


def write_report(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` whole (its folder made if need be) and print it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: Path(tmp).write_text(text))
    print(text)

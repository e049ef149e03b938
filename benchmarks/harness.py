"""What every benchmark family shares: timing, peak memory, the model shapes and the report.

Timing is the median of several timed runs after a warm-up, with half the range as the spread;
absolute times are noisy on shared machines, so every family reports ratios between paths
measured in the same process, one right after the other.

Peak memory is the process's peak resident set (``VmHWM``), reset before the measured region
through ``/proc/self/clear_refs``, minus what stays resident once the measured objects are
freed: memory a path holds and allocates while it runs, whatever allocates it (C++ kernels
included), and not the weights or libraries every path shares.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

MiB = 2**20

# Qwen3 layer shapes: Qwen3-0.6B's attention and MLP, and a tiny one for --quick.
SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
}  # fmt: skip


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


def _status_kib(field_name: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field_name}:\s+(\d+) kB", text, re.MULTILINE).group(1))


def _release_free_heap() -> None:
    # Freed blocks below glibc's mmap threshold stay resident in the heap; trimming returns
    # them, so the resident size after a measurement counts live memory only.
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20


def _fix_mmap_threshold() -> None:
    # glibc raises its mmap threshold each time a large block is freed, after which large
    # tensors come from the heap and their pages may stay resident; how much depends on the
    # order of earlier allocations. A fixed threshold maps every tensor of 1 MiB or more on its
    # own and returns it when freed, so a peak reflects the memory a path needs, not history.
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass


def peak_memory_supported() -> bool:
    """Whether this process can reset and read its peak resident set (Linux ≥ 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _status_kib("VmHWM")
    except (OSError, AttributeError):
        return False
    return True


class PeakMemory:
    """Peak resident memory of a region, in bytes.

    ``with PeakMemory() as peak: ...`` resets the peak on entry. :meth:`growth` is the peak above
    the resident size at entry; :meth:`settle`, called once the region's objects are freed, the
    peak above what stays resident. Both are ``None`` where the peak cannot be read (not Linux).
    """

    def __init__(self):
        self.supported = peak_memory_supported()
        if self.supported:
            _fix_mmap_threshold()
        self.start_kib: int | None = None
        self.peak_kib: int | None = None
        self.bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.supported:
            _release_free_heap()
            self.start_kib = _status_kib("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")
        return self

    def __exit__(self, *exc) -> None:
        if self.supported:
            self.peak_kib = _status_kib("VmHWM")

    def growth(self) -> int | None:
        """The peak above the resident size when the region began."""
        if self.peak_kib is None:
            return None
        return max(0, self.peak_kib - self.start_kib) * 1024

    def settle(self) -> int | None:
        """Record the peak above the resident size now (call after freeing the region's data)."""
        if self.peak_kib is None:
            return None
        _release_free_heap()
        self.bytes = max(0, self.peak_kib - _status_kib("VmRSS")) * 1024
        return self.bytes


def mib(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / MiB:,.1f}"


def context_label(n: int) -> str:
    """``1024 -> '1k'``, ``32768 -> '32k'``; other sizes as they are."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


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


def qwen3_model(
    shape: str,
    *,
    layers: int,
    vocab: int,
    max_positions: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
):
    """A Qwen3 with ``SHAPES[shape]`` layers and random weights, in eval mode, created directly
    on ``device`` in ``dtype``. The same ``seed`` gives the same weights, so a baseline and a
    transformed copy compute the same function."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}; got {shape!r}")
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        num_hidden_layers=layers,
        max_position_embeddings=max_positions,
        attn_implementation="sdpa",
        **SHAPES[shape],
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return Qwen3ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)

"""Target pass: the transposed future-attention target against the dense reference and against
one attention forward, N from 1k to 32k.

All three run eager, in float32, on one KV-head group of Qwen3-0.6B (2 query heads sharing one
KV head, head_dim 128): every one of them is a loop over heads, so the ratios are those of the
full 16/8-head layer at an eighth of the time. "One attention forward" is torch's
``scaled_dot_product_attention`` with ``is_causal=True``. The target takes each query's
log-sum-exp from the forward pass; it is computed once per N, outside the timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvpop_compile.runtime import (
    future_attention_target,
    future_attention_target_dense,
    masked_attention,
)

from .harness import (
    Measured,
    MiB,
    Section,
    Target,
    context_label,
    interleave,
    measure,
    mib,
    table,
)
from .plots import Series, line_plot

TRANSPOSED, DENSE, ATTENTION = "transposed target", "dense target", "attention forward (SDPA)"
FUNCTIONS = (TRANSPOSED, DENSE, ATTENTION)


@dataclass(frozen=True)
class Settings:
    lengths: tuple[int, ...]
    query_heads: int
    kv_heads: int
    head_dim: int
    window: int  # the target's delay W
    repeats: int
    warmup: int  # untimed calls at the smallest N
    dense_limit_bytes: int  # skip the dense reference once one (Hq, N, N) float32 map exceeds it


FULL = Settings(
    lengths=(1024, 2048, 4096, 8192, 16384, 32768),
    query_heads=2,
    kv_heads=1,
    head_dim=128,
    window=256,
    repeats=3,
    warmup=1,
    dense_limit_bytes=2**30,
)
QUICK = Settings(
    lengths=(128, 256),
    query_heads=2,
    kv_heads=1,
    head_dim=16,
    window=16,
    repeats=2,
    warmup=1,
    dense_limit_bytes=2**30,
)


def _inputs(settings: Settings, n: int, generator: torch.Generator):
    """``q (1, Hq, N, D)``, ``k, v (1, Hkv, N, D)`` and the forward's ``lse (1, Hq, N)``."""
    q = torch.randn(1, settings.query_heads, n, settings.head_dim, generator=generator)
    k, v = torch.randn(2, 1, settings.kv_heads, n, settings.head_dim, generator=generator)
    scale = settings.head_dim**-0.5
    _, lse = masked_attention(q, k, v, None, scale=scale)
    return q, k, v, lse, scale


def _calls(settings: Settings, n: int, generator: torch.Generator) -> dict:
    q, k, v, lse, scale = _inputs(settings, n, generator)
    window = settings.window
    calls = {
        TRANSPOSED: lambda: future_attention_target(q, k, lse, window=window, scale=scale),
        ATTENTION: lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=True
        ),
    }
    if settings.query_heads * n * n * 4 <= settings.dense_limit_bytes:
        calls[DENSE] = lambda: future_attention_target_dense(q, k, window=window, scale=scale)
    return calls


def run(settings: Settings) -> Section:
    generator = torch.Generator().manual_seed(0)
    results: dict[tuple[str, int], Measured] = {}
    with torch.no_grad():
        for call in _calls(settings, settings.lengths[0], generator).values():
            measure(call, warmup=settings.warmup, repeats=1)  # thread pools, allocator, caches
        for n in settings.lengths:
            measured = interleave(
                _calls(settings, n, generator), repeats=settings.repeats, peak=True
            )
            results.update({(name, n): m for name, m in measured.items()})
    return _report(settings, results)


def _cell(results, name: str, n: int, *, memory: bool) -> str:
    if (name, n) not in results:
        return "skipped (N×N map too large)"
    result = results[name, n]
    return f"{mib(result.peak_bytes)}" if memory else result.timing.seconds()


def _report(settings: Settings, results: dict[tuple[str, int], Measured]) -> Section:
    lengths = settings.lengths
    header = ["N", *FUNCTIONS, "transposed / attention"]
    rows, memory_rows = [], []
    for n in lengths:
        ratio = results[TRANSPOSED, n].timing.median / results[ATTENTION, n].timing.median
        rows.append(
            [
                context_label(n),
                *(_cell(results, f, n, memory=False) for f in FUNCTIONS),
                f"{ratio:.2f}x",
            ]
        )
        memory_rows.append(
            [context_label(n), *(_cell(results, f, n, memory=True) for f in FUNCTIONS)]
        )
    section = Section(
        title="Target pass",
        method=(
            f"Eager, float32, batch 1, {settings.query_heads} query heads sharing "
            f"{settings.kv_heads} KV head, head_dim {settings.head_dim} (one KV-head group of "
            f"Qwen3-0.6B: time and memory scale with the number of groups alike for all three), "
            f"window {settings.window}. Seconds per call, median ± half the range of "
            f"{settings.repeats} runs after a warm-up. The dense reference runs while one "
            f"(Hq, N, N) float32 map is at most {mib(settings.dense_limit_bytes)} MiB."
        ),
        tables=[
            table(header, rows),
            "Peak memory, MiB above what stays resident after the call (the inputs and the "
            "forward's log-sum-exp excluded):",
            table(["N", *FUNCTIONS], memory_rows),
        ],
        data={
            f"{f}@{n}": {"s": list(r.timing.samples), "peak_bytes": r.peak_bytes}
            for (f, n), r in results.items()
        },
    )
    section.plots = {
        "target_time.png": lambda path: _plot(settings, results, path, memory=False),
        "target_memory.png": lambda path: _plot(settings, results, path, memory=True),
    }
    section.targets = _targets(settings, results)
    return section


def _plot(settings, results, path, *, memory: bool) -> bool:
    series = []
    for name in FUNCTIONS:
        lengths = [n for n in settings.lengths if (name, n) in results]
        measured = [results[name, n] for n in lengths]
        if memory:
            if any(r.peak_bytes is None for r in measured):
                return False
            series.append(Series(name, lengths, [r.peak_bytes / MiB for r in measured]))
        else:
            series.append(
                Series(
                    name,
                    lengths,
                    [r.timing.median for r in measured],
                    [r.timing.spread for r in measured],
                )
            )
    if memory:
        return line_plot(path, "Target pass memory", "N", "peak MiB", series, logy=True)
    return line_plot(path, "Target pass time", "N", "seconds", series, logy=True)


def _targets(settings: Settings, results) -> list[Target]:
    longest, previous = settings.lengths[-1], settings.lengths[-2]
    ratio = results[TRANSPOSED, longest].timing.median / results[ATTENTION, longest].timing.median
    targets = [
        Target(
            "target pass time ≤ 1.5x one attention forward",
            ratio <= 1.5,
            f"{ratio:.2f}x at N = {context_label(longest)}",
            "" if ratio <= 1.5 else _time_note(settings, results, longest),
        )
    ]
    peak, before = results[TRANSPOSED, longest].peak_bytes, results[TRANSPOSED, previous].peak_bytes
    if peak is not None and before:
        growth = peak / before
        scale = longest / previous
        targets.append(
            Target(
                "target pass memory linear in N (no N² allocation)",
                growth <= scale * 1.25,
                f"{mib(peak)} MiB at N = {context_label(longest)}, ×{growth:.2f} from "
                f"{context_label(previous)} (linear: ×{scale:g}, quadratic: ×{scale**2:g})",
            )
        )
    return targets


def _time_note(settings: Settings, results, n: int) -> str:
    dense = [m for m in settings.lengths if (DENSE, m) in results]
    versus_dense = ""
    if dense:
        m = dense[-1]
        speed = results[DENSE, m].timing.median / results[TRANSPOSED, m].timing.median
        versus_dense = f" It is {speed:.1f}x as fast as the dense reference at {context_label(m)}."
    return (
        "The transposed pass measured here is the plain-PyTorch reference, eager: per block of "
        "64 queries it writes a (keys × 64) block of log-probabilities per query head, then "
        "masks it, reduces it with logsumexp and folds it in with logaddexp, each a separate "
        "pass over the block in memory, while SDPA's CPU kernel is one fused flash-attention "
        "kernel. Its arithmetic is half an attention forward's (no product with the values); "
        "the Triton kernel of the target runs on CUDA only and is not measured on this CPU."
        + versus_dense
    )

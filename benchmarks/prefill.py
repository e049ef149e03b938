"""Prefill: a KVpop prefill of N tokens against a full-attention prefill of the same model.

Both run as ``generate()`` runs them, eager, computing only the last position's logits
(``logits_to_keep=1``): transformers' model with SDPA attention and its default dynamic cache,
and the same weights transformed, prefilling a KVpop cache in chunks of the capacity (each chunk
continues the cache exactly: scores from the scorer's parallel form, eviction steps from the
chunked rule, attention under the eviction mask over the cache plus the chunk). The KVpop peak
must not grow with N; full attention's grows with its cache. Full attention runs up to a shorter
length than KVpop: its quadratic prefill would dominate the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

import kvpop_compile as kc
from kvpop_compile.runtime import build_scorer

from .harness import (
    SHAPES,
    Measured,
    Section,
    Target,
    context_label,
    interleave,
    measure,
    mib,
    qwen3_model,
    table,
)
from .plots import Series, line_plot

FULL_ATTENTION, KVPOP = "full attention (SDPA, dynamic cache)", "KVpop prefill"
SCORER = "scorer parallel form, one layer"
FLAT_WITHIN = 0.10  # KVpop's peak may vary this much from the shortest to the longest prompt
MAX_SLOWDOWN = 2.0  # KVpop / full-attention prefill time at the comparison length


@dataclass(frozen=True)
class Settings:
    shape: str
    layers: int
    vocab: int
    lengths: tuple[int, ...]  # KVpop prompts
    full_lengths: tuple[int, ...]  # full-attention prompts (a prefix of `lengths`)
    compare_at: int  # the length of the time-ratio target
    kvpop_config: kc.KVpopConfig
    repeats: int
    warmup: int  # untimed prefills at the smallest N


FULL = Settings(
    "qwen3-0.6b",
    layers=2,
    vocab=512,
    lengths=(8192, 16384, 32768, 65536),
    full_lengths=(8192, 16384, 32768),
    compare_at=32768,
    kvpop_config=kc.KVpopConfig(sinks=4, window=256, topk=3836),
    repeats=1,
    warmup=1,
)
QUICK = Settings(
    "tiny",
    layers=2,
    vocab=256,
    lengths=(64, 160, 320),
    full_lengths=(64, 160),
    compare_at=160,
    kvpop_config=kc.KVpopConfig(sinks=4, window=16, topk=44),
    repeats=2,
    warmup=1,
)


def _prefills(settings: Settings):
    """``{name: prefill(input_ids)}`` for the two models (same weights)."""
    max_positions = 2 * max(*settings.lengths, settings.kvpop_config.capacity)
    build = dict(layers=settings.layers, vocab=settings.vocab, max_positions=max_positions)
    baseline = qwen3_model(settings.shape, **build)
    model = kc.transform(qwen3_model(settings.shape, **build), settings.kvpop_config)
    return {
        FULL_ATTENTION: lambda ids: baseline(input_ids=ids, use_cache=True, logits_to_keep=1),
        KVPOP: lambda ids: kc.prefill(model, ids, kc.new_cache(model)),
    }


def run(settings: Settings) -> Section:
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, settings.vocab, (1, max(settings.lengths)), generator=generator)
    results: dict[tuple[str, int], Measured] = {}
    with torch.no_grad():
        prefills = _prefills(settings)
        for prefill in prefills.values():
            warm = prompt[:, : settings.lengths[0]]
            measure(lambda: prefill(warm), warmup=settings.warmup, repeats=1)  # noqa: B023
        for n in settings.lengths:
            ids = prompt[:, :n]
            # Each call's output and the cache it fills are freed before the next.
            calls = {
                name: partial(prefill, ids)
                for name, prefill in prefills.items()
                if name == KVPOP or n in settings.full_lengths
            }
            measured = interleave(calls, repeats=settings.repeats, peak=True)
            results.update({(name, n): m for name, m in measured.items()})
        results[SCORER, settings.lengths[-1]] = _measure_scorer(settings, generator)
    return _report(settings, results)


def _measure_scorer(settings: Settings, generator: torch.Generator) -> Measured:
    """The scorer's parallel form alone, for one layer at the longest N: the part of a KVpop
    prefill that a full-attention prefill does not have, besides the eviction steps."""
    shape = SHAPES[settings.shape]
    kv_heads, head_dim = shape["num_key_value_heads"], shape["head_dim"]
    scorer = build_scorer(settings.kvpop_config, num_kv_heads=kv_heads, head_dim=head_dim).eval()
    n = settings.lengths[-1]
    raw_k, v = torch.randn(2, 1, kv_heads, n, head_dim, generator=generator)
    window = settings.kvpop_config.window
    call = partial(scorer.score_sequence, raw_k, v, window)
    return interleave({SCORER: call}, repeats=settings.repeats, peak=True)[SCORER]


def _report(settings: Settings, results: dict[tuple[str, int], Measured]) -> Section:
    names = (FULL_ATTENTION, KVPOP)
    rows = []
    for n in settings.lengths:
        full, kvpop = results.get((FULL_ATTENTION, n)), results[KVPOP, n]
        rows.append(
            [
                context_label(n),
                full.timing.seconds() if full else "not run",
                kvpop.timing.seconds(),
                f"{kvpop.timing.median / full.timing.median:.2f}x" if full else "",
                mib(full.peak_bytes) if full else "",
                mib(kvpop.peak_bytes),
            ]
        )
    config = settings.kvpop_config
    section = Section(
        title="Prefill",
        method=(
            f"One N-token prompt, eager, batch 1, float32, Qwen3 with {settings.layers} layers of "
            f"`{settings.shape}` shapes, only the last position's logits; KVpop capacity "
            f"{config.capacity} (`{config.scorer.value}` scorer), prompts in chunks of "
            f"{config.chunk_length}. Seconds, median ± half the range of {settings.repeats} "
            "run(s) after a warm-up; peak memory above what stays resident after the call (the "
            "filled cache is freed with the output)."
        ),
        tables=[
            table(
                [
                    "N",
                    f"{FULL_ATTENTION} s",
                    f"{KVPOP} s",
                    "KVpop / full",
                    "full peak MiB",
                    "KVpop peak MiB",
                ],
                rows,
            )
        ],
        data={
            f"{name}@{n}": {"s": list(r.timing.samples), "peak_bytes": r.peak_bytes}
            for (name, n), r in results.items()
        },
    )
    n = settings.lengths[-1]
    scorer, kvpop = results[SCORER, n], results[KVPOP, n]
    section.notes.append(
        f"At N = {context_label(n)} the `{config.scorer.value}` scorer's parallel form alone "
        f"takes {scorer.timing.median:.3f} s and {mib(scorer.peak_bytes)} MiB per layer "
        f"({settings.layers * scorer.timing.median / kvpop.timing.median:.0%} of the KVpop "
        f"prefill's time over its {settings.layers} layers)."
    )
    section.targets = _targets(settings, results)
    section.plots = {"prefill.png": lambda path: _plot(settings, results, names, path)}
    return section


def _targets(settings: Settings, results) -> list[Target]:
    targets = []
    peaks = [results[KVPOP, n].peak_bytes for n in settings.lengths]
    if None not in peaks:
        spread = (max(peaks) - min(peaks)) / min(peaks)
        first, last = context_label(settings.lengths[0]), context_label(settings.lengths[-1])
        targets.append(
            Target(
                f"KVpop prefill peak memory flat within {FLAT_WITHIN:.0%} from {first} to {last}",
                spread <= FLAT_WITHIN,
                f"{mib(min(peaks))}-{mib(max(peaks))} MiB, {spread:.1%} apart",
            )
        )
    n = settings.compare_at
    ratio = results[KVPOP, n].timing.median / results[FULL_ATTENTION, n].timing.median
    targets.append(
        Target(
            f"KVpop prefill ≤ {MAX_SLOWDOWN:g}x full attention's at {context_label(n)}",
            ratio <= MAX_SLOWDOWN,
            f"{ratio:.2f}x",
        )
    )
    return targets


def _plot(settings: Settings, results, names, path) -> bool:
    series = []
    for name in names:
        lengths = [n for n in settings.lengths if (name, n) in results]
        series.append(
            Series(
                name,
                lengths,
                [results[name, n].timing.median for n in lengths],
                [results[name, n].timing.spread for n in lengths],
            )
        )
    return line_plot(path, "Prefill", "prompt tokens", "seconds", series, logy=True)

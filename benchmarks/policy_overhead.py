"""Policy overhead: what scoring and eviction add to a decode step.

Two steps on one layer's bounded cache of the same capacity, full and past it: the KVpop step
(``decode_step``: scorer update, score of the token leaving the window, the cache update that
evicts it and writes the new token, attend) and a plain static-cache step (write the token into
its slot with plain PyTorch indexing, as a static cache does; attend over the same slots). The
difference is the policy and nothing else: same cache, same attention op.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

import kvpop_compile as kc
from kvpop_compile.runtime import (
    BoundedCacheState,
    build_scorer,
    decode_step,
    leaving_token,
    update_state_,
)
from kvpop_compile.runtime.reference.update_cache import write_new_token_

from .cache_fill import fill_bounded_state
from .harness import SHAPES, Section, Target, Timing, context_label, interleave, table

KVPOP, PLAIN = "KVpop step", "plain step"
SCORE, EVICT = "scorer update + score", "evict + write"


@dataclass(frozen=True)
class Settings:
    shape: str  # a key of harness.SHAPES: the attention's heads and head_dim
    kvpop_config: kc.KVpopConfig
    context: int  # tokens seen before the timed steps (past capacity: every step evicts)
    steps: int  # steps per timed run
    repeats: int
    warmup: int
    compiled: bool  # also measure both steps under torch.compile (fullgraph)


FULL = Settings(
    "qwen3-0.6b",
    kc.KVpopConfig(sinks=4, window=256, topk=3836),
    context=32768,
    steps=50,
    repeats=7,
    warmup=10,
    compiled=True,
)
QUICK = Settings(
    "tiny",
    kc.KVpopConfig(sinks=4, window=16, topk=44),
    context=160,
    steps=5,
    repeats=2,
    warmup=1,
    compiled=False,
)


def _plain_step(state: BoundedCacheState, q, k, raw_k, v, *, config: kc.KVpopConfig, scale):
    """A static-cache decode step on the same slots: write the token, attend. No scoring and
    no eviction: the token in the ring slot is simply overwritten."""
    write_new_token_(
        state.keys, state.values, state.positions, state.window_keys, state.statistic,
        state.seen, k, raw_k, v, config.sinks, config.topk, config.window,
    )  # fmt: skip
    out, _ = torch.ops.kvpop.decode_attention(
        q, state.keys, state.values, state.positions, scale, False
    )
    state.seen.add_(1)
    return out


def _score(state: BoundedCacheState, q, k, raw_k, v, *, scorer, config: kc.KVpopConfig):
    """The scoring part of ``decode_step``: the scorer's recurrent update with the new token and
    the score of the token leaving the window (``kvpop::memory_scorer_step`` for ``memory``)."""
    leaving = leaving_token(state, config)
    rhat = scorer.update_and_score_(
        state.scorer_state, raw_k[:, :, 0], v[:, :, 0], leaving.raw_key, leaving.value,
        leaving.position,
    )  # fmt: skip
    state.seen.add_(1)
    return rhat


def _evict(state: BoundedCacheState, q, k, raw_k, v, *, config: kc.KVpopConfig):
    """The cache update of ``decode_step``: the leaving token against the pool's weakest entry
    (with a random priority: the comparison and the write are the same whichever wins), then
    the new token's write."""
    leaving = leaving_token(state, config)
    update_state_(state, leaving, torch.randn(leaving.position.shape), k, raw_k, v, config)
    state.seen.add_(1)


def _steps(settings: Settings, generator: torch.Generator) -> dict[tuple[str, str], object]:
    """``{(part, mode): call}``: each part on its own identically filled cache."""
    shape = SHAPES[settings.shape]
    kv_heads, head_dim = shape["num_key_value_heads"], shape["head_dim"]
    config = settings.kvpop_config
    scorer = build_scorer(config, num_kv_heads=kv_heads, head_dim=head_dim).eval()
    q = torch.randn(1, shape["num_attention_heads"], 1, head_dim, generator=generator)
    k, raw_k, v = torch.randn(3, 1, kv_heads, 1, head_dim, generator=generator)
    scale = head_dim**-0.5
    steps = {}
    for name, function in (
        (KVPOP, partial(decode_step, scorer=scorer, config=config, scale=scale)),
        (PLAIN, partial(_plain_step, config=config, scale=scale)),
        (SCORE, partial(_score, scorer=scorer, config=config)),
        (EVICT, partial(_evict, config=config)),
    ):
        state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=head_dim)
        fill_bounded_state(state, config, settings.context, torch.Generator().manual_seed(1))
        modes = {"eager": function}
        if settings.compiled:
            modes["torch.compile"] = torch.compile(function, fullgraph=True)
        for mode, call in modes.items():
            steps[name, mode] = partial(call, state, q, k, raw_k, v)
    return steps


@dataclass(frozen=True)
class ModelStep:
    """Whole-model decode figures from the decode benchmark, to put the policy in proportion."""

    layers: int
    kvpop_ms: float  # KVpop decode step (same mode as the policy's) past capacity
    at_capacity: tuple[float, float] | None = None  # (KVpop, static cache) compiled ms, both
    # holding as many tokens as KVpop's capacity


def run(settings: Settings, model: ModelStep | None = None) -> Section:
    """Time the two steps and the policy's parts (eager, and compiled if asked), interleaved."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        steps = _steps(settings, generator)
        for step in steps.values():  # compilation and warm-up
            for _ in range(settings.warmup):
                step()
        measured = interleave(steps, repeats=settings.repeats, calls_per_run=settings.steps)
    timings = {key: m.timing for key, m in measured.items()}
    return _report(settings, timings, model)


def _report(settings, timings: dict[tuple[str, str], Timing], model: ModelStep | None):
    modes = [mode for name, mode in timings if name == KVPOP]
    parts = (KVPOP, PLAIN, SCORE, EVICT)
    rows = [[name, *(timings[name, mode].ms() for mode in modes)] for name in parts]
    rows.append(["KVpop − plain (the policy)", *(f"{_policy_ms(timings, m):.3f}" for m in modes)])
    config = settings.kvpop_config
    section = Section(
        title="Policy overhead",
        method=(
            f"One attention layer of `{settings.shape}` shapes, batch 1, float32, "
            f"`{config.scorer.value}` scorer: the KVpop step (`decode_step`: scorer update, "
            "score of the token leaving the window, one cache update that evicts it and writes "
            "the new token, attend) and a plain static-cache step (write the token into its "
            "slot with PyTorch indexing, attend with the same op) on "
            f"caches of the same {config.capacity} slots, filled as after "
            f"{context_label(settings.context)} tokens (full: every KVpop step evicts); and the "
            f"policy's two parts alone. ms per step, median ± half the range of "
            f"{settings.repeats} runs of {settings.steps} steps after {settings.warmup} warm-up "
            "steps."
        ),
        tables=[table(["part", *(f"{mode} ms" for mode in modes)], rows)],
        data={
            f"{name}@{mode}": [s * 1e3 for s in t.samples] for (name, mode), t in timings.items()
        },
    )
    mode = "torch.compile" if "torch.compile" in modes else "eager"
    policy_ms = _policy_ms(timings, mode)
    plain_ms = timings[PLAIN, mode].median * 1e3
    share = policy_ms / plain_ms
    measured = f"{share:.1%} of the layer's plain cache step ({mode})"
    if model is not None:
        share = policy_ms * model.layers / model.kvpop_ms
        section.notes.append(
            f"In a whole decode step ({model.layers} layers, KVpop {mode}: {model.kvpop_ms:.2f} "
            f"ms per token in the decode benchmark) the policy takes "
            f"{policy_ms * model.layers:.3f} ms, {share:.1%} of the step."
        )
        measured = f"{share:.1%} of a whole decode step; " + measured
    if model is not None and model.at_capacity is not None:
        kvpop_ms, static_ms = model.at_capacity
        section.notes.append(
            f"Whole model, both compiled and holding {config.capacity} tokens (the decode "
            f"benchmark's {context_label(config.capacity)} column): KVpop {kvpop_ms:.2f} ms, "
            f"static cache {static_ms:.2f} ms per token ({kvpop_ms / static_ms - 1:+.1%}); this "
            "also compares two attention implementations, not the policy alone."
        )
    met = share <= 0.03
    note = "" if met else _limit_note(timings, modes)
    section.targets = [Target("policy overhead ≤ 3% of a decode step", met, measured, note)]
    return section


def _policy_ms(timings, mode: str) -> float:
    return (timings[KVPOP, mode].median - timings[PLAIN, mode].median) * 1e3


def _limit_note(timings, modes: list[str]) -> str:
    """Which part of the policy costs most, and whether compilation made it slower."""
    mode = modes[-1]
    score, evict = (timings[part, mode].median * 1e3 for part in (SCORE, EVICT))
    note = (
        f"Alone ({mode}), scoring takes {score:.3f} ms and the cache update (evict + write) "
        f"{evict:.3f} ms per step."
    )
    if len(modes) > 1:
        eager = timings[EVICT, "eager"].median * 1e3
        if evict > 2 * eager:
            # A regression check: Inductor once compiled the evict's in-place update as a copy
            # of the whole cache; the generated code is where to look.
            note += (
                f" Compiled eviction is {evict / eager:.1f}x slower than eager ({eager:.3f} ms): "
                "look for copies of the cache tensors in Inductor's generated code."
            )
    return note

"""Decode at long context: per-token latency and memory of five decode paths, 1k to 32k tokens.

The paths are what a user would run: transformers' default dynamic cache (eager), transformers'
static cache under ``torch.compile`` (the baseline every ratio is taken against), and KVpop
eager, compiled with ``kc.compile`` and through the AOTInductor engine. Each holds a cache of
N tokens (filled directly, see :mod:`benchmarks.cache_fill`) and the next decode steps are
timed; KVpop holds at most its capacity whatever N is.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import kvpop_compile as kc
from kvpop_compile.engines.steps import STATE_FIELDS
from kvpop_compile.kv_cache import cache_bytes
from kvpop_compile.runtime import BoundedCacheState

from .cache_fill import (
    fill_bounded_state,
    filled_dynamic_cache,
    filled_static_cache,
)
from .harness import (
    MiB,
    PeakMemory,
    Section,
    Target,
    Timing,
    context_label,
    interleave,
    mib,
    qwen3_model,
    table,
)
from .plots import Series, line_plot

DYNAMIC, STATIC = "dynamic cache, eager", "static cache, torch.compile"
KVPOP_EAGER, KVPOP_COMPILED, KVPOP_AOTI = "KVpop, eager", "KVpop, kc.compile", "KVpop, AOTInductor"
PATHS = (DYNAMIC, STATIC, KVPOP_EAGER, KVPOP_COMPILED, KVPOP_AOTI)
TOKEN = torch.zeros(1, 1, dtype=torch.int64)  # the token fed at every step (batch 1)


@dataclass(frozen=True)
class Settings:
    shape: str  # a key of harness.SHAPES
    layers: int
    vocab: int
    contexts: tuple[int, ...]  # tokens held before the timed steps
    kvpop_config: kc.KVpopConfig
    steps: int  # decode steps per timed run
    repeats: int  # timed runs
    warmup: int  # untimed steps first (compilation happens here)
    paths: tuple[str, ...] = PATHS


FULL = Settings(
    "qwen3-0.6b", layers=2, vocab=512, contexts=(1024, 4096, 16384, 32768),
    kvpop_config=kc.KVpopConfig(sinks=4, window=256, topk=3836), steps=5, repeats=5, warmup=3,
)  # fmt: skip
# Compilation alone takes longer than a CI check should: --quick runs the eager paths.
QUICK = Settings(
    "tiny", layers=2, vocab=256, contexts=(32, 160),
    kvpop_config=kc.KVpopConfig(sinks=4, window=16, topk=44), steps=2, repeats=2, warmup=1,
    paths=(DYNAMIC, KVPOP_EAGER),
)  # fmt: skip


class DecodePath:
    """One way to decode: ``start(n)`` holds a cache of ``n`` tokens and returns the step."""

    name: str

    def start(self, n: int) -> Callable[[], object]:
        raise NotImplementedError

    def kv_bytes(self) -> int:
        raise NotImplementedError

    def stop(self) -> None:
        """Free the cache."""
        raise NotImplementedError


class HFPath(DecodePath):
    """transformers' model with its dynamic cache, or its static cache under torch.compile."""

    def __init__(self, name: str, model, margin: int, generator: torch.Generator):
        self.name, self.model, self.margin, self.generator = name, model, margin, generator
        # dynamic=False: one graph per cache length, as a user with a fixed max_cache_len gets.
        compiled = name == STATIC
        self.forward = (
            torch.compile(model.forward, fullgraph=True, dynamic=False) if compiled else model
        )
        self.cache = None

    def start(self, n: int) -> Callable[[], object]:
        config = self.model.config
        if self.name == STATIC:
            # Sized for the steps this run takes, as a user sizes it for the generation.
            self.cache = filled_static_cache(config, n, n + self.margin, self.generator)
        else:
            self.cache = filled_dynamic_cache(config, n, self.generator)
        position = torch.tensor([[n]])

        def step():
            self.forward(input_ids=TOKEN, position_ids=position, cache=self.cache, use_cache=True)
            position.add_(1)

        return step

    def kv_bytes(self) -> int:
        return cache_bytes(self.cache)

    def stop(self) -> None:
        self.cache = None


class KVpopPath(DecodePath):
    """A transformed model's decode step, eager or compiled, on a :class:`kc.KVpopCache`."""

    def __init__(self, name: str, model, step, generator: torch.Generator):
        self.name, self.model, self.step, self.generator = name, model, step, generator
        self.cache = None

    def start(self, n: int) -> Callable[[], object]:
        self.cache = kc.new_cache(self.model)
        kc.prefill(self.model, TOKEN, self.cache)  # allocates every layer's state
        for layer in self.cache.layers:
            fill_bounded_state(layer.state, self.model.kvpop_config, n, self.generator)
        position = torch.tensor([[n]])

        def step():
            self.step(TOKEN, position, self.cache)
            position.add_(1)

        return step

    def kv_bytes(self) -> int:
        return self.cache.nbytes

    def stop(self) -> None:
        self.cache = None


class EnginePath(DecodePath):
    """An exported AOTInductor engine; each context gets a newly allocated cache."""

    name = KVPOP_AOTI

    def __init__(self, model, folder: Path, generator: torch.Generator):
        self.config, self.generator = model.kvpop_config, generator
        self.runner = kc.load(kc.export(model, folder / "engine", "aoti"))
        # The runner allocates its cache at load; allocate it per context instead, so that its
        # memory is measured like the other paths' (the engine's weights stay loaded).
        self.layout = [(t.shape, t.dtype) for t in self.runner.state]
        self.runner.state = []

    def start(self, n: int) -> Callable[[], object]:
        self.runner.state = [torch.empty(shape, dtype=dtype) for shape, dtype in self.layout]
        per_layer = len(STATE_FIELDS)
        for first in range(0, len(self.layout), per_layer):
            layer = BoundedCacheState(*self.runner.state[first : first + per_layer])
            fill_bounded_state(layer, self.config, n, self.generator)
        return lambda: self.runner.decode(TOKEN)

    def kv_bytes(self) -> int:
        return sum(t.nbytes for t in self.runner.state)

    def stop(self) -> None:
        self.runner.state = []


@dataclass
class Result:
    timing: Timing
    kv_bytes: int
    peak_bytes: int | None


@dataclass
class Run:
    settings: Settings
    results: dict[tuple[str, int], Result] = field(default_factory=dict)

    def ratio(self, path: str, n: int) -> float | None:
        """Speed relative to the static-cache compiled baseline (> 1: faster)."""
        if (STATIC, n) not in self.results:
            return None
        return self.results[STATIC, n].timing.median / self.results[path, n].timing.median


def _transient_bytes(step: Callable[[], object], calls: int) -> int | None:
    """The most memory ``calls`` decode steps allocate above what is resident before them."""
    with PeakMemory() as memory:
        for _ in range(calls):
            step()
    return memory.growth()


def _paths(settings: Settings, folder: Path) -> list[DecodePath]:
    max_positions = 2 * max(*settings.contexts, settings.kvpop_config.capacity)
    build = dict(layers=settings.layers, vocab=settings.vocab, max_positions=max_positions)
    generator = torch.Generator().manual_seed(0)
    margin = settings.warmup + (settings.repeats + 1) * settings.steps + 1  # steps per context
    paths: list[DecodePath] = []
    if DYNAMIC in settings.paths or STATIC in settings.paths:
        baseline = qwen3_model(settings.shape, **build)
        paths += [
            HFPath(name, baseline, margin, generator)
            for name in (DYNAMIC, STATIC)
            if name in settings.paths
        ]
    model = kc.transform(qwen3_model(settings.shape, **build), settings.kvpop_config)
    if KVPOP_EAGER in settings.paths:
        paths.append(KVpopPath(KVPOP_EAGER, model, _eager_step(model), generator))
    if KVPOP_COMPILED in settings.paths:
        paths.append(KVpopPath(KVPOP_COMPILED, model, kc.compile(model), generator))
    if KVPOP_AOTI in settings.paths:
        paths.append(EnginePath(model, folder, generator))
    return paths


def _eager_step(model):
    return lambda token, position, cache: kc.decode_one_token(model, token, position, cache)


def run(settings: Settings) -> Section:
    """Measure every path at every context. All paths hold their caches at once and their
    timed runs alternate (:func:`~benchmarks.harness.interleave`)."""
    record = Run(settings)
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        paths = _paths(settings, Path(folder))
        for n in settings.contexts:
            steps = {path.name: path.start(n) for path in paths}
            for step in steps.values():  # compilation, allocator and thread-pool warm-up
                for _ in range(settings.warmup):
                    step()
            transient = {
                name: _transient_bytes(step, settings.steps) for name, step in steps.items()
            }
            measured = interleave(steps, repeats=settings.repeats, calls_per_run=settings.steps)
            for path in paths:
                kv_bytes, extra = path.kv_bytes(), transient[path.name]
                peak = None if extra is None else kv_bytes + extra
                record.results[path.name, n] = Result(measured[path.name].timing, kv_bytes, peak)
                path.stop()
            del steps
    return _report(record)


def median_ms(section: Section, path: str, n: int) -> float | None:
    """The median ms per token of ``path`` at context ``n`` in a finished run, if measured."""
    result = section.data.get(f"{path}@{n}")
    return None if result is None else statistics.median(result["ms"])


def _cell_latency(record: Run, path: str, n: int) -> str:
    result = record.results[path, n]
    ratio = record.ratio(path, n)
    suffix = f" ({ratio:.2f}x)" if ratio is not None else ""
    return f"{result.timing.ms()}{suffix}"


def _cell_memory(record: Run, path: str, n: int) -> str:
    result = record.results[path, n]
    return f"{mib(result.kv_bytes)} / {mib(result.peak_bytes)}"


def _report(record: Run) -> Section:
    settings = record.settings
    paths = [p for p in PATHS if (p, settings.contexts[0]) in record.results]
    header = ["path", *(context_label(n) for n in settings.contexts)]
    latency = table(
        header, [[p, *(_cell_latency(record, p, n) for n in settings.contexts)] for p in paths]
    )
    memory = table(
        header, [[p, *(_cell_memory(record, p, n) for n in settings.contexts)] for p in paths]
    )
    budget = settings.kvpop_config
    section = Section(
        title="Decode at long context",
        method=(
            f"Batch 1, float32, Qwen3 with {settings.layers} layers of `{settings.shape}` shapes "
            f"(random weights, vocabulary {settings.vocab}). KVpop budget: {budget.sinks} sinks + "
            f"{budget.window} window + {budget.topk} pool = capacity {budget.capacity}, "
            f"`{budget.scorer.value}` scorer. For each context N every path gets a cache holding "
            "N tokens — written directly (random keys and values where N tokens would have left "
            "them; KVpop's cache holds what its policy keeps after N tokens, so each timed step "
            "evicts) instead of generating N tokens, which would take hours on a CPU — then "
            f"{settings.warmup} untimed steps (compilation happens there) and {settings.repeats} "
            f"timed runs of {settings.steps} decode steps, the paths' runs alternating so that "
            "a slow spell on a shared machine falls on all of them alike. The context grows by "
            "those steps only. Static caches are sized for them (`max_cache_len` = N + steps "
            "taken).\n\n"
            "Latency: ms per token, median ± half the range of the runs, and in brackets the "
            "speed relative to the static cache under `torch.compile` at the same N (> 1x: "
            "faster)."
        ),
        tables=[
            latency,
            "Memory, MiB: KV cache bytes (all the cache's tensors; KVpop's include positions, "
            "priorities, the window's pre-RoPE keys and the scorer state) / peak: the cache "
            f"bytes plus the most resident memory {settings.steps} decode steps add above what "
            "is resident before them (transients such as the dynamic cache's copy when it "
            "grows; the weights, shared by all paths, are not counted).",
            memory,
        ],
        data={
            f"{p}@{n}": {
                "ms": [s * 1e3 for s in r.timing.samples],
                "kv_bytes": r.kv_bytes,
                "peak_bytes": r.peak_bytes,
            }
            for (p, n), r in record.results.items()
        },
    )
    section.plots = {
        "decode_latency.png": lambda path: _plot(record, paths, path, latency=True),
        "decode_memory.png": lambda path: _plot(record, paths, path, latency=False),
    }
    section.targets = _targets(record)
    return section


def _plot(record: Run, paths: list[str], out: Path, *, latency: bool) -> bool:
    contexts = list(record.settings.contexts)
    series = []
    for p in paths:
        results = [record.results[p, n] for n in contexts]
        if latency:
            y = [r.timing.median * 1e3 for r in results]
            err = [r.timing.spread * 1e3 for r in results]
        else:
            y = [(r.peak_bytes if r.peak_bytes is not None else r.kv_bytes) / MiB for r in results]
            err = None
        series.append(Series(p, contexts, y, err))
    if latency:
        return line_plot(out, "Decode step", "tokens in context", "ms / token", series, logy=True)
    return line_plot(
        out,
        "Decode memory",
        "tokens in context",
        "peak MiB (cache + transients)",
        series,
        logy=True,
    )


def _targets(record: Run) -> list[Target]:
    settings = record.settings
    targets = []
    kvpop_paths = [p for p in (KVPOP_EAGER, KVPOP_COMPILED, KVPOP_AOTI) if p in settings.paths]
    sizes = {record.results[p, n].kv_bytes for p in kvpop_paths for n in settings.contexts}
    longest = settings.contexts[-1]
    if kvpop_paths:
        growth = ""
        if (DYNAMIC, longest) in record.results:
            growth = (
                f"; the dynamic cache holds {mib(record.results[DYNAMIC, longest].kv_bytes)} MiB "
                f"at {context_label(longest)}"
            )
        targets.append(
            Target(
                "KVpop KV memory flat after capacity",
                met=len(sizes) == 1,
                measured=f"{', '.join(mib(s) for s in sorted(sizes))} MiB at every context{growth}",
            )
        )
    if (STATIC, longest) in record.results and KVPOP_COMPILED in settings.paths:
        ratio = record.ratio(KVPOP_COMPILED, longest)
        measured = f"kc.compile {ratio:.2f}x the static-cache compiled step at " + context_label(
            longest
        )
        if KVPOP_AOTI in settings.paths:
            measured += f" (AOTInductor {record.ratio(KVPOP_AOTI, longest):.2f}x)"
        targets.append(
            Target(
                f"decode ≥ 3x faster than static cache + torch.compile at {context_label(longest)}",
                ratio >= 3.0,
                measured,
                _ceiling_note(record),
            )
        )
    return targets


def _ceiling_note(record: Run) -> str:
    """What bounds the speed-up: the static-cache step at the context closest to KVpop's
    capacity costs what a free policy would, so static(longest) / static(capacity) caps it."""
    settings = record.settings
    capacity = settings.kvpop_config.capacity
    near = min(settings.contexts, key=lambda n: abs(n - capacity))
    longest = settings.contexts[-1]
    static = record.results[STATIC, longest].timing.median
    floor = record.results[STATIC, near].timing.median
    return (
        f"The static-cache compiled step holding {context_label(near)} tokens (KVpop's capacity "
        f"is {capacity}) takes {floor * 1e3:.1f} ms against {static * 1e3:.1f} ms at "
        f"{context_label(longest)}: a policy that cost nothing would reach "
        f"{static / floor:.2f}x."
    )

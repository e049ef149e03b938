"""How ``kvpop-compile bench`` runs and times one method at one context: each method as a
:class:`MethodRun` (prefill, then decode steps), :func:`method_runs` in the order that lets the
model be transformed in place between transformers' caches and KVpop's, and :func:`measure`,
which times a run into its :class:`~.settings.Row` or records why it failed."""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, StaticCache

from ...kv_cache import cache_bytes, cache_kwargs
from .peak_memory import peak_memory
from .settings import TRANSFORMERS_METHODS, BenchResult, BenchSettings, Row

logger = logging.getLogger(__name__)


@dataclass
class MethodRun:
    """One method at one context: ``prefill(ids (1, N))``, then ``step()`` per decoded token."""

    prefill: Callable[[torch.Tensor], object]
    step: Callable[[], object]
    kv_bytes: Callable[[], int]
    close: Callable[[], None] = lambda: None


def _transformers_run(
    model: nn.Module, method: str, n: int, tokens: int, batch: int = 1
) -> MethodRun:
    """transformers' dynamic cache (eager steps) or static cache (compiled steps, replayed from
    CUDA graphs on a GPU)."""
    device = model.device
    token = torch.zeros(batch, 1, dtype=torch.long, device=device)
    position = torch.full((batch, 1), n, dtype=torch.long, device=device)
    if method == "static":
        # One graph per cache length (dynamic=False, as with a fixed max_cache_len); dropping
        # the previous lengths' graphs keeps torch.compile under its recompilation limit.
        torch._dynamo.reset()
        cache = StaticCache(config=model.config, max_cache_len=n + tokens)
        # On a GPU, what transformers recommends for fast decoding: the compiled step replayed
        # from CUDA graphs ("reduce-overhead"); a CPU has no graphs to replay.
        mode = "reduce-overhead" if device.type == "cuda" else None
        forward = torch.compile(model.forward, mode=mode, fullgraph=True, dynamic=False)
    else:
        cache = DynamicCache(config=model.config)
        forward = model

    def step():
        forward(input_ids=token, position_ids=position, **cache_kwargs(cache), use_cache=True)
        position.add_(1)

    return MethodRun(
        prefill=lambda ids: model(
            input_ids=ids, **cache_kwargs(cache), use_cache=True, logits_to_keep=1
        ),
        step=step,
        kv_bytes=lambda: cache_bytes(cache),
    )


def _kvpop_run(model: nn.Module, decode, batch: int = 1) -> MethodRun:
    """KVpop: ``kc.prefill`` into a new cache, then ``decode(token, None, cache)`` steps."""
    from ...generation import new_cache, prefill

    cache = new_cache(model)
    token = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
    return MethodRun(
        prefill=lambda ids: prefill(model, ids, cache),
        step=lambda: decode(token, None, cache),
        kv_bytes=lambda: cache.nbytes,
    )


class _Engine:
    """An exported AOTInductor engine whose cache is allocated per run, so that its memory is
    measured like the other methods' (the engine's weights stay loaded)."""

    def __init__(self, model: nn.Module, folder: Path, prefill_length: int, batch: int):
        from ...engines import export, load

        engine = export(
            model, folder / "engine", "aoti", batch=batch, prefill_length=prefill_length
        )
        self.runner = load(engine)
        self.layout = [(t.shape, t.dtype) for t in self.runner.state]
        self.runner.state = []

    def run(self) -> MethodRun:
        runner = self.runner
        token = torch.zeros(runner.batch, 1, dtype=torch.long, device=runner.device)

        def prefill(ids):
            runner.state = [torch.empty(s, dtype=d, device=runner.device) for s, d in self.layout]
            runner.prefill(ids)

        def close():
            runner.state = []

        return MethodRun(
            prefill=prefill,
            step=lambda: runner.decode(token),
            kv_bytes=lambda: sum(t.nbytes for t in runner.state),
            close=close,
        )


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of ``fn()``: between CUDA events around synchronised calls on a GPU (the device's
    time, not the launch's), wall time on the CPU."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1e3


def error_text(error: Exception) -> str:
    message = str(error).strip()
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def measure(
    make: Callable[[], MethodRun], row: Row, ids: torch.Tensor, settings: BenchSettings
) -> Row:
    """Fill ``row`` with one run's figures, or with its error: one failed method (out of memory
    at a long context, a compiler that is missing) must not end the whole benchmark."""
    device = ids.device
    run = None
    try:
        run = make()
        with peak_memory(device) as prefilled:
            row.prefill_s = _seconds(lambda: run.prefill(ids), device)
        for _ in range(settings.warmup):
            run.step()
        with peak_memory(device) as decoded:
            row.step_s = [_seconds(run.step, device) for _ in range(settings.decode_tokens)]
        row.kv_bytes = run.kv_bytes()
        if prefilled.growth() is not None and decoded.growth() is not None:
            row.peak_bytes = max(prefilled.growth(), row.kv_bytes + decoded.growth())
    except Exception as error:  # reported in the row; the other runs go on
        logger.info("%s at %d tokens failed", row.method, row.context, exc_info=True)
        row.error = error_text(error)
    finally:
        if run is not None:
            run.close()
        run = None  # the cache goes before the collection below returns its memory
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def method_runs(
    model: nn.Module,
    settings: BenchSettings,
    prompt: torch.Tensor,
    folder: Path,
    result: BenchResult,
) -> Iterable[tuple[str, Callable[[int], MethodRun]]]:
    """``(method, make(n))`` for each method, transformers' first: the model is transformed in
    place between them. Each family first runs a short untimed prompt, so that one-time work
    (thread pools, cuBLAS workspaces, Triton's kernel compilation) falls on no method."""
    tokens, batch = settings.warmup + settings.decode_tokens, settings.batch
    warm_up = prompt[:, : settings.contexts[0]]
    transformers_methods = [m for m in settings.methods if m in TRANSFORMERS_METHODS]
    if transformers_methods:
        ids = warm_up[:, :64]
        _warm_up(_transformers_run(model, "dynamic", ids.shape[1], 1, batch), ids)
    for method in transformers_methods:
        yield method, lambda n, method=method: _transformers_run(model, method, n, tokens, batch)
    kvpop = [m for m in settings.methods if m not in TRANSFORMERS_METHODS]
    if not kvpop:
        return
    from ... import generation
    from ...transform import transform

    torch._dynamo.reset()  # the static cache's graphs hold the untransformed layers
    transform(model, settings.kvpop_config)
    eager = functools.partial(generation.decode_one_token, model)
    # Up to one token past a whole chunk: prefill's chunk and its remainder, then a step.
    _warm_up(_kvpop_run(model, eager, batch), warm_up[:, : settings.kvpop_config.chunk_length + 1])
    for method in kvpop:
        if method == "eager":
            yield method, lambda n: _kvpop_run(model, eager, batch)
        elif method == "compile":
            step = generation.compile(model)
            yield method, lambda n, step=step: _kvpop_run(model, step, batch)
        elif method == "graph":
            yield method, _graph_factory(model, batch)
        else:
            yield method, _engine_factory(model, settings, folder, result)


def _graph_factory(model: nn.Module, batch: int) -> Callable[[int], MethodRun]:
    """The CUDA-graph step, made at the first run so that where it cannot be (off CUDA) every
    ``graph`` row reports why; each run's new cache is captured in its untimed warm-up."""
    from ... import generation

    steps = []

    def make(n: int) -> MethodRun:
        if not steps:
            steps.append(generation.compile(model, cuda_graph=True))
        return _kvpop_run(model, steps[0], batch)

    return make


def _warm_up(run: MethodRun, ids: torch.Tensor) -> None:
    run.prefill(ids)
    run.step()
    run.close()


def _engine_factory(
    model: nn.Module, settings: BenchSettings, folder: Path, result: BenchResult
) -> Callable[[int], MethodRun]:
    """Export and load the engine once; if that fails, every ``aoti`` row reports why."""
    prefill_length = max(2, min(settings.kvpop_config.chunk_length, *settings.contexts))
    start = time.perf_counter()
    try:
        engine = _Engine(model, folder, prefill_length, settings.batch)
    except Exception as error:  # reported in the aoti rows
        logger.info("exporting the AOTInductor engine failed", exc_info=True)
        message = f"export failed: {error_text(error)}"

        def fail(n: int) -> MethodRun:
            raise RuntimeError(message)

        return fail
    result.notes.append(
        f"The AOTInductor engine (prefill step of {prefill_length} tokens) took "
        f"{time.perf_counter() - start:.0f} s to export and load."
    )
    return lambda n: engine.run()

"""Long-context prefill and decode on this machine (``kvpop-compile bench``).

For each context N, each method runs one random N-token prompt at batch 1 into a new cache,
then decodes ``warmup`` untimed tokens and ``decode_tokens`` timed ones:

- ``dynamic``: transformers' default dynamic cache; the prompt in one forward with
  ``logits_to_keep=1`` (as ``generate()`` runs it), eager decode steps. Every ratio is taken
  against it.
- ``static``: transformers' static cache of N + the tokens decoded; the same eager prefill,
  decode steps under ``torch.compile`` (``fullgraph``, one graph per N), which is what a
  static cache is for.
- ``eager``: KVpop; ``kc.prefill`` (chunks of the capacity, the last position's logits only),
  ``kc.decode_one_token`` steps.
- ``compile``: the same prefill, then ``kc.compile``'s decode step.
- ``aoti`` (asked for explicitly: exporting takes minutes): the AOTInductor engine of
  ``kc.export``, its prefill step over chunks of ``min(chunk, shortest N)`` tokens (what is
  left over goes through decode steps) and its decode step.

Figures: prefill seconds; decode tokens/s, one over the median seconds of the timed steps
(compilation happens in the warm-up); peak memory above what was resident before the run, the
larger of the prefill's peak and the cache's bytes plus the peak the timed steps add (so
compiling in the warm-up is not counted). On CUDA, times come from events around synchronised
calls and memory from the allocator's peak; on the CPU, wall time and the resident set
(:mod:`.peak_memory`). A run that fails (out of memory, a compiler error) is reported in its
row and the others go on.
"""

from __future__ import annotations

import functools
import gc
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, StaticCache

from ..config import KVpopConfig, require_int
from ..kv_cache import cache_bytes
from ..transform import SUPPORTED_MODEL_TYPES
from .peak_memory import peak_memory

logger = logging.getLogger(__name__)

METHODS = {
    "dynamic": "dynamic cache",
    "static": "static cache + torch.compile",
    "eager": "KVpop eager",
    "compile": "KVpop kc.compile",
    "aoti": "KVpop AOTInductor",
}
DEFAULT_METHODS = ("dynamic", "static", "eager", "compile")
BASELINE = "dynamic"
TRANSFORMERS_METHODS = ("dynamic", "static")  # run before the model is transformed in place
K = 1024  # the "k" of "32k"


def parse_contexts(text: str) -> tuple[int, ...]:
    """Context lengths from ``"8k,32k"`` or ``"1000, 4096"``: ``k`` is 1024 tokens.

    Raises ``ValueError`` naming the bad item unless each is a whole number of tokens >= 1."""
    items = [item.strip() for item in str(text).split(",")]
    contexts = []
    for item in items:
        number, scale = (item[:-1], K) if item[-1:] in ("k", "K") else (item, 1)
        try:
            value = int(number) * scale
        except ValueError:
            value = None
        if value is None or value < 1:
            raise ValueError(
                f"context {item!r} is not a token count: give whole numbers >= 1, optionally "
                "with a k suffix (1k = 1024), separated by commas, e.g. 8k,32k"
            )
        contexts.append(value)
    return tuple(contexts)


def context_label(n: int) -> str:
    """``1024 -> '1k'``, ``32768 -> '32k'``; other sizes as they are."""
    return f"{n // K}k" if n >= K and n % K == 0 else str(n)


@dataclass(frozen=True)
class BenchSettings:
    """What to measure: ``contexts`` (prompt lengths; sorted, duplicates dropped), ``methods``
    (keys of :data:`METHODS`, run in that table's order), ``warmup`` untimed then
    ``decode_tokens`` timed decode steps, and the KVpop budget."""

    contexts: tuple[int, ...]
    methods: tuple[str, ...] = DEFAULT_METHODS
    decode_tokens: int = 16
    warmup: int = 3
    kvpop: KVpopConfig = field(default_factory=KVpopConfig)
    seed: int = 0  # of the random prompt

    def __post_init__(self) -> None:
        if isinstance(self.contexts, (str, int)) or not self.contexts:
            raise ValueError(
                f"contexts must be a non-empty sequence of lengths, got {self.contexts!r}"
            )
        for n in self.contexts:
            require_int("each context", n, 1)
        methods = tuple(self.methods) if not isinstance(self.methods, str) else ()
        if not methods or any(m not in METHODS for m in methods):
            raise ValueError(
                f"methods must be a non-empty sequence of {', '.join(METHODS)}; got "
                f"{self.methods!r}"
            )
        require_int("decode_tokens", self.decode_tokens, 1)
        # The first step compiles: at least one untimed step keeps compilation out of the times.
        require_int("warmup", self.warmup, 1)
        require_int("seed", self.seed, 0)
        if not isinstance(self.kvpop, KVpopConfig):
            raise TypeError(f"kvpop must be a KVpopConfig, got {type(self.kvpop).__name__}")
        object.__setattr__(self, "contexts", tuple(sorted(set(self.contexts))))
        object.__setattr__(self, "methods", tuple(m for m in METHODS if m in methods))


@dataclass
class Row:
    """One method at one context: its figures, or the error that stopped it."""

    context: int
    method: str
    prefill_s: float | None = None
    step_s: list[float] = field(default_factory=list)  # seconds of each timed decode step
    peak_bytes: int | None = None  # above what was resident before the run; None: unmeasured
    kv_bytes: int | None = None  # the cache's bytes after the timed steps
    error: str | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens per second at batch 1: one over the median timed step."""
        return 1.0 / statistics.median(self.step_s) if self.step_s else None


@dataclass
class BenchResult:
    """A finished benchmark: what ran, where, and one :class:`Row` per context and method."""

    settings: BenchSettings
    model: str  # the checkpoint, or the shape the random weights were built for
    layers: int
    dtype: str
    device: str  # the GPU's or CPU's name
    weights_bytes: int
    rows: list[Row]
    notes: list[str] = field(default_factory=list)

    def row(self, context: int, method: str) -> Row | None:
        for row in self.rows:
            if row.context == context and row.method == method:
                return row
        return None

    def ratios(self, row: Row) -> dict[str, float | None]:
        """``row``'s prefill time, decode speed and peak memory over the dynamic cache's at the
        same context (decode > 1: faster; prefill and peak < 1: less); ``None`` where either
        figure is missing."""
        base = self.row(row.context, BASELINE)

        def ratio(mine, theirs):
            if base is None or mine is None or theirs is None or theirs == 0:
                return None
            return mine / theirs

        return {
            "prefill": ratio(row.prefill_s, base and base.prefill_s),
            "decode": ratio(row.decode_tok_s, base and base.decode_tok_s),
            "peak": ratio(row.peak_bytes, base and base.peak_bytes),
        }


@dataclass
class _Run:
    """One method at one context: ``prefill(ids (1, N))``, then ``step()`` per decoded token."""

    prefill: Callable[[torch.Tensor], object]
    step: Callable[[], object]
    kv_bytes: Callable[[], int]
    close: Callable[[], None] = lambda: None


def _transformers_run(model: nn.Module, method: str, n: int, tokens: int) -> _Run:
    """transformers' dynamic cache (eager steps) or static cache (compiled steps)."""
    device = model.device
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    position = torch.full((1, 1), n, dtype=torch.long, device=device)
    if method == "static":
        # One graph per cache length (dynamic=False, as with a fixed max_cache_len); dropping
        # the previous lengths' graphs keeps torch.compile under its recompilation limit.
        torch._dynamo.reset()
        cache = StaticCache(config=model.config, max_cache_len=n + tokens)
        forward = torch.compile(model.forward, fullgraph=True, dynamic=False)
    else:
        cache = DynamicCache(config=model.config)
        forward = model

    def step():
        forward(input_ids=token, position_ids=position, cache=cache, use_cache=True)
        position.add_(1)

    return _Run(
        prefill=lambda ids: model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1),
        step=step,
        kv_bytes=lambda: cache_bytes(cache),
    )


def _kvpop_run(model: nn.Module, decode) -> _Run:
    """KVpop: ``kc.prefill`` into a new cache, then ``decode(token, None, cache)`` steps."""
    from ..generation import new_cache, prefill

    cache = new_cache(model)
    token = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    return _Run(
        prefill=lambda ids: prefill(model, ids, cache),
        step=lambda: decode(token, None, cache),
        kv_bytes=lambda: cache.nbytes,
    )


class _Engine:
    """An exported AOTInductor engine whose cache is allocated per run, so that its memory is
    measured like the other methods' (the engine's weights stay loaded)."""

    def __init__(self, model: nn.Module, folder: Path, prefill_length: int):
        from ..engines import export, load

        self.runner = load(export(model, folder / "engine", "aoti", prefill_length=prefill_length))
        self.layout = [(t.shape, t.dtype) for t in self.runner.state]
        self.runner.state = []

    def run(self) -> _Run:
        runner = self.runner
        token = torch.zeros(1, 1, dtype=torch.long, device=runner.device)

        def prefill(ids):
            runner.state = [torch.empty(s, dtype=d, device=runner.device) for s, d in self.layout]
            runner.prefill(ids)

        def close():
            runner.state = []

        return _Run(
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


def _error_text(error: Exception) -> str:
    message = str(error).strip()
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _measure(make: Callable[[], _Run], row: Row, ids: torch.Tensor, settings: BenchSettings) -> Row:
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
        row.error = _error_text(error)
    finally:
        if run is not None:
            run.close()
        run = None  # the cache goes before the collection below returns its memory
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"{cpu_name()} ({threads} torch thread{'s' if threads > 1 else ''})"


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def bench_model(
    *,
    path: str | Path | None = None,
    shape: str | None = None,
    layers: int | None = None,
    dtype: str | None = None,
    device: str = "cpu",
    settings: BenchSettings,
) -> tuple[nn.Module, str]:
    """The model to measure and its name: the Qwen3 checkpoint folder ``path``, or random
    weights in a released Qwen3's ``shape`` (:data:`.model_shapes.MODELS`) with its first
    ``layers`` layers (default all). ``dtype`` defaults to bfloat16 on CUDA, float32 on the
    CPU."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .model_shapes import MODELS, qwen3_model

    if (path is None) == (shape is None):
        raise ValueError(f"give a checkpoint path or a shape, not both or neither; got "
                         f"path={path!r}, shape={shape!r}")  # fmt: skip
    device = torch.device(device)
    dtype = dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    if shape is not None:
        if shape not in MODELS:
            raise ValueError(f"shape must be one of {', '.join(MODELS)}; got {shape!r}")
        size = MODELS[shape]
        layers = size.layers if layers is None else layers
        require_int("layers", layers, 1)
        longest = max(*settings.contexts, settings.kvpop.capacity)
        model = qwen3_model(
            shape, layers=layers, vocab=size.vocab, max_positions=2 * longest,
            dtype=DTYPES[dtype], device=device, tie_word_embeddings=size.tie_word_embeddings,
        )  # fmt: skip
        return model, f"{shape} shape, random weights"
    config = AutoConfig.from_pretrained(path)  # refuse another architecture before loading it
    _check_model_type(config.model_type, type(config).__name__)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype], attn_implementation="sdpa"
    )
    return model.to(device).eval(), str(path)


def _check_model_type(model_type: str | None, name: str) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(SUPPORTED_MODEL_TYPES)
        raise ValueError(
            f"the benchmark runs Qwen3 models (model_type {supported}), got {name} with "
            f"model_type {model_type!r}"
        )


def _check_model(model: nn.Module, settings: BenchSettings) -> None:
    # transform() runs after transformers' caches: refuse what it would refuse before them.
    config = getattr(model, "config", None)
    _check_model_type(getattr(config, "model_type", None), type(model).__name__)
    if getattr(model, "kvpop_config", None) is not None:
        raise ValueError(
            "the model is already transformed; pass the untransformed model: the benchmark "
            "runs transformers' caches on it first, then transforms it"
        )
    capacity = settings.kvpop.capacity
    kvpop = set(settings.methods) - set(TRANSFORMERS_METHODS)
    if kvpop and capacity > config.max_position_embeddings:
        raise ValueError(
            f"capacity {capacity} (sinks + window + topk) exceeds the model's "
            f"max_position_embeddings {config.max_position_embeddings}; lower topk or window"
        )


def _progress(total: int, enabled: bool | None):
    from tqdm import tqdm

    # enabled=None: tqdm's default, a bar only when stderr is a terminal (not in logs).
    return tqdm(total=total, unit="run", disable=None if enabled is None else not enabled)


def run_bench(
    model: nn.Module,
    settings: BenchSettings,
    *,
    model_name: str,
    progress: bool | None = None,
) -> BenchResult:
    """Measure every method of ``settings`` at every context on ``model``.

    ``model`` is an untransformed transformers Qwen3 in eval mode, on the device to measure;
    transformers' caches run on it first, then it is transformed in place (one copy of the
    weights in memory) for KVpop's methods. ``progress``: a progress bar over the runs (None:
    when stderr is a terminal)."""
    if not isinstance(settings, BenchSettings):
        raise TypeError(f"settings must be BenchSettings, got {type(settings).__name__}")
    _check_model(model, settings)
    device = model.device
    contexts, methods = settings.contexts, settings.methods
    generator = torch.Generator().manual_seed(settings.seed)
    prompt = torch.randint(model.config.vocab_size, (1, max(contexts)), generator=generator)
    prompt = prompt.to(device)  # (1, longest N)
    result = BenchResult(
        settings=settings, model=model_name, layers=model.config.num_hidden_layers,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        device=device_name(device),
        weights_bytes=sum(p.nbytes for p in model.parameters()), rows=[],
    )  # fmt: skip
    if max(contexts) > model.config.max_position_embeddings:
        result.notes.append(
            f"Contexts beyond the model's max_position_embeddings "
            f"({model.config.max_position_embeddings}) run all the same: their speed and memory "
            "are what is measured here, not their quality."
        )
    bar = _progress(len(contexts) * len(methods), progress)
    with bar, torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        for method, make in _runs(model, settings, prompt, Path(folder), result):
            for n in contexts:
                bar.set_description(f"{context_label(n)} {METHODS[method]}")
                row = _measure(functools.partial(make, n), Row(n, method), prompt[:, :n], settings)
                result.rows.append(row)
                if row.error is not None:
                    bar.write(f"{METHODS[method]} at {context_label(n)} failed: {row.error}")
                bar.update()
    order = {method: i for i, method in enumerate(METHODS)}
    result.rows.sort(key=lambda row: (row.context, order[row.method]))
    return result


def _runs(
    model: nn.Module,
    settings: BenchSettings,
    prompt: torch.Tensor,
    folder: Path,
    result: BenchResult,
) -> Iterable[tuple[str, Callable[[int], _Run]]]:
    """``(method, make(n))`` for each method, transformers' first: the model is transformed in
    place between them. Each family first runs a short untimed prompt, so that one-time work
    (thread pools, cuBLAS workspaces, Triton's kernel compilation) falls on no method."""
    tokens = settings.warmup + settings.decode_tokens
    warm_up = prompt[:, : settings.contexts[0]]
    transformers_methods = [m for m in settings.methods if m in TRANSFORMERS_METHODS]
    if transformers_methods:
        ids = warm_up[:, :64]
        _warm_up(_transformers_run(model, "dynamic", ids.shape[1], 1), ids)
    for method in transformers_methods:
        yield method, lambda n, method=method: _transformers_run(model, method, n, tokens)
    kvpop = [m for m in settings.methods if m not in TRANSFORMERS_METHODS]
    if not kvpop:
        return
    from .. import generation
    from ..transform import transform

    torch._dynamo.reset()  # the static cache's graphs hold the untransformed layers
    transform(model, settings.kvpop)
    eager = functools.partial(generation.decode_one_token, model)
    # Up to one token past a whole chunk: prefill's chunk and its remainder, then a step.
    _warm_up(_kvpop_run(model, eager), warm_up[:, : settings.kvpop.chunk_length + 1])
    for method in kvpop:
        if method == "eager":
            yield method, lambda n: _kvpop_run(model, eager)
        elif method == "compile":
            step = generation.compile(model)
            yield method, lambda n, step=step: _kvpop_run(model, step)
        else:
            yield method, _engine_factory(model, settings, folder, result)


def _warm_up(run: _Run, ids: torch.Tensor) -> None:
    run.prefill(ids)
    run.step()
    run.close()


def _engine_factory(
    model: nn.Module, settings: BenchSettings, folder: Path, result: BenchResult
) -> Callable[[int], _Run]:
    """Export and load the engine once; if that fails, every ``aoti`` row reports why."""
    prefill_length = max(2, min(settings.kvpop.chunk_length, *settings.contexts))
    start = time.perf_counter()
    try:
        engine = _Engine(model, folder, prefill_length)
    except Exception as error:  # reported in the aoti rows
        logger.info("exporting the AOTInductor engine failed", exc_info=True)
        message = f"export failed: {_error_text(error)}"

        def fail(n: int) -> _Run:
            raise RuntimeError(message)

        return fail
    result.notes.append(
        f"The AOTInductor engine (prefill step of {prefill_length} tokens) took "
        f"{time.perf_counter() - start:.0f} s to export and load."
    )
    return lambda n: engine.run()

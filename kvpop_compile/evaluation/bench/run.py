"""Long-context prefill and decode on this machine (``kvpop-compile bench``).

For each context N, each method runs a random N-token prompt per sequence (``batch`` of them,
default 1) into a new cache, then decodes ``warmup`` untimed tokens and ``decode_tokens`` timed
ones:

- ``dynamic``: transformers' default dynamic cache; the prompt in one forward with
  ``logits_to_keep=1`` (as ``generate()`` runs it), eager decode steps. Every ratio is taken
  against it.
- ``static``: transformers' static cache of N + the tokens decoded; the same eager prefill,
  decode steps under ``torch.compile`` (``fullgraph``, one graph per N; on a GPU replayed from
  CUDA graphs, ``mode="reduce-overhead"``), which is what a static cache is for.
- ``eager``: KVpop; ``kc.prefill`` (chunks of the capacity, the last position's logits only),
  ``kc.decode_one_token`` steps.
- ``compile``: the same prefill, then ``kc.compile``'s decode step.
- ``graph`` (CUDA only): the same, the compiled step replayed from one CUDA graph
  (``kc.compile(model, cuda_graph=True)``), captured in each run's untimed warm-up.
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
import tempfile
from pathlib import Path

import torch
from torch import nn

from ...config import require_int
from ...transform import SUPPORTED_MODEL_TYPES
from .settings import (
    METHODS,
    TRANSFORMERS_METHODS,
    BenchResult,
    BenchSettings,
    Row,
    context_label,
)
from .timing import measure, method_runs


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
        longest = max(*settings.contexts, settings.kvpop_config.capacity)
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
    capacity = settings.kvpop_config.capacity
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
    shape = (settings.batch, max(contexts))
    prompt = torch.randint(model.config.vocab_size, shape, generator=generator)
    prompt = prompt.to(device)  # (batch, longest N)
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
        for method, make in method_runs(model, settings, prompt, Path(folder), result):
            for n in contexts:
                bar.set_description(f"{context_label(n)} {METHODS[method]}")
                row = Row(n, method, batch=settings.batch)
                row = measure(functools.partial(make, n), row, prompt[:, :n], settings)
                result.rows.append(row)
                if row.error is not None:
                    bar.write(f"{METHODS[method]} at {context_label(n)} failed: {row.error}")
                bar.update()
    order = {method: i for i, method in enumerate(METHODS)}
    result.rows.sort(key=lambda row: (row.context, order[row.method]))
    return result

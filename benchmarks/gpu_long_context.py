"""Long context on a CUDA GPU: full attention against KVpop on the 36-layer Qwen3-4B shape.

    python benchmarks/gpu_long_context.py                  # N = 8k, 32k, 128k (an H200: minutes)
    python benchmarks/gpu_long_context.py --lengths 2048 --layers 2   # a quick check
    python benchmarks/gpu_long_context.py --device cpu --lengths 64 --layers 1 --out /tmp/x.md
    python benchmarks/gpu_long_context.py --lengths 8192 --batch 32 --methods static graph \
        --out benchmarks/results/gpu_batch32.md            # 32 sequences, each its own cache

``kvpop-compile bench --shape qwen3-4b --methods dynamic,static,eager,compile,graph`` with this
benchmark's settings (:mod:`kvpop_compile.evaluation.bench.run` says what is measured and
how): random weights in bf16 at batch 1 (``--batch``); for each prompt length N, prefill
seconds, decode tokens per second and peak GPU memory above the weights of transformers'
dynamic cache and static cache (``torch.compile(mode="reduce-overhead", fullgraph=True)``:
full attention the fast way) and of KVpop eager, ``kc.compile`` and its step replayed from a
CUDA graph; the targets compare KVpop's fastest compiled step with the static cache's and
with the speed of a step that only reads the weights and the cache at the GPU's peak
bandwidth. Writes
``benchmarks/results/gpu.md`` (or ``--out``) with the model shape, the stack's versions, every
figure and the targets, and prints it; the figures, every decode step's time included, go to
the ``.json`` beside it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import transformers  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from benchmarks.triton_kernels import peak_bandwidth  # noqa: E402
from kvpop_compile.atomic import atomic_write  # noqa: E402
from kvpop_compile.evaluation.bench.model_shapes import MODELS  # noqa: E402
from kvpop_compile.evaluation.bench.report import (  # noqa: E402
    COLUMN_NOTES,
    bench_json,
    bench_table,
)
from kvpop_compile.evaluation.bench.run import bench_model, run_bench  # noqa: E402
from kvpop_compile.evaluation.bench.settings import (  # noqa: E402
    METHODS as METHOD_LABELS,
)
from kvpop_compile.evaluation.bench.settings import (  # noqa: E402
    BenchResult,
    BenchSettings,
    Row,
    context_label,
)

GiB = 2**30
SHAPE = "qwen3-4b"
CONFIG = kc.KVpopConfig(sinks=4, window=256, topk=3836, scorer="memory")
METHODS = ("dynamic", "static", "eager", "compile", "graph")
PEAK_ABOVE_WEIGHTS_GIB = 2.0  # target: KVpop's peak at the longest N, above the weights
MAX_PREFILL_RATIO = 1.5  # target: KVpop / full-attention prefill time at 32k and beyond
MIN_SPEEDUP_LONGEST = 2.5  # target: KVpop compiled / static cache decode speed at the longest N
MIN_SPEEDUP_SHORTEST = 1.0  # ... and no slower at the shortest
MIN_BANDWIDTH_FRACTION = 0.7  # target: KVpop compiled's share of its bandwidth-limited speed
RESULTS = Path(__file__).resolve().parent / "results" / "gpu.md"


def run(args) -> BenchResult:
    settings = BenchSettings(
        contexts=tuple(args.lengths), methods=tuple(args.methods), decode_tokens=args.steps,
        warmup=args.warmup, kvpop_config=CONFIG, batch=args.batch,
    )  # fmt: skip
    model, name = bench_model(
        shape=args.shape,
        layers=args.layers,
        dtype="bfloat16",
        device=args.device,
        settings=settings,
    )
    return run_bench(model, settings, model_name=name)


def _kvpop_row(result: BenchResult, n: int) -> Row | None:
    """KVpop's row at ``n`` for the memory and prefill targets: eager where it ran, else the
    compiled step's (the same cache and prefill)."""
    rows = (result.row(n, method) for method in ("eager", "compile", "graph"))
    return next((row for row in rows if row is not None), None)


def _targets(result: BenchResult) -> list[str]:
    """The memory and prefill targets on KVpop's figures, each met or missed (or not measured,
    where a run failed or a method was not run)."""
    contexts = result.settings.contexts
    longest = contexts[-1]
    eager = [row for n in contexts if (row := _kvpop_row(result, n)) is not None]
    if not eager or eager[-1].context != longest:
        return [f"- KVpop peak at {context_label(longest)}: not measured (no KVpop method run)."]
    peaks = [row.peak_bytes / GiB for row in eager if row.peak_bytes is not None]
    above = eager[-1].peak_bytes
    if above is None:
        first = f"not measured — {eager[-1].error}"
    else:
        verdict = "met" if above / GiB <= PEAK_ABOVE_WEIGHTS_GIB else "missed"
        first = f"{verdict} — {above / GiB:.2f} GiB above {result.weights_bytes / GiB:.2f} GiB"
    targets = [
        f"- KVpop peak at {context_label(longest)} ≤ weights + {PEAK_ABOVE_WEIGHTS_GIB:g} GiB: "
        f"{first}.",
        f"- KVpop peak flat over N: {min(peaks):.2f}-{max(peaks):.2f} GiB above the weights."
        if peaks
        else "- KVpop peak flat over N: not measured.",
    ]
    slow = [
        result.ratios(row)["prefill"]
        for row in eager
        if row.context >= 32768 and result.row(row.context, "dynamic") is not None
    ]
    if slow:
        measured = [r for r in slow if r is not None]
        verdict = "met" if measured and max(measured) <= MAX_PREFILL_RATIO else "missed"
        targets.append(
            f"- KVpop prefill ≤ {MAX_PREFILL_RATIO:g}x full attention's at 32k and beyond: "
            f"{verdict if len(measured) == len(slow) else 'not measured'} — "
            + ", ".join("failed" if r is None else f"{r:.2f}x" for r in slow)
            + "."
        )
    return targets


def _compiled(result: BenchResult, n: int) -> Row | None:
    """KVpop's fastest compiled decode at ``n``: the CUDA-graph step, else ``kc.compile``."""
    for method in ("graph", "compile"):
        row = result.row(n, method)
        if row is not None and row.decode_tok_s is not None:
            return row
    return None


def _bandwidth_limit(result: BenchResult, row: Row, peak: float | None) -> float | None:
    """Tokens/s if a step did nothing but read the weights and ``row``'s caches (one per
    sequence of the batch) once at the GPU's peak memory bandwidth."""
    if peak is None or row.kv_bytes is None:
        return None
    return row.batch * peak / (result.weights_bytes + row.kv_bytes)


def _decode_targets(result: BenchResult, peak: float | None) -> list[str]:
    """KVpop compiled against transformers' static cache + torch.compile (CUDA graphs), the
    path a user would pick instead, and against its own bandwidth limit."""
    contexts = result.settings.contexts
    lines = []
    for n, least in ((contexts[-1], MIN_SPEEDUP_LONGEST), (contexts[0], MIN_SPEEDUP_SHORTEST)):
        ours, static = _compiled(result, n), result.row(n, "static")
        label = f"- KVpop compiled decode ≥ {least:g}x the static cache's at {context_label(n)}"
        if ours is None or static is None or static.decode_tok_s is None:
            lines.append(f"{label}: not measured.")
            continue
        speedup = ours.decode_tok_s / static.decode_tok_s
        verdict = "met" if speedup >= least else "missed"
        lines.append(
            f"{label}: {verdict} — {METHOD_LABELS[ours.method]} {ours.decode_tok_s:.1f} tokens/s, "
            f"static {static.decode_tok_s:.1f} ({speedup:.2f}x)."
        )
    ours = _compiled(result, contexts[-1])
    limit = None if ours is None else _bandwidth_limit(result, ours, peak)
    label = (
        f"- KVpop compiled ≥ {MIN_BANDWIDTH_FRACTION:.0%} of its bandwidth limit at "
        f"{context_label(contexts[-1])}"
    )
    if limit is None:
        lines.append(f"{label}: not measured.")
    else:
        share = ours.decode_tok_s / limit
        verdict = "met" if share >= MIN_BANDWIDTH_FRACTION else "missed"
        lines.append(
            f"{label}: {verdict} — {ours.decode_tok_s:.1f} of {limit:.0f} tokens/s ({share:.0%}; "
            f"weights {result.weights_bytes / GiB:.2f} GiB + cache {ours.kv_bytes / GiB:.2f} GiB "
            f"per step at {peak / 1e12:.2f} TB/s)."
        )
    return lines


def report(args, result: BenchResult) -> str:
    device = torch.device(args.device)
    gpu = result.device if args.device == "cuda" else "CPU (smoke test)"
    shape = MODELS[args.shape]
    return "\n\n".join(
        [
            "# Long context on a GPU",
            f"{gpu}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
            f"{transformers.__version__}, triton {_triton_version()}, Python "
            f"{platform.python_version()}.",
            f"The {args.shape} shape, {args.layers} layers: hidden {shape.hidden_size}, "
            f"{shape.num_attention_heads} query / {shape.num_key_value_heads} KV heads, "
            f"head_dim {shape.head_dim}, MLP {shape.intermediate_size}, vocabulary {shape.vocab} "
            f"({'tied' if shape.tie_word_embeddings else 'untied'} embeddings); random weights, "
            f"bf16, batch {args.batch} "
            f"({result.weights_bytes / GiB:.2f} GiB of weights). KVpop capacity "
            f"{CONFIG.capacity} ({CONFIG.sinks} sinks, window {CONFIG.window}, "
            f"`{CONFIG.scorer.value}` scorer), prompts in chunks of {CONFIG.chunk_length}. "
            f"Decode: median of {args.steps} steps after {args.warmup} warm-up steps.",
            bench_table(result),
            COLUMN_NOTES,
            *result.notes,
            "## Targets\n\n"
            + "\n".join(_targets(result) + _decode_targets(result, peak_bandwidth(device))),
        ]
    )


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return triton.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 131072])
    parser.add_argument(
        "--shape", choices=list(MODELS), default=SHAPE, help="tiny: a smoke test of the steps"
    )
    parser.add_argument("--layers", type=int, default=None, help="default: the shape's own")
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=4, help="untimed decode steps first")
    parser.add_argument("--batch", type=int, default=1, help="sequences, each its own cache")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test only"
    )
    args = parser.parse_args(argv)
    if args.layers is None:
        args.layers = MODELS[args.shape].layers
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA GPU (torch.cuda.is_available() is False)")
    for name in ("layers", "steps", "warmup", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.lengths) < 1:
        parser.error(f"--lengths must be positive, got {args.lengths}")
    result = run(args)
    text = report(args, result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(text + "\n"))
    data = json.dumps(bench_json(result), indent=1) + "\n"
    atomic_write(args.out.with_suffix(".json"), lambda tmp: Path(tmp).write_text(data))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

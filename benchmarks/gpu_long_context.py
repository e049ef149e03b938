"""Long context on a CUDA GPU: full attention against KVpop on the 36-layer Qwen3-4B shape.

    python benchmarks/gpu_long_context.py                  # N = 8k, 32k, 131k (an H200: minutes)
    python benchmarks/gpu_long_context.py --lengths 2048 --layers 2   # a quick check
    python benchmarks/gpu_long_context.py --device cpu --lengths 64 --layers 1 --out /tmp/x.md

For each prompt length N, with random weights in bf16 at batch 1: prefill seconds, decode
tokens per second and peak GPU memory (``torch.cuda.max_memory_allocated``) of

- full attention: transformers' dynamic cache with SDPA, the prompt in one forward with
  ``logits_to_keep=1`` (as ``generate()`` runs it), then eager decode steps;
- KVpop: ``kc.prefill`` (chunks of the capacity, last position's logits only), then eager
  decode steps and the ``kc.compile`` decode step.

Times come from CUDA events around synchronised regions; decode is the median of the timed
steps after warm-up steps (compilation happens in the warm-up). Writes
``benchmarks/results/gpu.md`` (or ``--out``) with the model shape, the stack's versions, every
figure and the targets, and prints it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import transformers  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from benchmarks.harness import SHAPES, context_label, qwen3_model, table  # noqa: E402
from kvpop_compile.atomic import atomic_write  # noqa: E402

GiB = 2**30
SHAPE, LAYERS, VOCAB = "qwen3-4b", 36, 151_936
CONFIG = kc.KVpopConfig(sinks=4, window=256, topk=3836, scorer="memory")
FULL, EAGER, COMPILED = "full attention", "KVpop eager", "KVpop kc.compile"
PEAK_ABOVE_WEIGHTS_GIB = 2.0  # target: KVpop's peak at the longest N, above the weights
MAX_PREFILL_RATIO = 1.5  # target: KVpop / full-attention prefill time at 32k and beyond
RESULTS = Path(__file__).resolve().parent / "results" / "gpu.md"


@dataclass
class Figures:
    prefill_s: float
    decode_tok_s: float
    peak_gib: float


def _seconds(fn) -> float:
    """Device seconds of ``fn()`` between two CUDA events (wall seconds on the CPU, where
    ``--device cpu`` runs this script as a smoke test)."""
    if not torch.cuda.is_available():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def _reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float:
    """Peak GPU memory since the last reset; NaN on the CPU (not measured there)."""
    return torch.cuda.max_memory_allocated() / GiB if device == "cuda" else float("nan")


def _decode_rate(step, warmup: int, steps: int) -> float:
    """Tokens per second: median seconds of ``steps`` calls of ``step()`` after ``warmup``."""
    for _ in range(warmup):
        step()
    return 1.0 / statistics.median(_seconds(step) for _ in range(steps))


def _full_attention(model, ids, args) -> Figures:
    cache = transformers.DynamicCache(config=model.config)
    _reset_peak(args.device)
    prefill = _seconds(lambda: model(input_ids=ids, past_key_values=cache, logits_to_keep=1))
    token = torch.zeros(1, 1, dtype=torch.long, device=ids.device)

    def step():
        model(input_ids=token, past_key_values=cache, use_cache=True)

    rate = _decode_rate(step, args.warmup, args.steps)
    return Figures(prefill, rate, _peak_gib(args.device))


def _kvpop(model, ids, args, compiled_step) -> tuple[Figures, Figures]:
    cache = kc.new_cache(model)
    _reset_peak(args.device)
    prefill = _seconds(lambda: kc.prefill(model, ids, cache))
    token = torch.zeros(1, 1, dtype=torch.long, device=ids.device)
    position = torch.full_like(token, ids.shape[1])

    def eager():
        kc.decode_one_token(model, token, position, cache)
        position.add_(1)

    def compiled():
        compiled_step(token, position, cache)
        position.add_(1)

    eager_rate = _decode_rate(eager, args.warmup, args.steps)
    peak = _peak_gib(args.device)
    compiled_rate = _decode_rate(compiled, args.warmup, args.steps)
    return Figures(prefill, eager_rate, peak), Figures(prefill, compiled_rate, peak)


def run(args) -> str:
    device = args.device
    max_positions = 2 * max(*args.lengths, CONFIG.capacity)
    build = dict(layers=args.layers, vocab=VOCAB, max_positions=max_positions,
                 dtype=torch.bfloat16, device=device)  # fmt: skip
    weights_gib = 0.0
    results: dict[tuple[str, int], Figures] = {}
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, VOCAB, (1, max(args.lengths)), generator=generator).to(device)
    with torch.no_grad():
        baseline = qwen3_model(SHAPE, **build)
        weights_gib = sum(p.numel() * p.element_size() for p in baseline.parameters()) / GiB
        for n in args.lengths:
            results[FULL, n] = _full_attention(baseline, prompt[:, :n], args)
            print(f"{FULL} at {context_label(n)}: {results[FULL, n]}", flush=True)
        del baseline
        if device == "cuda":
            torch.cuda.empty_cache()
        model = kc.transform(qwen3_model(SHAPE, **build), CONFIG)
        step = kc.compile(model)
        for n in args.lengths:
            results[EAGER, n], results[COMPILED, n] = _kvpop(model, prompt[:, :n], args, step)
            compiled = results[COMPILED, n].decode_tok_s
            print(
                f"KVpop at {context_label(n)}: {results[EAGER, n]}, compiled {compiled:.1f} tok/s"
            )
    return _report(args, results, weights_gib)


def _report(args, results, weights_gib: float) -> str:
    rows = [
        [
            context_label(n),
            *(f"{results[FULL, n].prefill_s:.2f}", f"{results[EAGER, n].prefill_s:.2f}"),
            f"{results[EAGER, n].prefill_s / results[FULL, n].prefill_s:.2f}x",
            f"{results[FULL, n].decode_tok_s:.1f}",
            f"{results[EAGER, n].decode_tok_s:.1f}",
            f"{results[COMPILED, n].decode_tok_s:.1f}",
            f"{results[FULL, n].peak_gib:.1f}",
            f"{results[EAGER, n].peak_gib:.1f}",
        ]
        for n in args.lengths
    ]
    header = ["N", "full prefill s", "KVpop prefill s", "KVpop / full", "full tok/s",
              "KVpop eager tok/s", "KVpop compiled tok/s", "full peak GiB",
              "KVpop peak GiB"]  # fmt: skip
    longest = max(args.lengths)
    kvpop_peaks = [results[EAGER, n].peak_gib for n in args.lengths]
    above = results[EAGER, longest].peak_gib - weights_gib
    slow = [
        results[EAGER, n].prefill_s / results[FULL, n].prefill_s for n in args.lengths if n >= 32768
    ]
    targets = [
        f"- KVpop peak at {context_label(longest)} ≤ weights + {PEAK_ABOVE_WEIGHTS_GIB:g} GiB: "
        f"{'met' if above <= PEAK_ABOVE_WEIGHTS_GIB else 'missed'} — {above:.2f} GiB above "
        f"{weights_gib:.2f} GiB of weights.",
        f"- KVpop peak flat over N: {min(kvpop_peaks):.2f}-{max(kvpop_peaks):.2f} GiB.",
    ]
    if slow:
        targets.append(
            f"- KVpop prefill ≤ {MAX_PREFILL_RATIO:g}x full attention's at 32k and beyond: "
            f"{'met' if max(slow) <= MAX_PREFILL_RATIO else 'missed'} — "
            + ", ".join(f"{r:.2f}x" for r in slow)
            + "."
        )
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (smoke test)"
    shape = SHAPES[SHAPE]
    return "\n\n".join(
        [
            "# Long context on a GPU",
            f"{gpu}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
            f"{transformers.__version__}, triton {_triton_version()}, Python "
            f"{platform.python_version()}.",
            f"Qwen3-4B shape, {args.layers} layers: hidden {shape['hidden_size']}, "
            f"{shape['num_attention_heads']} query / {shape['num_key_value_heads']} KV heads, "
            f"head_dim {shape['head_dim']}, MLP {shape['intermediate_size']}, vocabulary {VOCAB}; "
            f"random weights, bf16, batch 1 ({weights_gib:.2f} GiB of weights). KVpop capacity "
            f"{CONFIG.capacity} ({CONFIG.sinks} sinks, window {CONFIG.window}, "
            f"`{CONFIG.scorer.value}` scorer), prompts in chunks of {CONFIG.chunk_length}. "
            f"Decode: median of {args.steps} steps after {args.warmup} warm-up steps.",
            table(header, rows),
            "## Targets\n\n" + "\n".join(targets),
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
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=4, help="untimed decode steps first")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test only"
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA GPU (torch.cuda.is_available() is False)")
    for name in ("layers", "steps", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.lengths) < 1:
        parser.error(f"--lengths must be positive, got {args.lengths}")
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(report + "\n"))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

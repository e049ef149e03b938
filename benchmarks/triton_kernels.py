"""Triton kernel benchmark: achieved bandwidth and the cost of the policy next to attention.

On a CUDA GPU (the figures that matter), at Qwen3-4B/8B attention shapes (8 KV heads, 32 query
heads, head_dim 128, bf16; decode at batch 1, 8 and 32, each sequence its own bounded cache):

- bounded decode attention at capacity 2048-16384: time and achieved memory bandwidth as a
  fraction of the GPU's peak (from its memory clock and bus width);
- the decode step's policy at capacity 4096: the cache update (fused evict and new-token write,
  one Triton launch) and the memory scorer's update + score (one Triton launch, and the
  PyTorch ops it replaces), each as a fraction of one decode attention step;
- the running top-k kernels (eviction steps, boundary decisions);
- prefill attention under eviction steps vs full causal attention (the same kernel without
  steps, and torch's scaled_dot_product_attention);
- the transposed-attention target vs a flash-style forward of the same N.

    python benchmarks/triton_kernels.py           # CUDA; writes benchmarks/results/kernels_gpu.md
    TRITON_INTERPRET=1 python benchmarks/triton_kernels.py --quick   # tiny shapes on CPU

Times are medians (``triton.testing.do_bench`` on CUDA). Ratios are measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
FUSED_SCORER = "memory scorer update + score (one launch)"
# Targets: decode attention's share of peak bandwidth at the largest capacity, batch 1 and the
# largest batch; the policy's launches against one decode attention step (a whole decode step
# also runs the projections and the MLP, so this is the stricter measure).
BANDWIDTH_AT_BATCH_1 = 0.25
BANDWIDTH_AT_LARGEST_BATCH = 0.60
POLICY_SHARE = 0.05


@dataclass
class Shapes:
    kv_heads: int
    group: int
    head_dim: int
    capacities: list[int]
    policy_capacity: int
    lengths: list[int]
    dtype: torch.dtype
    batches: list[int]  # decode batch sizes, each sequence with its own bounded cache


FULL = Shapes(
    8, 4, 128, [2048, 4096, 8192, 16384], 4096, [4096, 8192, 16384], torch.bfloat16, [1, 8, 32]
)
QUICK = Shapes(2, 2, 16, [128], 128, [64], torch.float32, [1, 2])


def median_ms(fn, device: torch.device) -> float:
    """Median milliseconds of ``fn()`` after a warm-up."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def peak_bandwidth(device: torch.device) -> float | None:
    """Bytes/s the GPU's memory can move at most: double data rate x bus width x clock."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    return 2 * bus_bits / 8 * clock_khz * 1e3 if clock_khz and bus_bits else None


def bandwidth_share(moved_bytes: float, ms: float, peak: float) -> float:
    """The share of ``peak`` bytes/s achieved by moving ``moved_bytes`` in ``ms``."""
    return moved_bytes / (ms * 1e-3) / peak


def fraction(moved_bytes: float, ms: float, peak: float | None) -> str:
    return f"{bandwidth_share(moved_bytes, ms, peak):.0%}" if peak else "n/a"


def decode_row(shapes: Shapes, capacity: int, batch: int, device, peak):
    """Decode attention at one capacity and batch: the table row and the kernel's median ms."""
    from kvpop_compile.runtime.kernels import decode_attention
    from kvpop_compile.runtime.reference import decode_attention as reference

    h, g, d, dtype = shapes.kv_heads, shapes.group, shapes.head_dim, shapes.dtype
    q = torch.randn(batch, h * g, 1, d, device=device, dtype=dtype)
    keys = torch.randn(batch, h, capacity, d, device=device, dtype=dtype)
    values = torch.randn_like(keys)
    positions = torch.arange(capacity, device=device).expand(batch, h, capacity).contiguous()
    scale = d**-0.5
    moved = 2 * keys.numel() * keys.element_size() + positions.numel() * 8
    kernel = median_ms(lambda: decode_attention(q, keys, values, positions, scale, False), device)
    with_probs = median_ms(
        lambda: decode_attention(q, keys, values, positions, scale, True), device
    )
    plain = median_ms(lambda: reference(q, keys, values, positions, scale=scale), device)
    row = [f"decode attention C={capacity} batch {batch}", f"{kernel * 1e3:.1f}",
           fraction(moved, kernel, peak), f"with probs {with_probs * 1e3:.1f} us; "
           f"the PyTorch reference takes {plain / kernel:.1f}x as long"]  # fmt: skip
    return row, kernel, moved


def policy_rows(shapes: Shapes, batch: int, device, peak, attention_ms):
    """The policy's two launches at the policy capacity and ``batch``, against decode
    attention at the same capacity and batch."""
    from kvpop_compile import KVpopConfig
    from kvpop_compile.runtime import BoundedCacheState, build_scorer
    from kvpop_compile.runtime.kernels import memory_scorer_step, update_cache

    capacity, h, d = shapes.policy_capacity, shapes.kv_heads, shapes.head_dim
    window = min(256, capacity // 8)
    config = KVpopConfig(sinks=4, window=window, topk=capacity - 4 - window, scorer="memory")
    scorer = build_scorer(config, h, d).to(device)
    state = BoundedCacheState.empty(config, scorer, batch=batch, head_dim=d, dtype=shapes.dtype,
                                    device=device)  # fmt: skip
    state.keys.normal_()
    state.values.normal_()
    state.positions.copy_(torch.arange(capacity, device=device))
    state.priorities.normal_()
    state.seen.fill_(capacity)
    leaving = [torch.randn(batch, h, d, device=device, dtype=shapes.dtype) for _ in range(2)]
    leaving_position = torch.full((batch, h), capacity, device=device)
    leaving_statistic = torch.zeros(batch, h, device=device)
    priority = torch.randn(batch, h, device=device)
    token = [torch.randn(batch, h, 1, d, device=device, dtype=shapes.dtype) for _ in range(3)]
    tensors = (state.keys, state.values, state.positions, state.priorities, state.window_keys,
               state.statistic)  # fmt: skip

    def evict_and_write():
        update_cache(*tensors, *leaving, leaving_position, leaving_statistic, priority,
                     state.seen, *token, config.sinks, config.topk, config.window)  # fmt: skip

    new_key, new_value = token[1][:, :, 0], token[2][:, :, 0]
    weights = scorer.step_weights()

    def score_fused():
        return memory_scorer_step(state.scorer_state, new_key, new_value, *leaving, weights)

    def score_plain():
        new_state = scorer.update_state(state.scorer_state, new_key, new_value)
        return scorer.score(new_state, leaving[0], leaving[1], leaving_position)

    attention = attention_ms[capacity, batch]
    rows, spent = [], {}
    # Per (batch, head) program: the pool scan (priority, position), the leaving token's key
    # and value read and written into the pool, the new token's key, raw key and value read
    # and written; the launch covers every program.
    moved = batch * h * (config.topk * (4 + 8) + (2 + 3) * 2 * d * shapes.dtype.itemsize)
    update = "evict + write (one launch)"
    with torch.no_grad():
        for name, fn in (
            (update, evict_and_write),
            (FUSED_SCORER, score_fused),
            ("memory scorer update + score (PyTorch ops)", score_plain),
        ):
            ms = median_ms(fn, device)
            rows.append([f"{name} C={capacity} batch {batch}", f"{ms * 1e3:.1f}",
                         fraction(moved, ms, peak) if name == update else "",
                         f"{ms / attention:.1%} of a decode attention step"])  # fmt: skip
            spent[name] = ms
    # What a decode step spends on the policy: the cache update and the fused scorer step.
    return rows, spent[update] + spent[FUSED_SCORER]


def targets(shapes: Shapes, peak, attention_ms, moved, policy_ms) -> list[str]:
    """The kernel targets, each met or missed with its figure (unmeasured without a peak)."""
    capacity, lines = max(shapes.capacities), []
    for batch, least in (
        (1, BANDWIDTH_AT_BATCH_1),
        (max(shapes.batches), BANDWIDTH_AT_LARGEST_BATCH),
    ):
        label = f"- decode attention ≥ {least:.0%} of peak bandwidth at C={capacity}, batch {batch}"
        if peak is None:
            lines.append(f"{label}: not measured (no GPU peak bandwidth).")
            continue
        share = bandwidth_share(moved[capacity, batch], attention_ms[capacity, batch], peak)
        lines.append(f"{label}: {'met' if share >= least else 'missed'} — {share:.0%}.")
    for batch, ms in policy_ms.items():
        share = ms / attention_ms[shapes.policy_capacity, batch]
        verdict = "met" if share <= POLICY_SHARE else "missed"
        lines.append(
            f"- evict + write + scorer ≤ {POLICY_SHARE:.0%} of a decode attention step at "
            f"C={shapes.policy_capacity}, batch {batch}: {verdict} — {share:.1%} "
            f"({ms * 1e3:.1f} us)."
        )
    return lines


def prefill_rows(shapes: Shapes, n: int, device) -> list[list[str]]:
    """Running top-k, prefill attention and the target at sequence length ``n``."""
    import torch.nn.functional as F

    from kvpop_compile.runtime.kernels import (
        eviction_steps,
        future_attention_target,
        masked_attention,
        running_topk_boundary,
    )

    h, g, d, dtype = shapes.kv_heads, shapes.group, shapes.head_dim, shapes.dtype
    q = torch.randn(1, h * g, n, d, device=device, dtype=dtype)
    k = torch.randn(1, h, n, d, device=device, dtype=dtype)
    v = torch.randn(1, h, n, d, device=device, dtype=dtype)
    priority = torch.randn(1, h, n, device=device)
    sinks, window, topk = 4, 64, max(1, n // 8)
    scale = d**-0.5
    steps_ms = median_ms(lambda: eviction_steps(priority, sinks, window, topk), device)
    boundary_ms = median_ms(lambda: running_topk_boundary(priority, sinks, window, topk), device)
    steps = eviction_steps(priority, sinks, window, topk)
    full = median_ms(lambda: masked_attention(q, k, v, None, scale), device)
    bounded = median_ms(lambda: masked_attention(q, k, v, steps, scale), device)
    sdpa = median_ms(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), device
    )
    _, lse = masked_attention(q, k, v, None, scale)
    target = median_ms(lambda: future_attention_target(q, k, lse, window, scale), device)
    return [
        [f"eviction steps N={n} (K={topk})", f"{steps_ms * 1e3:.1f}", "",
         f"{steps_ms / full:.2f}x a causal flash forward"],
        [f"boundary decisions N={n}", f"{boundary_ms * 1e3:.1f}", "",
         f"{boundary_ms / full:.2f}x a causal flash forward (includes the eviction steps)"],
        [f"prefill attention N={n}, capacity {sinks + window + topk}", f"{bounded * 1e3:.1f}",
         "", f"{bounded / full:.2f}x the same kernel causal; causal is {full / sdpa:.2f}x SDPA"],
        [f"transposed target N={n}", f"{target * 1e3:.1f}", "",
         f"{target / full:.2f}x a flash-style forward; {target / sdpa:.2f}x SDPA"],
    ]  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes: checks it runs")
    parser.add_argument("--out", type=Path, default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    if not cuda and not args.quick:
        print("benchmarks/triton_kernels.py needs a CUDA GPU (or --quick with "
              "TRITON_INTERPRET=1)", file=sys.stderr)  # fmt: skip
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    shapes = QUICK if args.quick else FULL
    torch.manual_seed(0)
    peak = peak_bandwidth(device)
    rows, attention_ms, moved, policy_ms = [], {}, {}, {}
    for batch in shapes.batches:
        for capacity in shapes.capacities:
            row, attention_ms[capacity, batch], moved[capacity, batch] = decode_row(
                shapes, capacity, batch, device, peak
            )
            rows.append(row)
    for batch in shapes.batches:
        batch_rows, policy_ms[batch] = policy_rows(shapes, batch, device, peak, attention_ms)
        rows += batch_rows
    for n in shapes.lengths:
        rows += prefill_rows(shapes, n, device)
    name = torch.cuda.get_device_name(device) if cuda else "CPU (Triton interpreter)"
    lines = [
        f"# Triton kernels on {name}",
        "",
        f"{shapes.kv_heads} KV heads x {shapes.group} query heads each, head_dim "
        f"{shapes.head_dim}, {str(shapes.dtype).removeprefix('torch.')}; decode at batch "
        f"{', '.join(map(str, shapes.batches))} (prefill at batch 1). Peak memory "
        f"bandwidth: {peak / 1e12:.2f} TB/s."
        if peak
        else "Peak bandwidth: n/a.",
        "",
        "| kernel | median us | of peak bandwidth | notes |",
        "|---|---:|---:|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        "## Targets",
        "",
        *targets(shapes, peak, attention_ms, moved, policy_ms),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or (None if args.quick else RESULTS / "kernels_gpu.md")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

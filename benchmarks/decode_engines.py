"""Decode-step latency: eager vs torch.compile vs the AOTInductor engine, on CPU.

Per-token latency of the KVpop decode step of a transformed model, each path measured in the
same run (median of several timed runs after a warm-up), reported as ratios to eager. Models:
a tiny Qwen3 and one with Qwen3-0.6B layer shapes (hidden 1024, 16 query / 8 KV heads,
head_dim 128; two layers, random weights, a small vocabulary so the LM head does not dominate).

    python benchmarks/decode_engines.py [--quick]

Writes a markdown table to benchmarks/results/decode_engines.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from benchmarks.harness import SHAPES as LAYER_SHAPES  # noqa: E402

SHAPES = {"tiny": LAYER_SHAPES["tiny"], "qwen3-0.6b layers": LAYER_SHAPES["qwen3-0.6b"]}
RESULTS = Path(__file__).parent / "results"


def build(shape: dict, config: kc.KVpopConfig):
    torch.manual_seed(0)
    hf = Qwen3Config(vocab_size=512, num_hidden_layers=2, max_position_embeddings=8192, **shape)
    return kc.transform(Qwen3ForCausalLM(hf).eval(), config)


def time_decode(step, prompt_length: int, steps: int, repeats: int) -> list[float]:
    """Seconds per token of ``step(token) -> logits`` over ``steps`` tokens, ``repeats`` times."""
    samples = []
    token = torch.zeros(1, 1, dtype=torch.int64)
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step(token)
        samples.append((time.perf_counter() - start) / steps)
    return samples


def measure(name: str, shape: dict, steps: int, repeats: int) -> list[str]:
    config = kc.KVpopConfig(sinks=4, window=32, topk=220)  # capacity 256
    model = build(shape, config)
    prompt = torch.zeros(1, 300, dtype=torch.int64)  # past capacity: the policy is evicting
    paths = {}

    eager_cache = kc.new_cache(model)
    kc.prefill(model, prompt, eager_cache)
    position = torch.tensor([[prompt.shape[1]]])
    with torch.no_grad():
        paths["eager"] = lambda t: kc.decode_one_token(model, t, position, eager_cache)

        compiled = kc.compile(model)
        compiled_cache = kc.new_cache(model)
        kc.prefill(model, prompt, compiled_cache)
        paths["torch.compile"] = lambda t: compiled(t, position, compiled_cache)

        with tempfile.TemporaryDirectory() as folder:
            runner = kc.load(kc.export(model, Path(folder) / "engine", "aoti"))
        runner.prefill(prompt)
        paths["AOTInductor engine"] = runner.decode

    results = {}
    with torch.inference_mode():
        for label, step in paths.items():
            time_decode(step, prompt.shape[1], 5, 1)  # warm-up (and compilation)
            results[label] = time_decode(step, prompt.shape[1], steps, repeats)
    eager = statistics.median(results["eager"])
    rows = []
    for label, samples in results.items():
        median = statistics.median(samples)
        spread = (max(samples) - min(samples)) * 1e3
        rows.append(
            f"| {name} | {label} | {median * 1e3:.2f} ± {spread / 2:.2f} | {eager / median:.2f}x |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps (CI)")
    args = parser.parse_args()
    shapes = {"tiny": SHAPES["tiny"]} if args.quick else SHAPES
    steps, repeats = (10, 2) if args.quick else (50, 5)
    lines = [
        f"Decode step, batch 1, capacity 256, after a 300-token prompt; median of {repeats} runs "
        f"of {steps} steps (± half the range).",
        "",
        "| model | path | ms / token | speed vs eager |",
        "|---|---|---|---|",
    ]
    for name, shape in shapes.items():
        lines += measure(name, shape, steps, repeats)
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "decode_engines.md").write_text(text)


if __name__ == "__main__":
    main()

"""Score kvpress presses under the prompt-compression protocol (runs in kvpress's own venv).

kvpress pins an older transformers than kvpop_compile, so this script imports only torch,
transformers, kvpress and the standard library; :mod:`benchmarks.kvpress_eval` runs it in a
separate virtual environment and summarises what it writes.

Usage: ``python kvpress_worker.py JOB.json RESULT.json``. The job is
``{"model": folder, "sequences": [[ids]...], "prompt_length": P, "budgets": {name: kept},
"presses": [name, ...]}``. For each sequence the first ``P`` tokens are prefilled with the
press active (kvpress compresses the cache during prefill, keeping ``kept`` tokens per layer
and head), then the remaining inputs ``ids[P:-1]`` are fed at their true positions with that
cache and no press, and the targets ``ids[P+1:]`` are scored: whether the argmax is right and
the negative log-likelihood (nats, float32). The result is ``{"versions": {...}, "results":
{press: {budget: {"correct": [[0/1...]...], "nll": [[float...]...]} | {"error": message}}}}``.
The press ``none`` runs once, without compression, under the budget ``0%``.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import kvpress
import torch
import transformers
from kvpress.utils import compute_n_kept
from transformers import DynamicCache, Qwen3ForCausalLM

NO_PRESS = "none"
FULL_BUDGET = "0%"  # budget name of the uncompressed run
SINKS = 4  # attention sinks kept by StreamingLLM (and left out of ExpectedAttention's scores)

PRESSES = {
    "snapkv": lambda ratio: kvpress.SnapKVPress(compression_ratio=ratio),
    "expected_attention": lambda ratio: kvpress.ExpectedAttentionPress(
        compression_ratio=ratio, n_sink=SINKS
    ),
    "tova": lambda ratio: kvpress.TOVAPress(compression_ratio=ratio),
    "knorm": lambda ratio: kvpress.KnormPress(compression_ratio=ratio),
    "streaming_llm": lambda ratio: kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=SINKS),
}


def compression_ratio(prompt_length: int, kept: int) -> float:
    """The ratio for which kvpress keeps exactly ``kept`` of ``prompt_length`` tokens.

    kvpress keeps ``int(length * (1 - ratio))`` tokens, and ``1 - kept / length`` can round so
    that this truncates to ``kept - 1`` (1536 tokens and 512 kept give 511); aiming half a
    token above ``kept`` lands inside the right integer whatever the rounding.
    """
    if not 1 <= kept <= prompt_length:
        raise ValueError(f"kept must be in 1..{prompt_length}, got {kept}")
    ratio = 1 - kept / prompt_length
    if compute_n_kept(prompt_length, ratio) != kept:
        ratio = 1 - (kept + 0.5) / prompt_length
    if compute_n_kept(prompt_length, ratio) != kept:
        raise RuntimeError(f"no compression ratio keeps exactly {kept} of {prompt_length} tokens")
    return ratio


def load_model(folder: str) -> Qwen3ForCausalLM:
    """The float32 checkpoint in ``folder`` with PyTorch SDPA attention, in eval mode.

    The checkpoint is saved by transformers 5 (``rope_parameters``, ``dtype``), which the
    transformers that kvpress pins (5.2) reads as it is; the RoPE check guards against a
    version that would silently fall back to its default theta.
    """
    model = Qwen3ForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa"
    )
    saved = json.loads((Path(folder) / "config.json").read_text()).get("rope_parameters", {})
    loaded = getattr(model.config, "rope_parameters", None) or {}
    if "rope_theta" in saved and loaded.get("rope_theta") != saved["rope_theta"]:
        raise RuntimeError(
            f"loaded RoPE parameters {loaded} differ from the checkpoint's {saved}; this "
            f"transformers ({transformers.__version__}) cannot read the config"
        )
    return model.eval()


@torch.no_grad()
def score_sequence(model, ids: torch.Tensor, prompt_length: int, press, kept: int) -> tuple:
    """Correct (list of 0/1) and NLL (list of float) at each target ``ids[prompt_length+1:]``."""
    context = ids[None, :prompt_length]  # (1, P)
    inputs = ids[None, prompt_length:-1]  # (1, S)
    targets = ids[prompt_length + 1 :]  # (S,)
    cache = DynamicCache()
    if press is None:
        model.model(input_ids=context, past_key_values=cache)
    else:
        with press(model):
            model.model(input_ids=context, past_key_values=cache)
    lengths = {cache.get_seq_length(layer) for layer in range(len(cache))}
    if lengths != {kept}:
        raise RuntimeError(f"cache holds {sorted(lengths)} tokens after prefill, expected {kept}")
    positions = torch.arange(prompt_length, ids.numel() - 1)[None]  # (1, S)
    logits = model(input_ids=inputs, past_key_values=cache, position_ids=positions).logits[0]
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (S, vocab)
    nll = -log_probs.gather(1, targets[:, None])[:, 0]
    correct = logits.argmax(dim=-1) == targets
    return correct.int().tolist(), nll.tolist()


def run_press(model, sequences, prompt_length: int, name: str, kept: int) -> dict:
    """Scores of one press at one budget over all sequences, or ``{"error": message}``."""
    try:
        press = None
        if name != NO_PRESS:
            if name not in PRESSES:
                raise ValueError(f"unknown press {name!r}; known: {', '.join(PRESSES)}")
            press = PRESSES[name](compression_ratio(prompt_length, kept))
        correct, nll = [], []
        for ids in sequences:
            c, n = score_sequence(model, ids, prompt_length, press, kept)
            correct.append(c)
            nll.append(n)
        return {"correct": correct, "nll": nll}
    except Exception as error:  # a failing press is part of the measurement, not a crash
        message = f"{type(error).__name__}: {error}".splitlines()[0]
        return {"error": message}


def main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    prompt_length = int(job["prompt_length"])
    sequences = [torch.tensor(s, dtype=torch.long) for s in job["sequences"]]
    if any(s.numel() <= prompt_length + 1 for s in sequences):
        raise ValueError(
            f"every sequence must be longer than prompt_length + 1 = {prompt_length + 1}"
        )
    transformers.logging.disable_progress_bar()
    model = load_model(job["model"])
    results: dict[str, dict] = {}
    for name in job["presses"]:
        budgets = {FULL_BUDGET: prompt_length} if name == NO_PRESS else job["budgets"]
        results[name] = {}
        for budget, kept in budgets.items():
            start = time.perf_counter()
            outcome = run_press(model, sequences, prompt_length, name, int(kept))
            results[name][budget] = outcome
            status = outcome.get("error", "ok")
            seconds = time.perf_counter() - start
            print(f"{name:>20} {budget:>4}: {status} ({seconds:.1f} s)", flush=True)
    versions = {
        "kvpress": version("kvpress"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    Path(result_path).write_text(json.dumps({"versions": versions, "results": results}))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: kvpress_worker.py JOB.json RESULT.json")
    main(sys.argv[1], sys.argv[2])

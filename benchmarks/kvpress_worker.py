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

A job with ``"mode": "recall"`` asks recall items instead (see :func:`run_recall_job`): ``{"mode":
"recall", "model": folder, "presses": [...], "budgets": [name...], "protocols": [...], "batch":
B, "decode_interval": I, "groups": [{"name": "families/task@length#part", "prompts":
[[ids]...], "answers": [[ids]...], "kept": {budget: kept}, "cut": C, "stretch": S}...]}`` (the
items of a group share one shape: prompt and answer length, question start); the result holds each
item's greedy answer tokens, ``{press: {budget: {protocol: {group: [[ids]...]} | {"error":
message}}}}``, and the driver judges them.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
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
    check_kept(cache, kept)
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


RECALL_PROTOCOLS = ("prefill", "decode")


def recall_press(name: str, context_length: int, kept: int, protocol: str, interval: int):
    """The press ``name`` for one recall protocol, or None for ``none`` (full attention).

    ``prefill``: the press compresses the ``context_length`` prefilled tokens to ``kept``.
    ``decode``: the same press at prefill, then kvpress's ``DecodingPress`` compresses the cache
    back to ``kept`` tokens every ``interval`` forwards while tokens are generated and fed.
    """
    if name == NO_PRESS:
        return None
    if name not in PRESSES:
        raise ValueError(f"unknown press {name!r}; known: {', '.join(PRESSES)}")
    prefill = PRESSES[name](compression_ratio(context_length, kept))
    if protocol == "prefill":
        return prefill
    if protocol != "decode":
        raise ValueError(f"protocol must be one of {', '.join(RECALL_PROTOCOLS)}; got {protocol!r}")
    # The decoding press sets its scorer's ratio itself at each compression; 0 leaves it unset.
    decoding = kvpress.DecodingPress(
        base_press=PRESSES[name](0.0), compression_interval=interval, target_size=kept,
        hidden_states_buffer_size=interval,
    )  # fmt: skip
    return kvpress.PrefillDecodingPress(prefilling_press=prefill, decoding_press=decoding)


def feed(model, ids: torch.Tensor, cache, start: int) -> torch.Tensor:
    """Feed ``ids (B, T)`` at positions ``start .. start + T - 1``; next-token logits ``(B, V)``.

    The positions are explicit: after compression the cache holds fewer tokens than were fed,
    so the length transformers would infer from it is not the tokens' position.
    """
    positions = torch.arange(start, start + ids.shape[1]).expand(ids.shape[0], -1)
    out = model(input_ids=ids, past_key_values=cache, position_ids=positions, logits_to_keep=1)
    return out.logits[:, -1]


def greedy(model, logits: torch.Tensor, cache, start: int, steps: int) -> torch.Tensor:
    """``steps`` greedy tokens ``(B, steps)`` from ``logits``, the first at position ``start``;
    every token but the last is fed back (as
    :func:`kvpop_compile.evaluation.recall.protocol.greedy_tokens` does)."""
    tokens = []
    for step in range(steps):
        token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens.append(token)
        if step < steps - 1:
            logits = feed(model, token, cache, start + step)
    return torch.cat(tokens, dim=1)


def check_kept(cache, expected: int) -> None:
    """Raise unless every layer of ``cache`` holds ``expected`` tokens."""
    lengths = sorted({cache.get_seq_length(layer) for layer in range(len(cache))})
    if lengths != [expected]:
        raise RuntimeError(f"cache holds {lengths} tokens after prefill, expected {expected}")


@torch.no_grad()
def answer_prefill(model, prompts: torch.Tensor, answer_length: int, press, kept: int):
    """Greedy answers ``(B, answer_length)`` to ``prompts (B, P)`` under the prefill protocol.

    The press compresses the first ``P - 1`` tokens to ``kept``; the last prompt token is then
    fed with no press, so the first answer token, like the others, is chosen from the
    compressed cache (kvpress's prefill logits come from full attention over the prompt).
    """
    cache = DynamicCache()
    context = prompts[:, :-1]  # (B, P - 1)
    with press(model) if press is not None else nullcontext():
        model.model(input_ids=context, past_key_values=cache)
    check_kept(cache, context.shape[1] if press is None else kept)
    logits = feed(model, prompts[:, -1:], cache, context.shape[1])
    return greedy(model, logits, cache, prompts.shape[1], answer_length)


@torch.no_grad()
def answer_decode(model, prompts, answer_length: int, press, kept: int, cut: int, stretch: int):
    """Greedy answers ``(B, answer_length)`` under the decode protocol, the press active
    throughout: ``prompts[:, :cut]`` prefilled (compressed to ``kept``), ``stretch`` tokens
    generated and fed, then the question ``prompts[:, cut:]`` and the answer, one token per
    forward (positions as :func:`kvpop_compile.evaluation.recall.protocol.greedy_answers` gives
    them)."""
    cache = DynamicCache()
    length = prompts.shape[1]
    with press(model) if press is not None else nullcontext():
        logits = feed(model, prompts[:, :cut], cache, 0)
        check_kept(cache, cut if press is None else kept)
        if stretch:
            generated = greedy(model, logits, cache, cut, stretch)
            feed(model, generated[:, -1:], cache, cut + stretch - 1)
        for index in range(cut, length):
            logits = feed(model, prompts[:, index : index + 1], cache, stretch + index)
        return greedy(model, logits, cache, stretch + length, answer_length)


def answer_group(model, group: dict, name: str, budget: str, protocol: str, job: dict) -> list:
    """Greedy answer tokens (one list per item) of one group of items, in batches."""
    prompts = torch.tensor(group["prompts"], dtype=torch.long)  # (N, P)
    answer_length = len(group["answers"][0])
    kept = prompts.shape[1] if name == NO_PRESS else int(group["kept"][budget])
    context = prompts.shape[1] - 1 if protocol == "prefill" else int(group["cut"])
    press = recall_press(name, context, kept, protocol, int(job["decode_interval"]))
    answers = []
    for start in range(0, prompts.shape[0], int(job["batch"])):
        batch = prompts[start : start + int(job["batch"])]
        if protocol == "prefill":
            tokens = answer_prefill(model, batch, answer_length, press, kept)
        else:
            tokens = answer_decode(
                model, batch, answer_length, press, kept, int(group["cut"]), int(group["stretch"])
            )
        answers += tokens.tolist()
    return answers


def run_recall_press(model, job: dict, name: str, budget: str, protocol: str) -> dict:
    """``{group: [[answer ids]...]}`` of one press, budget and protocol, or ``{"error":
    message}``; groups without a stretch are left out of the decode protocol."""
    try:
        results = {}
        for group in job["groups"]:
            if protocol == "decode" and not group["stretch"]:
                continue  # no room for a stretch: the project does not run it either
            start = time.perf_counter()
            results[group["name"]] = answer_group(model, group, name, budget, protocol, job)
            seconds = time.perf_counter() - start
            where = f"{name:>20} {budget:>4} {protocol:>7} {group['name']}"
            print(f"{where}: {seconds:.1f} s", flush=True)
        return results
    except Exception as error:  # a failing press is part of the measurement, not a crash
        return {"error": f"{type(error).__name__}: {error}".splitlines()[0]}


def run_recall_job(model, job: dict) -> dict:
    """Every press, budget and protocol of a recall job: ``{press: {budget: {protocol: ...}}}``
    (see :func:`run_recall_press`); ``none`` runs once, under the budget ``0%``."""
    results: dict[str, dict] = {}
    for name in job["presses"]:
        budgets = [FULL_BUDGET] if name == NO_PRESS else job["budgets"]
        results[name] = {budget: {} for budget in budgets}
        for budget in budgets:
            for protocol in job["protocols"]:
                outcome = run_recall_press(model, job, name, budget, protocol)
                results[name][budget][protocol] = outcome
                if "error" in outcome:
                    print(f"{name:>20} {budget:>4} {protocol:>7}: {outcome['error']}", flush=True)
    return results


def main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    transformers.logging.disable_progress_bar()
    if job.get("mode") == "recall":
        results = run_recall_job(load_model(job["model"]), job)
    else:
        results = run_sequences_job(job)
    versions = {
        "kvpress": version("kvpress"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    Path(result_path).write_text(json.dumps({"versions": versions, "results": results}))


def run_sequences_job(job: dict) -> dict:
    """Every press and budget of a prompt-compression job: ``{press: {budget: scores}}``."""
    prompt_length = int(job["prompt_length"])
    sequences = [torch.tensor(s, dtype=torch.long) for s in job["sequences"]]
    if any(s.numel() <= prompt_length + 1 for s in sequences):
        raise ValueError(
            f"every sequence must be longer than prompt_length + 1 = {prompt_length + 1}"
        )
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
    return results


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: kvpress_worker.py JOB.json RESULT.json")
    main(sys.argv[1], sys.argv[2])
